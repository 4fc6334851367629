"""The server flags chapter's computations on hand-made records and stages: the wait behind running
generations, where more slots stop paying and which requests no longer fit, speculation's speed-up
against off (never for a variant that did not speculate), and the tune's trials and outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from quantload.analysis.tune_tables import tune_tables, tune_verdict
from quantload.experiments.batching.tables import batching_table, batching_verdict, request_waits
from quantload.experiments.slots.tables import slots_table, slots_verdict
from quantload.experiments.speculation.tables import speculation_table, speculation_verdict
from quantload.experiments.variant_file import SpeculationCheck, VariantLine
from quantload.load.limit_file import LimitLine, TrialLine
from quantload.rundir import TUNE_JSONL
from quantload.tune.outcome import write_tune_json
from quantload.tune.state_file import TuneLine, append_tune_line


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    base = {
        "warmup": False,
        "ok": True,
        "error": None,
        "finish_reason": "stop",
        "draft_n": None,
        "draft_n_accepted": None,
        "quant": "Q8_0",
    }
    return pd.DataFrame([{**base, **row} for row in rows])


def test_the_wait_is_ttft_less_prefill_and_behind_means_another_was_generating() -> None:
    requests = frame(
        [
            {
                "sent_unix_s": 0.0,
                "intended_unix_s": 0.0,
                "ttft_s": 0.5,
                "prompt_ms": 400.0,
                "end_unix_s": 3.0,
            },
            {
                "sent_unix_s": 1.0,
                "intended_unix_s": 1.0,
                "ttft_s": 2.2,
                "prompt_ms": 200.0,
                "end_unix_s": 5.0,
            },
            {
                "sent_unix_s": 10.0,
                "intended_unix_s": 9.0,
                "ttft_s": 0.3,
                "prompt_ms": 250.0,
                "end_unix_s": 11.0,
            },
        ]
    ).assign(ttft_from_intended_s=lambda f: f["ttft_s"] + f["sent_unix_s"] - f["intended_unix_s"])
    closed = request_waits(requests, open_loop=False)
    assert list(closed["behind"]) == [False, True, False]
    assert list(closed["wait_s"]) == pytest.approx([0.1, 2.0, 0.05])
    opened = request_waits(requests, open_loop=True)
    assert list(opened["wait_s"]) == pytest.approx([0.1, 2.0, 1.05])  # from the intended send time


def test_the_batching_table_pairs_cb_with_nocb_and_the_verdict_says_what_static_cost() -> None:
    records, stages = [], []
    for args, ttft in (("-cb", 0.2), ("-nocb", 1.8)):
        stage = f"b{args}"
        stages.append(
            {
                "experiment": "batching",
                "status": "ok",
                "quant": "Q8_0",
                "server_args": args,
                "phase": "closed",
                "users": 2.0,
                "rate_rps": None,
                "stage_id": stage,
                "requests": 2,
                "ok": 2,
                "itl_p99_s": 0.05,
                "output_tok_s": 40.0 if args == "-cb" else 25.0,
                "requests_per_s": 1.0,
                "goodput_rps": 1.0,
            }
        )
        for n in range(2):
            records.append(
                {
                    "stage_id": stage,
                    "sent_unix_s": 10.0 * n,
                    "intended_unix_s": 10.0 * n,
                    "ttft_s": ttft,
                    "ttft_from_intended_s": ttft,
                    "prompt_ms": 100.0,
                    "end_unix_s": 10.0 * n + 2,
                }
            )
    table = batching_table(frame(records), pd.DataFrame(stages), ["Q8_0"])
    assert list(table["server_args"]) == ["-cb", "-nocb"] and list(table["batching"]) == [
        "continuous",
        "static",
    ]
    assert table.set_index("server_args").loc["-nocb", "wait_p99_s"] == pytest.approx(1.7)
    verdict = batching_verdict(table)
    assert verdict.startswith(
        "Q8_0 at 2 users: static batching (-nocb) took TTFT p99 from 200 ms to 1.80 s (x9.0)"
    )
    assert "25.0 against 40.0 output tok/s" in verdict
    assert batching_verdict(pd.DataFrame()) == "not measured: no complete batching stage"


def _search(slots: int, limit: float | None, stage: str) -> LimitLine:
    trial = TrialLine(
        level=limit or 1, outcome="meets" if limit is not None else "misses", hard_failure=False, seconds=1,
        why="", stage_id=stage
    )
    return LimitLine(
        run_id="r",
        server="llama-q8_0",
        quant="Q8_0",
        experiment="limit_users",
        kind="users",
        workload="prompts",
        slo_ttft_s=1,
        slo_tpot_s=0.1,
        limit=limit,
        ending="found",
        lowest_miss=None,
        seconds=1,
        sentence="",
        trials=[trial],
        unix_s=0,
        variant=f"slots -np {slots} -c 1024",
    )


def test_more_slots_stop_paying_within_a_tenth_of_the_best_and_refusals_say_what_no_longer_fits() -> None:
    lines = [_search(1, 2, "s1"), _search(2, 5, "s2"), _search(4, 5, "s4"), _search(8, 5.0, "s8")]
    variants = [
        VariantLine(
            run_id="r",
            experiment="slots",
            server="llama-q8_0",
            quant="Q8_0",
            label=line.variant or "",
            args=[],
            kv={"predicted_mib": 8.0, "reported_mib": 8.0},
            unix_s=0,
        )
        for line in lines
    ]
    refused = "request (200 tokens) exceeds the available context size (128 tokens)"
    records = frame(
        [
            *(
                {"stage_id": f"s{n}", "prompt_tokens": 100.0, "max_tokens": 32.0, "completion_tokens": 32.0}
                for n in (1, 2, 4, 8)
                for _ in range(3)
            ),
            {
                "stage_id": "s8",
                "ok": False,
                "prompt_tokens": None,
                "max_tokens": 32.0,
                "completion_tokens": None,
                "error": refused,
            },
        ]
    )
    table = slots_table(lines, variants, {}, records, ["Q8_0"])
    assert list(table["slots"]) == [1, 2, 4, 8] and list(table["ctx_per_slot"]) == [1024, 512, 256, 128]
    at_eight = table.set_index("slots").loc[8]
    assert at_eight["refused"] == 1 and at_eight["need_over_frac"] == pytest.approx(13 / 13)
    verdict = slots_verdict(table)
    assert verdict.startswith("Q8_0: -np 2 (512 tokens a slot) holds 5 users; more slots stop paying there")
    assert "from -np 8 (128 tokens a slot) requests no longer fit: 1 refused and 0 cut short of 4" in verdict


def test_speculation_is_measured_against_off_and_a_variant_that_did_not_speculate_gets_no_speed_up() -> None:
    stages, records = [], []
    for label, predicted_ms, drafted in (
        ("spec off", 2000.0, None),
        ("spec ngram default", 1000.0, 40.0),
        ("spec draft d", 500.0, None),
    ):
        stage = label.replace(" ", "-")
        stages.append(
            {
                "experiment": "speculation",
                "status": "ok",
                "quant": "Q8_0",
                "server_args": label,
                "phase": "repeat traffic",
                "users": 1,
                "stage_id": stage,
                "output_tok_s": 1.0,
            }
        )
        records += [  # six requests alike: the speed-up is exact, decided without a spread
            {
                "stage_id": stage,
                "completion_tokens": 100.0,
                "predicted_ms": predicted_ms,
                "tpot_s": predicted_ms / 100_000,
                "draft_n": drafted,
                "draft_n_accepted": 30.0 if drafted else None,
            }
        ] * 6
    checks = [
        VariantLine(
            run_id="r",
            experiment="speculation",
            server="s",
            quant="Q8_0",
            label="spec ngram default",
            args=[],
            unix_s=0,
            speculation=SpeculationCheck(speculating=True, why="", draft_tokens=40, accepted_tokens=30),
        ),
        VariantLine(
            run_id="r",
            experiment="speculation",
            server="s",
            quant="Q8_0",
            label="spec draft d",
            args=[],
            unix_s=0,
            speculation=SpeculationCheck(
                speculating=False,
                why="not speculating: the server logged 'failed to initialize speculative decoding context'",
            ),
        ),
    ]
    table = speculation_table(frame(records), pd.DataFrame(stages), checks, ["Q8_0"]).set_index("variant")
    assert table.loc["spec ngram default", "decode_speedup"] == pytest.approx(2.0)
    assert table.loc["spec ngram default", "acceptance"] == pytest.approx(0.75)
    assert table.loc["spec ngram default", "server_acceptance"] == pytest.approx(0.75)
    assert pd.isna(table.loc["spec draft d", "decode_speedup"])  # faster, but not speculation: no speed-up
    verdict = speculation_verdict(table.reset_index())
    assert (
        "repeat traffic at 1 user: x2.00 [2.00, 2.00] decode tok/s with ngram default (75 % of drafts accepted)"
        in verdict
    )
    assert "not speculating, so not counted: spec draft d" in verdict


def test_the_tune_tables_read_every_trial_and_each_outcome(tmp_path: Path) -> None:
    path = tmp_path / TUNE_JSONL
    common = {"run_id": "r", "quant": "Q8_0", "server": "llama-q8_0"}
    append_tune_line(path, TuneLine(kind="start", objective="users", configs=["a", "b"], **common))
    append_tune_line(path, TuneLine(kind="trial", key="a", rung=0, limit=4, goodput_rps=1.5, **common))
    append_tune_line(
        path, TuneLine(kind="trial", key="b", rung=0, limit=None, ran=False, why="no start", **common)
    )
    append_tune_line(path, TuneLine(kind="baseline", key="configured flags", rung=0, limit=2, **common))
    write_tune_json(
        tmp_path,
        "Q8_0",
        {
            "winner": "a",
            "against_baseline": {"sentence": "winner a: limit 4 against 2"},
            "cost": {"sentence": "3 trials"},
            "ranking": [],
        },
    )
    tables = tune_tables(tmp_path)
    assert list(tables.trials["key"]) == ["a", "b", "configured flags"]
    assert list(tables.trials["baseline"]) == [False, False, True] and list(tables.trials["rung"]) == [
        1,
        1,
        1,
    ]
    assert tables.objective == "users" and tables.outcomes["Q8_0"]["winner"] == "a"
    assert tune_verdict(tables) == "Q8_0: winner a: limit 4 against 2; 3 trials."
    assert tune_verdict(tune_tables(tmp_path / "none")) == "not run: no tune in this run"
