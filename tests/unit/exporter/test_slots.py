"""Slot usage from /slots and allocated KV cells from the log."""

from __future__ import annotations

import pytest

from fake_llama_server import slots_payload
from quantload.exporter.server_metrics import ServerDataError
from quantload.exporter.slots import cells_from_log, cells_from_slots, parse_slots

KV_LINE = (
    "0.01.422.440 I llama_kv_cache: size =   32.00 MiB (  4096 cells,   2 layers,  8/8 seqs),"
    " K (f16):   16.00 MiB, V (f16):   16.00 MiB\n"
)


def test_parse_slots_reads_busy_and_tokens_held() -> None:
    slots = parse_slots(slots_payload(n_slots=4, busy=2, tokens=120))
    assert [s.busy for s in slots] == [True, True, False, False]
    assert [s.tokens for s in slots] == [120, 120, 60, 0]
    assert cells_from_slots(slots) == 4 * 4096


@pytest.mark.parametrize(
    "payload",
    [
        {"slots": []},
        [1, 2],
        [{"id": 0, "n_ctx": 10}],
        [{"id": "0", "n_ctx": 1, "is_processing": True}],
    ],
)
def test_parse_slots_rejects_other_shapes(payload: object) -> None:
    with pytest.raises(ServerDataError):
        parse_slots(payload)


def test_cells_from_kv_line_count_every_stream() -> None:
    assert cells_from_log("noise\n" + KV_LINE) == 4096 * 8


def test_cells_from_swa_lines_take_the_largest_cache() -> None:
    swa = KV_LINE.replace("4096 cells", " 768 cells")
    assert cells_from_log(swa + KV_LINE) == 4096 * 8


def test_cells_from_slot_layout_line_when_kv_line_missing() -> None:
    split = "srv  load_model: initializing, n_slots = 8, n_ctx_slot = 4096, kv_unified = 'false'\n"
    unified = "srv  load_model: initializing, n_slots = 4, n_ctx_slot = 8192, kv_unified = 'true'\n"
    assert cells_from_log(split) == 8 * 4096
    assert cells_from_log(unified) == 8192
    assert cells_from_log("nothing here") is None
