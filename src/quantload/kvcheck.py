"""Comparing the predicted KV-cache size with the one llama-server reports in its log."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantload.errors import MeasurementError
from quantload.kvcache import KvPrediction
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.server_log import KvSizeLine, parse_kv_sizes, parse_slot_layout
from quantload.llamacpp.toolchain import Toolchain


@dataclass(frozen=True)
class KvCheck:
    """Predicted against reported, in MiB as llama.cpp prints it (two decimals)."""

    prediction: KvPrediction
    reported: tuple[KvSizeLine, ...]
    n_ctx_slot: int | None
    log_path: Path | None

    @property
    def predicted_mib(self) -> float:
        return round(self.prediction.total_mib, 2)

    @property
    def reported_mib(self) -> float | None:
        return round(sum(line.total_mib for line in self.reported), 2) if self.reported else None

    @property
    def diff_pct(self) -> float | None:
        reported = self.reported_mib
        if not reported:
            return None
        return round((self.predicted_mib - reported) / reported * 100.0, 4)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.prediction.as_dict(),
            "reported_mib": self.reported_mib,
            "reported_lines": [line.__dict__ for line in self.reported],
            "reported_n_ctx_slot": self.n_ctx_slot,
            "diff_pct": self.diff_pct,
            "server_log": str(self.log_path) if self.log_path else None,
        }


def kv_check_from_log(prediction: KvPrediction, log_text: str, log_path: Path | None) -> KvCheck:
    """Read the reported size from a server log; MeasurementError when the line is absent."""
    lines = parse_kv_sizes(log_text)
    if not lines:
        raise MeasurementError(
            "llama-server did not print 'llama_kv_cache: size = ...'",
            "it prints it only at verbosity 4: start it with -lv 4",
        )
    layout = parse_slot_layout(log_text)
    return KvCheck(prediction, tuple(lines), layout.n_ctx_slot if layout else None, log_path)


def kv_check_with_server(
    toolchain: Toolchain, spec: ServerSpec, prediction: KvPrediction, log_path: Path, timeout_s: float
) -> KvCheck:
    """Start llama-server with the prediction's layout, read its KV line, stop it, compare."""
    if log_path.exists():
        log_path.unlink()
    with LlamaServer(toolchain, spec, log_path, startup_timeout_s=timeout_s) as server:
        text = server.log_text()
    return kv_check_from_log(prediction, text, log_path)
