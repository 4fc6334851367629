"""The report's mixture-of-experts section: which size decode follows, from the roofline, and the
bytes a step of each sweep level reads."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pandas as pd

from quantload.analysis.document import Paragraph, Table
from quantload.analysis.moe_section import moe_section

MOE = {
    "expert_count": 8, "expert_used_count": 2, "total_params": 90_000_000, "active_params": 45_000_000,
    "expert_params": 60_000_000, "expert_bytes": 60_000_000, "other_bytes": 30_000_000,
}  # fmt: skip


def _analysis(measured_tok_s: float, moe: dict[str, Any] | None = MOE) -> Any:
    entry = SimpleNamespace(moe=moe)
    # a token reads 30 MB of the rest and 2/8 of the 60 MB of experts: 45 MB
    roofline = SimpleNamespace(
        bandwidth_bytes_per_s=9e9, decode=SimpleNamespace(bytes_per_token=45e6, measured_tokens_per_s=measured_tok_s)
    )
    levels = pd.DataFrame([{"quant": "Q4_K_M", "users": 1, "output_tok_s": 150.0},
                           {"quant": "Q4_K_M", "users": 4, "output_tok_s": 300.0}])  # fmt: skip
    return SimpleNamespace(
        quants=("Q4_K_M",),
        levels=levels,
        run=SimpleNamespace(
            manifest=SimpleNamespace(files={"Q4_K_M": entry}),
            speed=SimpleNamespace(results={"Q4_K_M": SimpleNamespace(roofline=roofline)}),
        ),
    )


def test_a_decode_faster_than_reading_every_expert_allows_follows_the_active_size() -> None:
    section = moe_section(_analysis(measured_tok_s=150.0))  # every expert: 90 MB, 100 tok/s at most
    assert section is not None
    decode, said, batching = section.blocks
    assert isinstance(decode, Table) and decode.rows[0][4:] == ("45.0", "90.0", "150.0", "200.0", "100.0")
    assert isinstance(said, Paragraph) and "so it follows the active size" in said.text
    assert isinstance(batching, Table)
    one, four = batching.rows
    assert one[1:4] == ("1", "25 %", "45.0") and four[1:3] == ("4", "68 %")
    assert float(four[3]) > 45.0  # four users' tokens read more experts than one's


def test_a_decode_below_both_ceilings_is_left_to_the_dense_comparison() -> None:
    section = moe_section(_analysis(measured_tok_s=60.0))
    assert section is not None
    said = section.blocks[1]
    assert isinstance(said, Paragraph) and "the roofline alone cannot tell" in said.text


def test_a_run_without_a_mixture_of_experts_has_no_section() -> None:
    assert moe_section(_analysis(150.0, moe=None)) is None
