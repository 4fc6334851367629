"""The exporter's parsers on answers captured from a real llama-server (see captured/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

from quantload.exporter.labels import discover
from quantload.exporter.server_metrics import RENAMES, parse_server_metrics
from quantload.exporter.slots import cells_from_log, cells_from_slots, parse_slots

CAPTURED = Path(__file__).parent / "captured"


def _read(name: str) -> str:
    return (CAPTURED / name).read_text(encoding="utf-8")


def test_real_metrics_are_all_known() -> None:
    samples = {s.name: s for s in parse_server_metrics(_read("metrics_busy.txt"))}
    known = {name for name, _ in RENAMES.values()}
    assert known <= set(samples)
    # Only the speculative-decoding counters are passed through under generic names.
    assert all(name.startswith("llamacpp_spec_decode_") for name in set(samples) - known)
    assert samples["llamacpp_requests_processing"].value == 1


def test_real_slots_hold_prompt_plus_generated_tokens() -> None:
    busy = parse_slots(json.loads(_read("slots_busy.json")))
    working = [s for s in busy if s.busy]
    # 24 prompt tokens (23 reused from the slot's cache) + 5 generated so far.
    assert [(s.slot_id, s.tokens) for s in working] == [(3, 29)]
    idle = parse_slots(json.loads(_read("slots_idle.json")))
    # After the request: 24 prompt + 15 decoded (the 16th was sampled, never decoded) = 39,
    # the same as /metrics' n_tokens_max; the idle slot keeps them in the KV cache.
    assert [s.tokens for s in idle] == [0, 0, 0, 39]
    assert cells_from_slots(idle) == 4 * 512


def test_real_log_and_props() -> None:
    assert cells_from_log(_read("server_log_excerpt.txt")) == 4 * 512
    found = discover(json.loads(_read("props.json")))
    assert (found.quant, found.model) == ("Q4_K_M", "tiny-qwen2")
