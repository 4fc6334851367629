"""KV cache: the size predicted from GGUF metadata against the one llama-server reported."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class KvRow:
    """One quantization's KV check; `error` says why it was not measured."""

    quant: str
    predicted_mib: float | None
    reported_mib: float | None
    diff_pct: float | None
    slots: int | None
    ctx_per_slot: int | None
    cache_types: str | None
    formula: str | None
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def kv_rows(kv: dict[str, Any], quants: Sequence[str]) -> list[KvRow]:
    """A row per quantization in kv.json, in the run's order."""
    rows = []
    for quant in [q for q in quants if q in kv] + [q for q in kv if q not in quants]:
        entry = kv[quant]
        error = entry.get("error")
        reported = _number(entry.get("reported_mib"))
        if error is None and reported is None:
            error = "llama-server did not report a KV size"
        types = (
            f"K {entry['cache_type_k']}, V {entry['cache_type_v']}"
            if "cache_type_k" in entry and "cache_type_v" in entry
            else None
        )
        rows.append(
            KvRow(
                quant=quant,
                predicted_mib=_number(entry.get("predicted_mib")),
                reported_mib=reported,
                diff_pct=_number(entry.get("diff_pct")),
                slots=_int(entry.get("slots")),
                ctx_per_slot=_int(entry.get("ctx_per_slot")),
                cache_types=types,
                formula=entry.get("formula") if isinstance(entry.get("formula"), str) else None,
                error=str(error) if error is not None else None,
            )
        )
    return rows
