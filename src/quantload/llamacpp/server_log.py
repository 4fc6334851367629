"""Reading llama-server's startup log (stderr at `-lv 4`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_KV_SIZE = re.compile(
    r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/(\d+) seqs\),"
    r" K \((\w+)\):\s*([\d.]+) MiB, V \((\w+)\):\s*([\d.]+) MiB"
)
_BUILD = re.compile(r"\bbuild:? (\d+ \([^)]*\)(?: with [^\n]*)?)")
_SLOTS = re.compile(r"n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(\w+)'")
_BUFFER = re.compile(r"(\w+):\s+(\S+?)\s+(model|output|KV|compute) buffer size =\s*([\d.]+) MiB")
_FLASH_ATTN_ASKED = re.compile(r"llama_context: flash_attn\s*=\s*(\w+)")
_FLASH_ATTN_AUTO = re.compile(r"resolve_fused_ops: Flash Attention (enabled|not supported)")


@dataclass(frozen=True)
class KvSizeLine:
    """One `llama_kv_cache: size = ...` line."""

    total_mib: float
    cells: int
    layers: int
    seqs: int
    streams_seqs: int
    type_k: str
    k_mib: float
    type_v: str
    v_mib: float


@dataclass(frozen=True)
class SlotLayout:
    """The server's own statement of its slots."""

    n_slots: int
    n_ctx_slot: int
    kv_unified: bool


@dataclass(frozen=True)
class BufferLine:
    """One `<device> <kind> buffer size = N MiB` line: what the server allocated, by kind."""

    device: str  # CPU, CPU_Mapped, CUDA0, ...
    kind: str  # model, output, KV, compute
    mib: float


def parse_buffers(log_text: str) -> list[BufferLine]:
    """Every buffer the server's log reports (weights, output, KV cache, compute graph)."""
    return [BufferLine(m[2], m[3], float(m[4])) for m in _BUFFER.finditer(log_text)]


def parse_kv_sizes(log_text: str) -> list[KvSizeLine]:
    """Every KV size line in the log (SWA models print more than one)."""
    return [
        KvSizeLine(
            total_mib=float(m[1]),
            cells=int(m[2]),
            layers=int(m[3]),
            seqs=int(m[4]),
            streams_seqs=int(m[5]),
            type_k=m[6],
            k_mib=float(m[7]),
            type_v=m[8],
            v_mib=float(m[9]),
        )
        for m in _KV_SIZE.finditer(log_text)
    ]


def parse_slot_layout(log_text: str) -> SlotLayout | None:
    """The `n_slots = ..., n_ctx_slot = ..., kv_unified = ...` line, if printed."""
    match = _SLOTS.search(log_text)
    if match is None:
        return None
    return SlotLayout(int(match[1]), int(match[2]), match[3] == "true")


def parse_build(log_text: str) -> str | None:
    """The llama.cpp build a server log names, e.g. '0 (unknown) with GNU 12.2.0 for Linux x86_64'."""
    found = _BUILD.search(log_text)
    return found.group(1).strip() if found else None


def parse_flash_attention(log_text: str) -> str | None:
    """Whether the context runs with flash attention: "enabled" or "disabled", as -fa asked or as
    llama.cpp resolved `auto` (its resolve_fused_ops line); None when the log does not say."""
    asked = _FLASH_ATTN_ASKED.search(log_text)
    if asked is None:
        return None
    if asked[1] != "auto":
        return asked[1]
    resolved = _FLASH_ATTN_AUTO.search(log_text)
    if resolved is None:
        return None
    return "enabled" if resolved[1] == "enabled" else "disabled"
