"""`kv.json` (schema `quantload.kv/1`): the KV-cache size predicted from GGUF metadata against the one
llama-server reported, per quantization, as one typed model.

quantload.kvcheck writes it (`kv_file_payload`, `merge_kv_file`) and the report reads it. A result
holds every factor of the prediction, what the server reported and their difference; a
quantization that could not be checked holds only `error`. `diff_pct` is
(predicted - reported) / reported x 100, both at the 0.01 MiB llama.cpp prints. `llama_cpp` is the
toolchain's version record when quantload started the servers, else null.

`cache_types` holds the checks of the kv_types experiment's servers: {quantization: {KV-cache type
(K and V): result}}, for the cache types the quantization's own server (in `results`) does not
serve. `flash_attn` is whether a server's context ran with flash attention, from its log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from quantload.rundir import read_json

KV_SCHEMA: Final = "quantload.kv/1"


class _KvPart(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class KvReportedLine(_KvPart):
    """One `llama_kv_cache: size = ...` line of the server's log."""

    total_mib: float
    cells: int
    layers: int
    seqs: int
    streams_seqs: int
    type_k: str
    k_mib: float
    type_v: str
    v_mib: float


class KvBuffer(_KvPart):
    """One `<device> <kind> buffer size = N MiB` line: model, output, KV or compute."""

    device: str
    kind: str
    mib: float


class KvResult(_KvPart):
    """One quantization's check; fields are in the order they are written, all absent for an error."""

    n_layer: int | None = None
    n_head_kv: list[int] | None = None
    head_dim_k: int | None = None
    head_dim_v: int | None = None
    slots: int | None = None
    ctx_per_slot: int | None = None
    unified: bool | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    type_size_k: str | None = None
    type_size_v: str | None = None
    n_ctx: int | None = None
    n_stream: int | None = None
    cells_per_stream: int | None = None
    k_bytes: int | None = None
    v_bytes: int | None = None
    predicted_bytes: int | None = None
    predicted_mib: float | None = None
    shape_source: str | None = None
    formula: str | None = None
    reported_mib: float | None = None
    reported_lines: list[KvReportedLine] | None = None
    reported_n_ctx_slot: int | None = None
    diff_pct: float | None = None
    server_log: str | None = None
    server_build: str | None = None
    flash_attn: str | None = Field(
        default=None, description='"enabled" or "disabled" as the server log says; null if it does not'
    )
    buffers: list[KvBuffer] | None = Field(
        default=None, description="every buffer the server allocated (weights, output, KV, compute)"
    )
    error: str | None = Field(default=None, description="why this quantization was not checked")


class KvFile(_KvPart):
    """The whole kv.json: results keyed by quantization name."""

    schema_: Literal["quantload.kv/1"] = Field(default=KV_SCHEMA, alias="schema")
    llama_cpp: dict[str, Any] | None = None
    results: dict[str, KvResult] = Field(default_factory=dict)
    cache_types: dict[str, dict[str, KvResult]] = Field(
        default_factory=dict, description="{quant: {KV-cache type: result}} of the kv_types servers"
    )

    def to_json(self) -> dict[str, Any]:
        """The JSON object as written: a result carries only the fields it was given."""
        data = self.model_dump(mode="json", by_alias=True, exclude={"results", "cache_types"})
        data["results"] = {
            quant: result.model_dump(mode="json", exclude_unset=True)
            for quant, result in self.results.items()
        }
        if self.cache_types:
            data["cache_types"] = {
                quant: {kind: item.model_dump(mode="json", exclude_unset=True) for kind, item in per.items()}
                for quant, per in self.cache_types.items()
            }
        return data


def load_kv_file(path: Path) -> KvFile:
    """Read a kv.json; ValueError (pydantic's ValidationError included) when it is not one."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return KvFile.model_validate(data)
