"""Every option's default in its help: an option whose value comes from the configuration
(default None on the command line, so a file or the environment can set it) shows the built-in
default of its setting, "[default: 600 (tune.budget_s)]"; options whose help already says its
default are left as written."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Where an option's value goes in the configuration, by command path and parameter name. An option
# whose help names its setting "(section.key)" needs no line here.
SETTING_OF: Mapping[tuple[str, ...], Mapping[str, str]] = {
    ("run",): {
        "model": "model.source", "profile": "run.profile", "out": "run.out",
        "servers_at_once": "run.servers_at_once", "exclusive": "load.exclusive",
        "slo_ttft": "slo.ttft_s", "slo_ttft_percentile": "slo.ttft_percentile", "slo_tpot": "slo.tpot_s",
        "slo_tpot_percentile": "slo.tpot_percentile", "confidence": "slo.confidence",
    },
    ("tune",): {
        "model": "model.source", "quants": "prepare.quants", "profile": "run.profile", "out": "run.out",
        "slo_ttft": "slo.ttft_s", "slo_ttft_percentile": "slo.ttft_percentile", "slo_tpot": "slo.tpot_s",
        "slo_tpot_percentile": "slo.tpot_percentile", "confidence": "slo.confidence",
    },
    ("load",): {
        "workload": "workload.kind", "input_lengths": "workload.input_lengths",
        "output_lengths": "workload.output_lengths", "speed": "trace.speed", "turns": "sessions.turns",
        "sessions": "sessions.count", "think_time": "sessions.think_time_s", "affinity": "sessions.affinity",
        "batch_sizes": "mixed.batch_sizes", "time_cap": "limit.time_cap_s", "max_users": "limit.max_users",
        "duration": "soak.duration_s", "users": "load.users", "repeats": "load.repeats",
        "rates": "load.rates_rps", "prompts": "load.prompts", "prompt_count": "load.prompt_count",
        "max_tokens": "load.max_tokens", "ignore_eos": "load.ignore_eos", "cache_prompt": "load.cache_prompt",
        "metrics_port": "load.metrics_port", "request_timeout": "load.request_timeout_s",
        "first_byte_timeout": "load.first_byte_timeout_s",
        "exclusive": "load.exclusive", "experiment": "load.experiments",
        "slo_ttft": "slo.ttft_s", "slo_ttft_percentile": "slo.ttft_percentile", "slo_tpot": "slo.tpot_s",
        "slo_tpot_percentile": "slo.tpot_percentile", "confidence": "slo.confidence",
    },
    ("load-worker",): {"metrics_port": "load.metrics_port"},
    ("prepare",): {
        "model": "model.source", "quants": "prepare.quants", "imatrix": "prepare.imatrix",
    },
    ("kv",): {
        "slots": "server.slots", "ctx_per_slot": "server.ctx_per_slot", "cache_type_k": "server.cache_type_k",
        "cache_type_v": "server.cache_type_v", "unified": "server.kv_unified",
    },
    ("calibrate",): {"streams": "calibrate.streams", "seconds": "calibrate.seconds_per_count"},
    ("report",): {
        "slo_ttft": "slo.ttft_s", "slo_ttft_percentile": "slo.ttft_percentile", "slo_tpot": "slo.tpot_s",
        "slo_tpot_percentile": "slo.tpot_percentile", "confidence": "slo.confidence",
        "target_rps": "plan.target_rps", "target_users": "plan.target_users",
        "price_per_hour": "plan.price_per_hour", "currency": "plan.currency",
        "memory_budget_gib": "plan.memory_budget_gib",
    },
}  # fmt: skip

# Options with no default at all: the help says what leaving them out means.
NOTHING_WHEN_LEFT_OUT = "[default: none]"

_NAMED_SETTING = re.compile(r"\(([a-z_]+\.[a-z_0-9]+)\)")
_SAYS_DEFAULT = re.compile(r"default|\[[^\]]+\]", re.IGNORECASE)


def default_text(key: str) -> str:
    """The built-in default of a dotted setting as the help shows it ("none" when it has none)."""
    from quantload.config import Settings  # the settings' models: only when a command's help is shown

    section, name = key.split(".", 1)
    model = Settings.model_fields[section].annotation
    fields = getattr(model, "model_fields", {})
    if name not in fields:
        raise ValueError(f"no setting {key}")
    value = fields[name].get_default(call_default_factory=True)
    return _shown(value)


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (tuple, list)):
        return ", ".join(_shown(item) for item in value) or "none"
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "get_secret_value"):
        return "***"
    return str(value)


def show_defaults(command: Any, path: tuple[str, ...]) -> None:
    """Append its setting's built-in default to the help of each option of `command` (and its
    subcommands) that takes its value from the configuration and does not say its default yet."""
    for name, sub in getattr(command, "commands", {}).items():
        show_defaults(sub, (*path, name))
    keys = SETTING_OF.get(path, {})
    for param in getattr(command, "params", ()):
        if getattr(param, "param_type_name", "") != "option" or param.default is not None:
            continue
        help_text = param.help or ""
        if _SAYS_DEFAULT.search(help_text):
            continue
        named = _NAMED_SETTING.search(help_text)
        key = keys.get(param.name or "") or (named.group(1) if named else None)
        shown = f"[default: {default_text(key)} ({key})]" if key else NOTHING_WHEN_LEFT_OUT
        param.help = f"{help_text} {shown}".strip()
