"""The MoE-against-dense comparison's arithmetic: where the MoE sits between its twins, the bytes a
step reads as users grow, and what the report says."""

from __future__ import annotations

import pytest

from quantload.analysis.moe_cost import Comparison, ModelCost, follows, follows_words, markdown_table

MB = 1_000_000


def _model(role: str, token_mb: float, decode: dict[int, float], bench: float, experts: bool = False) -> ModelCost:
    return ModelCost(
        label=role, role=role, file_bytes=100 * MB, total_params=50 * MB, active_params=20 * MB,
        token_bytes=token_mb * MB, expert_bytes=80 * MB if experts else 0, experts_used=2 if experts else 0,
        expert_count=16 if experts else 0, decode_tok_s=decode, bench_decode_tok_s=bench,
    )  # fmt: skip


COMPARISON = Comparison(
    moe=_model("moe", 30, {1: 95.0, 4: 150.0}, 98.0, experts=True),
    dense_total=_model("dense-total", 100, {1: 30.0, 4: 100.0}, 31.0),
    dense_active=_model("dense-active", 30, {1: 100.0, 4: 330.0}, 100.0),
)


def test_the_position_is_0_at_the_total_twin_and_1_at_the_active_twin() -> None:
    assert follows(30.0, 30.0, 100.0) == pytest.approx(0.0)
    assert follows(100.0, 30.0, 100.0) == pytest.approx(1.0)
    assert follows(54.77, 30.0, 100.0) == pytest.approx(0.5, abs=1e-3)  # the geometric middle
    assert follows(None, 30.0, 100.0) is None and follows(50.0, 40.0, 40.0) is None
    assert follows_words(0.9).startswith("follows the active size")
    assert follows_words(0.1).startswith("follows the total size")


def test_a_step_of_more_users_reads_more_experts_and_a_dense_step_does_not() -> None:
    moe = COMPARISON.moe
    one_token_experts = 80 * MB * 2 / 16
    assert moe.step_bytes(1) == pytest.approx(30 * MB)
    assert moe.step_bytes(4) == pytest.approx(30 * MB - one_token_experts + 80 * MB * (1 - (14 / 16) ** 4))
    assert moe.step_bytes(1) < moe.step_bytes(4) < moe.step_bytes(64) < 30 * MB - one_token_experts + 80 * MB
    assert COMPARISON.dense_total.step_bytes(4) == COMPARISON.dense_total.step_bytes(1) == 100 * MB


def test_the_report_says_what_decode_follows_and_how_batching_changes_it() -> None:
    said = COMPARISON.sentences([1, 4])
    assert said[0].startswith("llama-bench decode, one sequence: follows the active size")
    assert said[1].startswith("served decode at 1 user: follows the active size")
    assert said[2].startswith("served decode at 4 users: follows the total size (at 0.34 ")
    assert "touches 12% of each layer's experts, of 4 41%" in said[3]
    assert "from 3.17x at 1 to 1.50x at 4 users" in said[3]
    lines = markdown_table(COMPARISON, [1, 4])
    assert len(lines) == 5 and lines[2].startswith("| moe (moe) | 100.0 | 50.0 (20.0) | 30.0 |")
    assert "tg ceiling tok/s (bound)" in lines[0]
