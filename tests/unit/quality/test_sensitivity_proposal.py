"""The scan's proposal from measured variants: over the limit, the best-paying raises until it is
met; within it, the cheapest lowerings while it holds; the ranking by KLD per MiB."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantload.quality.sensitivity import GROUP_PATTERNS, SensitivityFile, Variant, propose

MIB = 2**20


def _v(group: str | None, direction: str, kld: float, mib: float, base_kld: float, base_mib: float) -> Variant:
    change, size = (None, None) if group is None else (kld - base_kld, mib - base_mib)
    per = None
    if change is not None and size:
        per = -change / size if direction == "raise" else change / -size
    return Variant(
        name=group or "base", direction=direction, group=group, tensor_type="q8_0" if direction == "raise" else "q3_k",  # type: ignore[arg-type]
        tensors=2, size_bytes=round(mib * MIB), kld_mean_nats=kld, kld_mean_error_nats=None, same_top_p_pct=90.0,
        ppl_change_pct=0.0, kld_change_nats=change, size_change_mib=size, kld_per_mib=per, seconds=1.0,
    )


def _scan(base_kld: float, variants: list[tuple[str, str, float, float]], limit: float) -> SensitivityFile:
    return SensitivityFile(
        reference="F16.gguf", base_type="Q4_K_M", raise_to="q8_0", lower_to="q3_k", limit_kld_mean_nats=limit,
        chunks_scored=4, base=_v(None, "base", base_kld, 100.0, base_kld, 100.0),
        variants=tuple(_v(g, d, k, m, base_kld, 100.0) for g, d, k, m in variants),
    )


VARIANTS = [
    ("attn_v", "raise", 0.050, 101.0),  # 0.010 nats for 1 MiB: the best buy
    ("ffn_down", "raise", 0.045, 105.0),  # 0.015 for 5 MiB
    ("token_embd", "raise", 0.059, 120.0),  # 0.001 for 20 MiB
    ("attn_k", "raise", 0.061, 100.5),  # worse: never chosen
    ("ffn_up", "lower", 0.062, 95.0),  # 0.002 nats per MiB saved
    ("attn_v", "lower", 0.090, 99.0),  # 0.030 per MiB saved: the dearest
]


def test_over_the_limit_the_best_paying_raises_are_taken_until_it_is_met(tmp_path: Path) -> None:
    scan = _scan(0.060, VARIANTS, limit=0.040)
    assert [v.group for v in scan.ranking("raise")] == ["attn_v", "ffn_down", "token_embd", "attn_k"]
    proposal = propose(scan, tmp_path / "types.txt")
    assert proposal.direction == "raise" and proposal.groups == ("attn_v", "ffn_down")
    assert proposal.predicted_kld_mean_nats == pytest.approx(0.035) and proposal.meets_limit
    assert proposal.predicted_size_bytes == round(106 * MIB)
    lines = (tmp_path / "types.txt").read_text().split()
    assert lines == [f"{GROUP_PATTERNS['attn_v']}=q8_0", f"{GROUP_PATTERNS['ffn_down']}=q8_0"]


def test_within_the_limit_the_cheapest_lowerings_are_taken_while_it_holds(tmp_path: Path) -> None:
    scan = _scan(0.060, VARIANTS, limit=0.070)
    assert [v.group for v in scan.ranking("lower")] == ["ffn_up", "attn_v"]
    proposal = propose(scan, None)
    assert proposal.direction == "lower" and proposal.groups == ("ffn_up",)  # attn_v would pass the limit
    assert proposal.predicted_kld_mean_nats == pytest.approx(0.062) and proposal.tensor_type_file is None
    nothing = propose(_scan(0.060, VARIANTS[:4], limit=0.070), None)
    assert nothing.direction == "none" and nothing.overrides == () and "the base type is the proposal" in nothing.why
