"""The options of `quantload load` as one object, and the settings keys they set."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantload.cli.slo_options import slo_flags
from quantload.errors import ConfigError
from quantload.experiments.soak import duration_text_s


def numbers(text: str | None, kind: type[int] | type[float]) -> list[Any] | None:
    """A comma list of numbers (`1,2,4`) as a list; None when not given."""
    if text is None:
        return None
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"not a comma list of numbers: {text!r}", "e.g. 1,2,4,8") from None


@dataclass(frozen=True)
class LoadFlags:
    """Every option of `quantload load` as given on the command line (None: not given)."""

    url: list[str]
    out: Path
    name: list[str] | None = None
    quant: list[str] | None = None
    model: str = ""
    experiment: list[str] | None = None
    workload: str | None = None
    input_lengths: str | None = None
    output_lengths: str | None = None
    dataset: str | None = None
    trace: str | None = None
    speed: float | None = None
    turns: int | None = None
    sessions: int | None = None
    think_time: float | None = None
    affinity: str | None = None
    batch_sizes: str | None = None
    time_cap: float | None = None
    max_users: int | None = None
    duration: str | None = None
    users: str | None = None
    repeats: int | None = None
    rates: str | None = None
    prompts: str | None = None
    prompt_count: int | None = None
    max_tokens: int | None = None
    ignore_eos: bool | None = None
    cache_prompt: bool | None = None
    workers: str | None = None
    remote_workers: int | None = None
    master_host: str | None = None
    master_port: int | None = None
    workers_timeout: float | None = None
    metrics_host: str | None = None
    metrics_port: int | None = None
    request_timeout: float | None = None
    first_byte_timeout: float | None = None
    api_key_env: str | None = None
    run_id: str | None = None
    exclusive: bool | None = None
    slo_ttft: float | None = None
    slo_ttft_percentile: str | None = None
    slo_tpot: float | None = None
    slo_tpot_percentile: str | None = None
    confidence: float | None = None
    as_json: bool = False

    def settings(self) -> dict[str, Any]:
        """The settings keys these flags set (None: left to the configuration's other layers)."""
        return {
            **self._load_settings(),
            "workload.kind": self.workload,
            "workload.input_lengths": self.input_lengths,
            "workload.output_lengths": self.output_lengths,
            "workload.dataset": self.dataset,
            "trace.path": self.trace,
            "trace.speed": self.speed,
            "sessions.turns": self.turns,
            "sessions.count": self.sessions,
            "sessions.think_time_s": self.think_time,
            "sessions.affinity": self.affinity,
            "mixed.batch_sizes": self.batch_sizes.split(",") if self.batch_sizes else None,
            "limit.time_cap_s": self.time_cap,
            "limit.max_users": self.max_users,
            "load.exclusive": self.exclusive,
            "soak.duration_s": duration_text_s(self.duration) if self.duration is not None else None,
            **slo_flags(
                self.slo_ttft,
                self.slo_ttft_percentile,
                self.slo_tpot,
                self.slo_tpot_percentile,
                self.confidence,
            ),
        }

    def _load_settings(self) -> dict[str, Any]:
        return {
            "load.users": numbers(self.users, int),
            "load.repeats": self.repeats,
            "load.rates_rps": numbers(self.rates, float),
            "load.prompts": self.prompts,
            "load.prompt_count": self.prompt_count,
            "load.max_tokens": self.max_tokens,
            "load.ignore_eos": self.ignore_eos,
            "load.cache_prompt": self.cache_prompt,
            "load.workers": self.workers,
            "load.remote_workers": self.remote_workers,
            "load.master_host": self.master_host,
            "load.master_port": self.master_port,
            "load.workers_timeout_s": self.workers_timeout,
            "load.metrics_host": self.metrics_host,
            "load.metrics_port": self.metrics_port,
            "load.request_timeout_s": self.request_timeout,
            "load.first_byte_timeout_s": self.first_byte_timeout,
        }
