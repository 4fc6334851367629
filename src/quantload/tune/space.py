"""The declared space of server flags `quantload tune` searches (`[tune]`), as configurations.

A configuration is one value of each dimension: slots (`-np`, each with the same context per
slot), the `-b/-ub` pair, the KV-cache type (K and V alike, flash attention on where a quantized
V cache needs it unless the configuration says otherwise), flash attention, threads, batching
(continuous or `-nocb`), speculation (none, the n-gram type of `[speculation]`, or its draft
model), where `tune.gpu_layers` lists values, the layers on the GPU (`-ngl`), and a mixture of
experts' expert placement (quantload.llamacpp.placement). The grid is every combination in the
declared order, less those llama.cpp cannot run (a quantized V cache with flash attention off);
`check_space` says what is wrong with a space before any server starts: a KV-cache or speculation
type this build lacks, a draft that is missing or of another vocabulary, an expert placement where
the server sees no device besides the CPU, a space with nothing left to run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from quantload.config import Settings
from quantload.errors import ConfigError
from quantload.experiments.base import ServerFlags
from quantload.experiments.speculation.stages import check_draft, draft_args, ngram_args
from quantload.llamacpp.devices import Device
from quantload.llamacpp.kld import needs_flash_attention
from quantload.llamacpp.offload import GpuLayers
from quantload.llamacpp.placement import check_placement, placement_args
from quantload.llamacpp.server_help import ServerBuild


@dataclass(frozen=True)
class TuneConfig:
    """One configuration of the space."""

    slots: int
    ctx_per_slot: int
    batch: str  # "B/UB"
    cache_type: str
    flash_attn: str  # auto, on, off
    threads: int  # 0 = llama.cpp's default
    batching: str  # continuous, static
    speculation: str  # none, ngram, draft
    gpu_layers: str = ""  # -ngl: auto, all or a number; "" = server.gpu_layers
    placement: str = "none"  # quantload.llamacpp.placement

    @property
    def key(self) -> str:
        """A short stable name, e.g. "np8 b2048/512 kv-f16 fa-auto t0 cb spec-none" (and
        " ngl-all" where the space varies the GPU layers, " moe-n-cpu-moe:2" where the experts are
        placed)."""
        batching = "cb" if self.batching == "continuous" else "nocb"
        layers = f" ngl-{self.gpu_layers}" if self.gpu_layers else ""
        placed = f" moe-{self.placement}" if placement_args(self.placement) else ""
        return (
            f"np{self.slots} b{self.batch} kv-{self.cache_type} fa-{self.flash_attn} t{self.threads}"
            f" {batching} spec-{self.speculation}{layers}{placed}"
        )

    def args(self, settings: Settings) -> tuple[str, ...]:
        """The llama-server flags this configuration adds to the server's own (slots and the cache
        type are set apart: `server_flags`)."""
        logical, _, physical = self.batch.partition("/")
        args: list[str] = ["-b", logical, "-ub", physical, "-fa", self.flash_attn]
        if self.threads:
            args += ["-t", str(self.threads)]
        args.append("-cb" if self.batching == "continuous" else "-nocb")
        if self.speculation == "ngram":
            args += ngram_args(settings)
        elif self.speculation == "draft":
            assert settings.speculation.draft_model is not None
            args += draft_args(settings.speculation.draft_model, settings)
        else:
            args += ["--spec-type", "none"]
        return (*args, *placement_args(self.placement))

    def server_flags(self, settings: Settings, label: str) -> ServerFlags:
        """The variant of the server this configuration is."""
        return ServerFlags(
            slots=self.slots,
            ctx_per_slot=self.ctx_per_slot,
            cache_type=self.cache_type,
            extra_args=self.args(settings),
            label=label,
            gpu_layers=_layers(self.gpu_layers),
        )

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _layers(text: str) -> GpuLayers | None:
    if not text:
        return None
    return int(text) if text.isdigit() else cast(GpuLayers, text)


def runnable(config: TuneConfig) -> bool:
    """Whether llama.cpp can run it: a quantized V cache needs flash attention."""
    return not (needs_flash_attention(config.cache_type) and config.flash_attn == "off")


def configurations(settings: Settings) -> list[TuneConfig]:
    """Every runnable configuration of the space, in the declared order."""
    tune = settings.tune
    ctx = tune.ctx_per_slot or settings.server.ctx_per_slot
    grid = itertools.product(
        tune.slots,
        tune.batch_sizes,
        tune.cache_types,
        tune.flash_attn,
        tune.threads,
        tune.batching,
        tune.speculation,
        [str(layers) for layers in tune.gpu_layers] or [""],
        tune.expert_placement,
    )
    made = (TuneConfig(s, ctx, b, c, f, t, bt, sp, ngl, pl) for s, b, c, f, t, bt, sp, ngl, pl in grid)
    return [config for config in made if runnable(config)]


def model_identity(source: str, path: Path, sha256: str | None = None) -> str:
    """The model file a tune measures, as its state records it: the model's source, the file's name
    and its content hash (the manifest's), or its size where no hash is known."""
    if sha256:
        return f"{source} {path.name} sha256:{sha256[:16]}"
    try:
        size = path.stat().st_size
    except OSError:
        size = -1
    return f"{source} {path.name} {size} bytes"


def _draft_size(settings: Settings) -> int | None:
    draft = settings.speculation.draft_model
    try:
        return draft.stat().st_size if draft is not None else None
    except OSError:
        return None


def space_key(settings: Settings, model: str = "") -> str:
    """A hash of everything that decides what a trial measures: the model file (`model_identity`)
    and the draft's size, the space, the limit search, the workload, the SLO and the load's request
    settings. A resumed tune must have the same."""
    dumped: dict[str, Any] = settings.model_dump(mode="json")
    chosen: dict[str, Any] = {
        name: dumped[name] for name in ("limit", "workload", "slo", "report", "speculation", "server")
    }
    chosen["model"] = model
    chosen["draft_size"] = _draft_size(settings)
    chosen["load"] = {
        k: v for k, v in dumped["load"].items() if k not in ("experiments", "metrics_port", "workers")
    }
    tune = dumped["tune"]  # more time may be given; predict_first off keeps the keys tunes had before it
    chosen["tune"] = {k: v for k, v in tune.items() if k != "budget_s" and (k, v) != ("predict_first", False)}
    text = json.dumps(chosen, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_space(
    settings: Settings,
    build: ServerBuild,
    models: Mapping[str, Path] | None = None,
    devices: tuple[Device, ...] | None = None,
) -> list[TuneConfig]:
    """The space's configurations; ConfigError (one line) for what this build or these models
    cannot run, a budget shorter than one trial, or a space with nothing left. `devices` are those
    the server sees besides the CPU (None: not asked, when the space places no experts)."""
    tune = settings.tune
    check_placement([("tune.expert_placement", p) for p in tune.expert_placement], devices or ())
    searched = [p for p in tune.expert_placement if placement_args(p)]
    if searched and placement_args(settings.server.expert_placement):
        raise ConfigError(
            f"tune.expert_placement searches {searched[0]} while server.expert_placement ="
            f" {settings.server.expert_placement!r} is added to every configuration",
            "set server.expert_placement to none when the tune searches placements",
        )
    lacking = [kind for kind in tune.cache_types if build.cache_types and kind not in build.cache_types]
    if lacking:
        raise ConfigError(
            f"tune.cache_types names {lacking[0]}, a KV-cache type this llama-server build lacks",
            f"it has {', '.join(build.cache_types)}",
        )
    if "draft" in tune.speculation and settings.speculation.draft_model is None:
        raise ConfigError(
            "tune.speculation names draft but no draft model is given",
            "set speculation.draft_model to a GGUF of the same model, or leave draft out",
        )
    if {"ngram", "draft"} & set(tune.speculation):
        check_draft(settings, build.spec_types, dict(models or {}) if "draft" in tune.speculation else {})
    if tune.budget_s < tune.short_trial_s:
        raise ConfigError(
            f"tune.budget_s ({tune.budget_s:g} s) is shorter than one trial (tune.short_trial_s ="
            f" {tune.short_trial_s:g} s)",
            "raise tune.budget_s or lower tune.short_trial_s",
        )
    found = configurations(settings)
    if not found:
        raise ConfigError(
            "every configuration of the tune space pairs a quantized V cache with flash attention off",
            "add auto or on to tune.flash_attn, or f16 to tune.cache_types",
        )
    return found
