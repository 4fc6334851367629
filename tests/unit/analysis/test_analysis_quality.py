"""Quality loss against F16, the verdict at a quality limit, and the KV-cache type trade-off, on
hand-made run data (quality.json, kv.json and stages written with the project's own models)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from analysis_synthetic import SHAPE, SOURCE_NOTE, kld_set, write_kv, write_quality, write_synthetic_run

from quantload.analysis import build_report
from quantload.analysis.capacity import CapacityVerdict
from quantload.analysis.quality_loss import quality_loss
from quantload.analysis.quality_verdict import quality_verdict
from quantload.analysis.run_data import load_run
from quantload.analysis.run_tables import quant_table
from quantload.analysis.stage_tables import stage_table
from quantload.config import ReportSettings
from quantload.experiments.kv_types.tables import kv_type_table, predicted_mib
from quantload.rundir.kv_file import KvResult
from quantload.slo import Slo

QUANTS = ("F16", "Q8_0", "Q4_K_M")
# SmolLM2-135M's quick-profile figures (benchmarks/figures): F16 floor, Q8_0, Q4_K_M with f16 and q8_0
LOSSES: dict[str, dict[str, tuple[float, float | None]]] = {
    "F16": {"f16": (-0.000001, 0.0), "q8_0": (0.000254, 0.000022)},
    "Q8_0": {"f16": (0.004119, 0.000165), "q8_0": (0.004253, 0.000171)},
    "Q4_K_M": {"f16": (0.056713, 0.003308), "q8_0": (0.057621, 0.002916)},
}


# ----------------------------------------------------------------------------- quality loss


def test_one_sentence_per_quantization_with_the_floor_and_the_next_ones_difference() -> None:
    loss = quality_loss(kld_set(LOSSES), QUANTS, "unused")
    floor, q8, q4 = loss.sentences
    assert floor.startswith("F16 against its own base is the floor: mean KLD 0.000000 ± 0.000000 nats")
    assert q8.startswith("Q8_0: mean KLD 0.004119 ± 0.000165 nats from F16 (floor 0.000000), same top token")
    assert "beyond the floor's uncertainty" in q8
    apart = (0.056713 - 0.004119) / np.hypot(0.000165, 0.003308)
    assert f"the difference from Q4_K_M (0.056713) is beyond the uncertainty (Q4_K_M loses more, {apart:.1f}" in q8
    assert q4.endswith("the last quantization measured.")
    assert loss.floor_kld_mean_nats == -0.000001
    assert loss.reference is not None and SOURCE_NOTE in loss.reference
    assert "loss relative to that F16 file" in loss.reference
    rows = loss.rows.set_index(["quant", "cache_type"])
    assert rows.loc[("Q8_0", "f16"), "next_quant"] == "Q4_K_M" and rows.loc[("Q8_0", "f16"), "beyond_next"]
    assert rows.loc[("Q4_K_M", "q8_0"), "kld_mean_nats"] == 0.057621  # the other cache type's rows too
    assert len(loss.rows) == 6


def test_a_difference_within_the_uncertainty_says_so_and_the_larger_error_counts() -> None:
    close = {"F16": {"f16": (0.0, 0.0)}, "Q8_0": {"f16": (0.0041, 0.0002)}, "Q4_K_M": {"f16": (0.0049, 0.0001)}}
    (_, q8, _) = quality_loss(kld_set(close), QUANTS, "").sentences  # 0.0008 apart, 2 x 0.00022 = 0.00045
    assert "beyond the uncertainty" in q8
    kld = kld_set(close)  # the same pair with a per-chunk error that is larger than the per-token one
    wide = kld.results["Q8_0"]["f16"].model_copy(update={"kld_mean_chunk_error_nats": 0.0005})
    kld = kld.with_result("Q8_0", "f16", wide)
    (_, q8, _) = quality_loss(kld, QUANTS, "").sentences
    assert "0.004100 ± 0.000500 nats" in q8 and "is within the uncertainty" in q8


def test_no_kld_is_said_and_leaves_no_rows() -> None:
    loss = quality_loss(None, QUANTS, "quality.json has no entry and there is no run.json to say why")
    assert loss.rows.empty and loss.sentences == () and loss.missing is not None and "no run.json" in loss.missing


# ----------------------------------------------------------------------------- the verdict at a limit


def verdict(
    quant: str, max_users: int | None, tested: tuple[int, ...] = (1, 2, 4, 8, 16), missed: int | None = -1
) -> CapacityVerdict:
    """A capacity that meets up to `max_users` and misses from the next level tested (or `missed`)."""
    above = [u for u in tested if max_users is not None and u > max_users]
    first_miss = (above[0] if above else None) if missed == -1 else missed
    return CapacityVerdict(quant, max_users, tested, 100.0, 1.0, f"{quant} ...", (), first_miss_users=first_miss)


def test_the_most_users_within_the_limit_and_what_a_looser_limit_would_give() -> None:
    verdicts = [verdict("F16", 4), verdict("Q8_0", 8), verdict("Q4_K_M", 16)]
    chosen = quality_verdict(verdicts, kld_set(LOSSES), 0.05)
    assert (chosen.quant, chosen.max_users, chosen.kld_mean_nats) == ("Q8_0", 8, 0.004119)
    assert chosen.within_limit == ("F16", "Q8_0") and chosen.over_limit == ("Q4_K_M",)
    assert chosen.sentence.startswith(
        "Within a quality loss of at most 0.05 nats mean KLD from F16 (report.max_kld_mean_nats), Q8_0 is"
        " chosen: it serves up to 8 concurrent users within the SLO, at a mean KLD of 0.004119 nats"
    )
    assert "Q8_0 beats F16 by x1.00" not in chosen.sentence and "Q8_0 beats F16 by x2.00" in chosen.sentence
    assert "Q4_K_M would serve more (Q4_K_M beats Q8_0" in chosen.sentence
    assert chosen.sentence.endswith("but loses 0.056713 nats.")
    looser = quality_verdict(verdicts, kld_set(LOSSES), 0.1)
    assert looser.quant == "Q4_K_M" and "highest level tested" in looser.sentence


def test_the_limit_search_counts_where_the_run_searched() -> None:
    searched = dataclasses.replace(verdict("F16", 1), searched_users=3.0, searched_lowest_miss=4.0)
    chosen = quality_verdict([searched, verdict("Q8_0", 2)], kld_set(LOSSES), 0.05)
    assert (chosen.quant, chosen.max_users) == ("F16", 3)
    assert "up to 3 concurrent users" in chosen.sentence and "highest level tested" not in chosen.sentence


def test_capacities_the_data_cannot_tell_apart_go_to_the_smaller_loss() -> None:
    verdicts = [verdict("F16", 4, missed=None), verdict("Q8_0", 8), verdict("Q4_K_M", 8)]
    chosen = quality_verdict(verdicts, kld_set(LOSSES), 0.1)
    assert chosen.quant == "F16"  # nothing shows F16 serves fewer: it never missed
    assert "no difference shown between F16 and Q8_0" in chosen.sentence
    assert "Q8_0 loses more" in chosen.sentence


def test_a_decided_difference_beats_a_smaller_loss() -> None:
    verdicts = [verdict("F16", 4), verdict("Q8_0", 8)]
    assert quality_verdict(verdicts, kld_set(LOSSES), 0.1).quant == "Q8_0"


def test_the_served_cache_type_decides_which_kld_counts() -> None:
    verdicts = [verdict("Q8_0", 8), verdict("Q4_K_M", 16)]
    limit = 0.0042  # Q8_0 is within it with an f16 cache (0.004119), not with q8_0 (0.004253)
    assert quality_verdict(verdicts, kld_set(LOSSES), limit, "f16", "f16").quant == "Q8_0"
    served_q8 = quality_verdict(verdicts, kld_set(LOSSES), limit, "q8_0", "q8_0")
    assert served_q8.cache_type == "q8_0" and served_q8.quant is None
    assert served_q8.sentence.startswith("No quantization measured stays within a quality loss of at most 0.0042")
    assert "with the q8_0 KV cache served" in served_q8.sentence
    mixed = quality_verdict(verdicts, kld_set(LOSSES), limit, "q8_0", "f16")  # K and V differ: weights only
    assert mixed.cache_type == "f16" and mixed.quant == "Q8_0"


def test_no_kld_no_slo_and_unmeasured_quantizations_are_said() -> None:
    verdicts = [verdict("F16", None), verdict("Q8_0", None), verdict("Q4_K_M", 2)]
    assert quality_verdict(verdicts, None, 0.05).quant is None
    assert "was not measured" in quality_verdict(verdicts, None, 0.05).sentence
    none_fit = quality_verdict(verdicts, kld_set(LOSSES), 0.05)
    assert none_fit.quant is None and "(F16, Q8_0), none was shown to meet the SLO" in none_fit.sentence
    partial = {"F16": LOSSES["F16"], "Q8_0": LOSSES["Q8_0"]}
    chosen = quality_verdict([verdict("Q8_0", 4), verdict("Q4_K_M", 8)], kld_set(partial), 0.05)
    assert chosen.quant == "Q8_0" and chosen.not_measured == ("Q4_K_M",)
    assert chosen.sentence.endswith("Not judged (no KLD measured): Q4_K_M.")


# ----------------------------------------------------------------------------- the KV-cache type trade-off


def kv_bytes(cache_bytes_per_element: float) -> float:
    """Independent arithmetic: layers x streams x cells x KV heads x (K + V head dims) x bytes/element."""
    n_layer, heads, dims = SHAPE["n_layer"], 3, 64 + 64
    return float(n_layer) * 8 * 4096 * heads * dims * cache_bytes_per_element  # type: ignore[operator]


def test_memory_is_the_exact_allocation_for_every_cache_type() -> None:
    entry = KvResult.model_validate({**SHAPE, "cache_type_k": "f16", "cache_type_v": "f16"})
    assert predicted_mib(entry, "f16") == kv_bytes(2) / 2**20 == 720.0
    assert predicted_mib(entry, "q8_0") == kv_bytes(34 / 32) / 2**20
    assert predicted_mib(entry, "q4_0") == kv_bytes(18 / 32) / 2**20
    odd = KvResult.model_validate({**SHAPE, "head_dim_k": 40, "head_dim_v": 40})
    assert predicted_mib(odd, "q8_0") is None  # 120-element rows do not split into 32-element blocks


@pytest.fixture
def kv_run(tmp_path: Path) -> Path:
    folder = write_synthetic_run(tmp_path / "kv-run", quants=QUANTS, kv_types=("f16", "q8_0"))
    write_quality(folder, LOSSES)
    write_kv(folder, QUANTS, others={"q8_0": 382.5})
    return folder


def stage_output_tok_s(folder: Path, quant: str, cache_type: str) -> float:
    """Recomputed from the raw files: completion tokens over first send to last end of the stage."""
    ends = [json.loads(line) for line in (folder / "stages.jsonl").read_text().splitlines()]
    (stage_id,) = {e["stage_id"] for e in ends if e["quant"] == quant and e.get("kv_cache_type") == cache_type}
    records = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    mine = [r for r in records if r["stage_id"] == stage_id and not r["warmup"] and r["ok"]]
    span = max(r["sent_unix_s"] + r["e2e_s"] for r in mine) - min(r["sent_unix_s"] for r in mine)
    return sum(r["completion_tokens"] for r in mine) / span


def test_the_trade_off_table_has_memory_speed_and_kld_per_cache_type(kv_run: Path) -> None:
    run = load_run(kv_run)
    table = kv_type_table(run, stage_table(run, Slo(1.0, 0.1)), QUANTS).set_index(["quant", "cache_type"])
    assert list(table.index) == [(q, t) for q in QUANTS for t in ("f16", "q8_0")]
    q8 = table.loc[("Q8_0", "q8_0")]
    assert q8["kv_predicted_mib"] == kv_bytes(34 / 32) / 2**20 and q8["kv_reported_mib"] == 382.5
    assert q8["kv_vs_f16_frac"] == pytest.approx(34 / 64 - 1)
    assert not q8["own_server"] and table.loc[("Q8_0", "f16"), "own_server"]
    assert table.loc[("Q8_0", "f16"), "kv_reported_mib"] == 720.0  # the quantization's own server's check
    for quant in QUANTS:
        for kind in ("f16", "q8_0"):
            assert table.loc[(quant, kind), "output_tok_s"] == pytest.approx(stage_output_tok_s(kv_run, quant, kind))
    f16, q8_speed = (stage_output_tok_s(kv_run, "Q8_0", kind) for kind in ("f16", "q8_0"))
    assert q8["output_vs_f16_frac"] == pytest.approx(q8_speed / f16 - 1)
    assert q8["kld_mean_nats"] == 0.004253 and q8["kld_added_nats"] == pytest.approx(0.004253 - 0.004119)
    assert (q8["users"], q8["status"], q8["flash_attn"]) == (4, "ok", "enabled")


def test_a_run_without_kv_types_has_no_table_and_a_planned_missing_one_is_a_gap(tmp_path: Path) -> None:
    plain = write_synthetic_run(tmp_path / "plain", quants=QUANTS)
    write_quality(plain, {"F16": {"f16": (0.0, 0.0)}})
    run = load_run(plain)
    assert kv_type_table(run, stage_table(run, Slo(1.0, 0.1)), QUANTS).empty
    config = json.loads((plain / "config.json").read_text())
    config["settings"]["kv_types"] = {"requests": 4}  # planned, never ran
    (plain / "config.json").write_text(json.dumps(config))
    paths = build_report(plain)
    gaps = [g for g in json.loads(paths.summary.read_text())["not_measured"] if g["section"] == "kv_types"]
    assert {g["what"] for g in gaps} == {
        f"decode at 8 users of {q} with a {t} KV cache" for q in QUANTS for t in ("f16", "q8_0")
    }


# ----------------------------------------------------------------------------- the report


def test_the_report_shows_the_quality_loss_the_verdict_at_the_limit_and_the_kv_trade_off(kv_run: Path) -> None:
    paths = build_report(kv_run)
    summary = json.loads(paths.summary.read_text())
    run = load_run(kv_run)
    table = quant_table(run, __import__("pandas").DataFrame(), QUANTS).set_index("quant")
    assert table.loc["Q4_K_M", "kld_mean_nats"] == 0.056713 and table.loc["Q4_K_M", "kld_mean_error_nats"] == 0.003308
    csv = paths.csv.read_text().splitlines()
    assert "kld_mean_nats" in csv[0] and "same_top_p_pct" in csv[0]
    assert summary["quality_loss"]["sentences"] == list(quality_loss(kld_set(LOSSES), QUANTS, "").sentences)
    assert len(summary["quality_loss"]["rows"]) == 6
    assert summary["quality_verdict"]["max_kld_mean_nats"] == 0.05 and summary["slo"]["ttft_percentile"] == "p99"
    assert summary["quality_verdict"]["over_limit"] == ["Q4_K_M"]
    assert {(r["quant"], r["cache_type"]) for r in summary["kv_cache_types"]} == {
        (q, t) for q in QUANTS for t in ("f16", "q8_0")
    }
    markdown = paths.markdown.read_text()
    for text in (
        "## Quality loss against F16 (KL divergence)", "## KV-cache type trade-off",
        summary["quality_verdict"]["sentence"], "mean KLD ± s.e. (nats)", SOURCE_NOTE,
        "| Q8_0 | q8_0 | 382.50 | 382.50 | -47 % |",
    ):  # fmt: skip
        assert text in markdown, text
    plots = {Path(p).name for p in summary["files"]["plots"]}
    assert {"quality_speed_size.png", "kv_cache_types.png"} <= plots


def test_a_stricter_limit_from_the_settings_changes_the_verdict(kv_run: Path) -> None:
    paths = build_report(kv_run, settings=ReportSettings(max_kld_mean_nats=0.001))
    verdict_line = json.loads(paths.summary.read_text())["quality_verdict"]
    assert verdict_line["within_limit"] == ["F16"] and verdict_line["max_kld_mean_nats"] == 0.001
