"""Slot usage and KV-cache occupancy from llama-server's `/slots`.

llama-server no longer exports a KV metric. Each `/slots` entry's `n_prompt_tokens` is the length
of the token sequence the slot keeps in the KV cache (llama-server's `slot.prompt.tokens`: the
prompt, cached or processed, plus every token generated so far; it drops to 0 when the slot's
cache is cleared). One token occupies one KV cell, so the sum over slots is the cells in use. An
idle slot keeps its last sequence for prefix reuse, so its cells stay in use until reused.

The cells the server allocated come, in this order, from:
  1. the target's configuration (`kv_cells`);
  2. the server's `-lv 4` log: `llama_kv_cache: size = ... (N cells, L layers, s/S seqs)` holds
     N cells per stream and S streams, so N*S cells (SWA models print several lines: the largest
     cache counts), else the `n_slots = .., n_ctx_slot = .., kv_unified = ..` line;
  3. `/slots` itself: the sum of every slot's `n_ctx`, which is right for a non-unified cache
     (one stream per slot) and overstates a unified one (every slot reports the whole pool).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from quantload.exporter.server_metrics import ServerDataError
from quantload.llamacpp.server_log import parse_kv_sizes, parse_slot_layout

KvSource = Literal["config", "log", "slots", "none"]


@dataclass(frozen=True)
class SlotState:
    """One slot as `/slots` shows it."""

    slot_id: int
    n_ctx: int
    busy: bool
    tokens: int


@dataclass(frozen=True)
class KvCapacity:
    """How many KV cells the server allocated, and where that number came from."""

    cells: int
    source: KvSource


def _int(entry: dict[str, Any], key: str, default: int | None = None) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ServerDataError(f"/slots entry has no whole-number {key!r}")
    return value


def parse_slots(payload: Any) -> list[SlotState]:
    """The slots in a decoded `/slots` answer; ServerDataError when it is not that shape."""
    if not isinstance(payload, list):
        raise ServerDataError("/slots did not answer a JSON list")
    slots: list[SlotState] = []
    for entry in payload:
        if not isinstance(entry, dict) or not isinstance(entry.get("is_processing"), bool):
            raise ServerDataError("/slots entry lacks 'is_processing'")
        slots.append(
            SlotState(
                slot_id=_int(entry, "id"),
                n_ctx=_int(entry, "n_ctx"),
                busy=entry["is_processing"],
                tokens=max(0, _int(entry, "n_prompt_tokens", 0)),
            )
        )
    return slots


def cells_from_log(log_text: str) -> int | None:
    """Allocated KV cells stated in a llama-server `-lv 4` log, or None when not printed yet."""
    sizes = parse_kv_sizes(log_text)
    if sizes:
        return max(line.cells * max(line.streams_seqs, 1) for line in sizes)
    layout = parse_slot_layout(log_text)
    if layout is None:
        return None
    return layout.n_ctx_slot if layout.kv_unified else layout.n_slots * layout.n_ctx_slot


def cells_from_slots(slots: Sequence[SlotState]) -> int:
    """Allocated KV cells assuming one stream per slot (not unified)."""
    return sum(slot.n_ctx for slot in slots)
