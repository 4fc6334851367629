"""Comparing the predicted KV-cache size with the one llama-server reports in its log."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantload.errors import MeasurementError, QuantloadError, ServerError
from quantload.kvcache import KvPrediction, kv_shape_from_gguf, predict_kv
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.server_log import (
    BufferLine,
    KvSizeLine,
    parse_buffers,
    parse_build,
    parse_flash_attention,
    parse_kv_sizes,
    parse_slot_layout,
)
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.gguf_meta import read_gguf
from quantload.rundir import write_json_atomic
from quantload.rundir.kv_file import KvFile, KvResult, load_kv_file


@dataclass(frozen=True)
class KvCheck:
    """Predicted against reported, in MiB as llama.cpp prints it (two decimals)."""

    prediction: KvPrediction
    reported: tuple[KvSizeLine, ...]
    n_ctx_slot: int | None
    log_path: Path | None
    server_build: str | None = None  # the llama.cpp build the server's log names
    buffers: tuple[BufferLine, ...] = ()  # everything the server allocated, as its log says
    flash_attn: str | None = None  # "enabled" or "disabled", as the server log says

    def buffer_mib(self, kind: str) -> float | None:
        """The MiB of one kind of buffer (model, output, KV, compute) over every device."""
        found = [line.mib for line in self.buffers if line.kind == kind]
        return round(sum(found), 2) if found else None

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
        """The prediction's factors plus what the server reported (see `merge_kv_file`)."""
        return {
            **self.prediction.as_dict(),
            "reported_mib": self.reported_mib,
            "reported_lines": [line.__dict__ for line in self.reported],
            "reported_n_ctx_slot": self.n_ctx_slot,
            "diff_pct": self.diff_pct,
            "server_log": str(self.log_path) if self.log_path else None,
            "server_build": self.server_build,
            "flash_attn": self.flash_attn,
            "buffers": [line.__dict__ for line in self.buffers],
        }


def unchecked_dict(prediction: KvPrediction) -> dict[str, Any]:
    """`KvCheck.as_dict`'s shape for a prediction no server was asked about (reported fields null)."""
    return KvCheck(prediction, reported=(), n_ctx_slot=None, log_path=None).as_dict()


def kv_check_from_log(prediction: KvPrediction, log_text: str, log_path: Path | None) -> KvCheck:
    """Read the reported size from a server log; MeasurementError when the line is absent."""
    lines = parse_kv_sizes(log_text)
    if not lines:
        raise MeasurementError(
            "llama-server did not print 'llama_kv_cache: size = ...'",
            "it prints it only at verbosity 4: start it with -lv 4",
        )
    layout = parse_slot_layout(log_text)
    return KvCheck(
        prediction, tuple(lines), layout.n_ctx_slot if layout else None, log_path, parse_build(log_text),
        tuple(parse_buffers(log_text)), parse_flash_attention(log_text),
    )  # fmt: skip


def kv_check_with_server(
    toolchain: Toolchain, spec: ServerSpec, prediction: KvPrediction, log_path: Path, timeout_s: float
) -> KvCheck:
    """Start llama-server with the prediction's layout, read its KV line, stop it, compare.

    The server is stopped as soon as it has printed the KV line and its slot layout, before it
    finishes warming up: the allocation is what is being checked, not serving.
    """
    if log_path.exists():
        log_path.unlink()
    server = LlamaServer(toolchain, spec, log_path, startup_timeout_s=timeout_s).launch_only()
    try:
        printed = server.wait_for_output("n_ctx_slot", timeout_s)
        text = server.log_text()
    finally:
        server.stop()
    if not printed and not parse_kv_sizes(text):
        tail = " | ".join(line.strip()[-160:] for line in text.strip().splitlines()[-2:])
        raise ServerError(
            f"llama-server for {spec.model_path.name} stopped before reporting its KV cache: {tail}",
            f"full log in {log_path}",
        )
    return kv_check_from_log(prediction, text, log_path)



def kv_prediction(spec: ServerSpec) -> KvPrediction:
    """The KV-cache size the spec's layout allocates, from the model's GGUF metadata."""
    return predict_kv(
        kv_shape_from_gguf(read_gguf(spec.model_path)),
        spec.slots,
        spec.ctx_per_slot,
        spec.cache_type_k,
        spec.cache_type_v,
        spec.kv_unified,
    )


def check_kv(
    server: LlamaServer, label: str, out: Path | None = None, llama_cpp: dict[str, object] | None = None
) -> KvCheck:
    """The serve step's KV check: the prediction against the size the running server logged (it
    runs with -lv 4).

    With `out`, the outcome (or why there is none) is filed in that kv.json under `label`.
    """
    try:
        check = kv_check_from_log(kv_prediction(server.spec), server.log_text(), server.log_path)
    except QuantloadError as error:
        if out is not None:
            merge_kv_file(out, label, error.one_line(), llama_cpp)
        raise
    if out is not None:
        merge_kv_file(out, label, check, llama_cpp)
    return check


def _result(check: KvCheck | str) -> KvResult:
    if isinstance(check, KvCheck):
        return KvResult.model_validate(check.as_dict())
    return KvResult(error=check)


def merge_kv_file(
    path: Path, label: str, check: KvCheck | str, llama_cpp: Mapping[str, object] | None = None
) -> None:
    """Add (or replace) one entry of a `kv.json` file (`quantload.rundir.kv_file.KvFile`),
    creating it when absent or replacing one that is not a kv.json: the file's one writer.

    Each entry is a check (every factor of the prediction, the reported size, `diff_pct`, the
    server's log and build) or {"error": why} for a quantization that could not be checked.
    `llama_cpp` is the toolchain's version record when quantload started the server; a later
    entry without one keeps the record already there.
    """
    current = KvFile()
    if path.is_file():
        try:
            current = load_kv_file(path)
        except ValueError:
            current = KvFile()
    record = dict(llama_cpp) if llama_cpp is not None else current.llama_cpp
    merged = current.model_copy(
        update={"llama_cpp": record, "results": {**current.results, label: _result(check)}}
    )
    write_json_atomic(path, merged.to_json())


def merge_kv_cache_type(path: Path, label: str, cache_type: str, check: KvCheck | str) -> None:
    """Add (or replace) the check of `label`'s server with `cache_type` K and V caches (the
    kv_types experiment) under `cache_types` of a kv.json, which keeps everything else."""
    current = KvFile()
    if path.is_file():
        try:
            current = load_kv_file(path)
        except ValueError:
            current = KvFile()
    per_type = {**current.cache_types.get(label, {}), cache_type: _result(check)}
    merged = current.model_copy(update={"cache_types": {**current.cache_types, label: per_type}})
    write_json_atomic(path, merged.to_json())
