"""The traffic figures of a report from synthetic run directories: TTFT and prompt tokens by turn,
hit rate per conversation, the mixed-traffic table and verdict, the limit search in the capacity
verdict. Expected values are recomputed from the raw lines written here (numpy), never typed in."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from analysis_synthetic import write_synthetic_run

from quantload.analysis import build_report
from quantload.analysis.capacity import capacity
from quantload.analysis.run_data import load_run
from quantload.analysis.stage_tables import stage_table
from quantload.experiments.mixed.tables import mixed_table, mixed_verdict
from quantload.experiments.sessions.tables import hit_summary, session_hits, turn_table
from quantload.llamacpp.server import free_port
from quantload.load.limit_file import LimitLine, TrialLine
from quantload.load.records import RequestRecord, StageEvent
from quantload.slo import Slo

T0 = 1_900_000_000.0


def _event(kind: str, stage_id: str, experiment: str, at: float, **fields: Any) -> str:
    return StageEvent(
        event=kind, unix_s=at, run_id="synthetic", server="llama-q8_0", quant="Q8_0", experiment=experiment,
        stage_id=stage_id, stage_index=0, stage_users=fields.pop("users", 2), cache_prompt=fields.pop("cache", False),
        requests_planned=1, **fields,
    ).to_json_line()  # fmt: skip


def _record(stage_id: str, experiment: str, sent: float, ttft: float, **fields: Any) -> RequestRecord:
    gaps = fields.pop("gaps", [0.01, 0.01])
    return RequestRecord(
        run_id="synthetic", server="llama-q8_0", quant="Q8_0", model="m", url="http://x", experiment=experiment,
        stage_id=stage_id, stage_users=2, cache_prompt=fields.pop("cache", False), prompt_id="p", worker="w",
        intended_unix_s=sent, sent_unix_s=sent, lag_s=0.0, ttft_s=ttft, ttft_content_s=ttft,
        e2e_s=ttft + sum(gaps), tpot_s=sum(gaps) / len(gaps), itl_s=gaps, completion_tokens=len(gaps) + 1,
        ok=True, within_deadline=True, **fields,
    )  # fmt: skip


def write_sessions(folder: Path, seed: int = 0) -> list[RequestRecord]:
    """Two stages (cache off, on) of three conversations of three turns; returns the records."""
    rng = random.Random(seed)
    records, events = [], []
    clock = T0
    for cache in (False, True):
        stage_id = f"sessions-{int(cache)}"
        events.append(_event("stage_start", stage_id, "sessions", clock, cache=cache, workload="sessions"))
        for session in range(3):
            prompt = 0
            for turn in range(3):
                prompt += rng.randint(30, 60)
                cached = int(prompt * rng.uniform(0.5, 0.9)) if cache and turn else 0
                records.append(
                    _record(
                        stage_id, "sessions", clock, rng.uniform(0.05, 0.2) * (turn + 1), cache=cache,
                        session_id=f"{stage_id}-s{session}", turn=turn, prompt_tokens=prompt,
                        timings={"cache_n": cached, "prompt_ms": 10.0}, workload="sessions",
                    )
                )
                clock += 0.5
                prompt += 9  # the reply joins the history
        events.append(_event("stage_end", stage_id, "sessions", clock, cache=cache, workload="sessions"))
    _write(folder, records, events)
    return records


def write_mixed(folder: Path, hurt: dict[str, float]) -> list[RequestRecord]:
    """Alone and mixed stages at two batch sizes; decode gaps x `hurt[args]` when mixed."""
    records, events = [], []
    clock = T0
    for args, factor in hurt.items():
        for phase in ("alone", "mixed"):
            stage_id = f"mixed-{args}-{phase}".replace(" ", "")
            events.append(_event("stage_start", stage_id, "mixed", clock, phase=phase, server_args=args))
            for index in range(6):
                scale = factor if phase == "mixed" and index % 2 else 1.0
                gaps = [0.01 * scale, 0.012, 0.011 * scale]
                records.append(_record(stage_id, "mixed", clock, 0.05, gaps=gaps, request_class="decode"))
                clock += 0.1
            if phase == "mixed":
                long_ttft = 2.0 if args.startswith("-b 2048") else 3.5
                records.append(_record(stage_id, "mixed", clock, long_ttft, request_class="long_prompt", prompt_tokens=3000))
                clock += 0.1
            events.append(_event("stage_end", stage_id, "mixed", clock, phase=phase, server_args=args))
    _write(folder, records, events)
    return records


def _write(folder: Path, records: list[RequestRecord], events: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "records.jsonl").open("a") as handle:
        handle.writelines(r.to_json_line() + "\n" for r in records)
    with (folder / "stages.jsonl").open("a") as handle:
        handle.writelines(e + "\n" for e in events)


def test_ttft_prompt_tokens_and_cache_hits_by_turn(tmp_path: Path) -> None:
    written = write_sessions(tmp_path)
    run = load_run(tmp_path)
    stages = stage_table(run, Slo(1.0, 0.1))
    turns = turn_table(run.records, stages, ["Q8_0"])
    assert len(turns) == 6
    for row in turns.to_dict("records"):
        mine = [r for r in written if r.cache_prompt == row["cache_prompt"] and r.turn == row["turn"]]
        assert row["requests"] == 3
        assert row["ttft_p50_s"] == pytest.approx(float(np.percentile([r.ttft_s for r in mine], 50)))
        assert row["prompt_tokens_p50"] == pytest.approx(float(np.percentile([r.prompt_tokens for r in mine], 50)))
        cached = sum((r.timings or {})["cache_n"] for r in mine)
        assert row["cache_hit_frac"] == pytest.approx(cached / sum(r.prompt_tokens or 0 for r in mine))
    hits = session_hits(run.records, stages, ["Q8_0"])
    assert len(hits) == 6 and set(hits[~hits["cache_prompt"]]["hit_frac"]) == {0.0}
    for row in hits[hits["cache_prompt"]].to_dict("records"):
        later = [r for r in written if r.session_id == row["session_id"] and (r.turn or 0) >= 1]
        expected = sum((r.timings or {})["cache_n"] for r in later) / sum(r.prompt_tokens or 0 for r in later)
        assert row["hit_frac"] == pytest.approx(expected)
    summary = hit_summary(hits).set_index("cache_prompt")
    assert summary.loc[False, "lost_cache"] == 3 and summary.loc[True, "lost_cache"] == 0
    assert 0.5 <= summary.loc[True, "hit_frac_p50"] <= 0.9


def test_mixed_table_pools_every_decode_gap_and_the_verdict_follows_it(tmp_path: Path) -> None:
    written = write_mixed(tmp_path / "protects", {"-b 2048 -ub 512": 20.0, "-b 256 -ub 256": 2.0})
    run = load_run(tmp_path / "protects")
    table = mixed_table(run.records, stage_table(run, Slo(1.0, 0.1)), run.itl_by_request or {}, ["Q8_0"])
    assert [(r["server_args"], r["phase"]) for r in table.to_dict("records")] == [
        ("-b 2048 -ub 512", "alone"), ("-b 2048 -ub 512", "mixed"), ("-b 256 -ub 256", "alone"),
        ("-b 256 -ub 256", "mixed"),
    ]  # fmt: skip
    for row in table.to_dict("records"):
        stage = f"mixed-{row['server_args']}-{row['phase']}".replace(" ", "")
        gaps = [g for r in written if r.stage_id == stage and r.request_class == "decode" for g in r.itl_s or ()]
        assert row["itl_p99_s"] == pytest.approx(float(np.percentile(gaps, 99)))
        assert row["itl_p95_s"] == pytest.approx(float(np.percentile(gaps, 95)))
        assert row["long_requests"] == (1 if row["phase"] == "mixed" else 0)
    verdict = mixed_verdict(table)
    assert verdict.startswith("Q8_0: long prompts raised decode ITL p99")
    assert "the smaller batch protects decode" in verdict and "2.00 s → 3.50 s" in verdict
    write_mixed(tmp_path / "same", {"-b 2048 -ub 512": 20.0, "-b 256 -ub 256": 20.0})
    same = load_run(tmp_path / "same")
    table = mixed_table(same.records, stage_table(same, Slo(1.0, 0.1)), same.itl_by_request or {}, ["Q8_0"])
    assert "did not protect decode here" in mixed_verdict(table)
    write_mixed(tmp_path / "calm", {"-b 2048 -ub 512": 1.0, "-b 256 -ub 256": 1.0})
    calm = load_run(tmp_path / "calm")
    table = mixed_table(calm.records, stage_table(calm, Slo(1.0, 0.1)), calm.itl_by_request or {}, ["Q8_0"])
    assert "barely changed" in mixed_verdict(table)


def limit_line(quant: str, limit: float | None, missed: float | None, ending: str = "found") -> LimitLine:
    levels = [1.0, 2.0, 4.0, 8.0, 6.0, 7.0]
    trials = [
        TrialLine(
            level=level, outcome="meets" if missed is None or level < missed else "misses", hard_failure=False,
            seconds=10.0, why="x",
        )
        for level in levels
    ]
    return LimitLine(
        run_id="synthetic", server=f"llama-{quant.lower()}", quant=quant, experiment="limit_users", kind="users",
        workload="prompts", slo_ttft_s=1.0, slo_tpot_s=0.1, limit=limit, ending=ending, lowest_miss=missed,
        seconds=80.0, sentence="", trials=trials, unix_s=T0,
    )  # fmt: skip


def test_the_capacity_verdict_names_the_limit_the_search_found(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run")
    lines = [limit_line("Q8_0", 6.0, 7.0), limit_line("Q4_K_M", None, 1.0, "never_met")]
    (run_dir / "limits.jsonl").write_text("".join(line.model_dump_json(by_alias=True) + "\n" for line in lines))
    paths = build_report(run_dir, f"http://127.0.0.1:{free_port()}")
    summary = json.loads(paths.summary.read_text())
    verdicts = {v["quant"]: v for v in summary["capacity"]}
    q8 = verdicts["Q8_0"]
    assert q8["searched_users"] == 6.0
    assert q8["sentence"].startswith("Q8_0 meets the SLO up to 6 concurrent users, the limit the search found")
    assert "misses from 7" in q8["sentence"] and "6 trials in 80 s" in q8["sentence"]
    assert q8["sweep_sentence"] and q8["sentence"].endswith(q8["sweep_sentence"])
    assert "no level was shown to meet the SLO" in verdicts["Q4_K_M"]["sentence"]
    assert [line["quant"] for line in summary["limits"]] == ["Q8_0", "Q4_K_M"]
    markdown = paths.markdown.read_text()
    assert "## Finding the limit" in markdown and "12 trials" in markdown
    assert "limit_search.png" in {p.name for p in paths.plots}
    # absent parts say so, together in one list rather than a heading each
    assert "Multi-turn sessions: no complete sessions stage" in markdown
    assert "## Multi-turn sessions" not in markdown and "## Not run in this run" in markdown


def test_sessions_and_mixed_sections_and_figures_in_the_report(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run", quants=("Q8_0",))
    write_sessions(run_dir)
    write_mixed(run_dir, {"-b 2048 -ub 512": 20.0, "-b 256 -ub 256": 2.0})
    paths = build_report(run_dir, f"http://127.0.0.1:{free_port()}")
    names = {p.name for p in paths.plots}
    assert {"ttft_by_turn.png", "mixed_itl.png"} <= names and "mixed_timeline.png" not in names
    markdown = paths.markdown.read_text()
    assert "## Multi-turn sessions" in markdown and "## Mixed traffic" in markdown
    assert "the smaller batch protects decode" in markdown
    assert "not measured: busy slots, KV use and deferred requests over time need Prometheus" in markdown
    # no reasoning content: listed with the other parts that did not run, with why
    assert "Reasoning models: which TTFT: no request of this run carried reasoning content" in markdown
    summary = json.loads(paths.summary.read_text())
    assert len(summary["session_turns"]) == 6 and len(summary["mixed"]) == 4
    assert summary["mixed_verdict"].startswith("Q8_0:")


def test_the_goodput_at_the_searched_limit_comes_from_its_trial_there() -> None:
    line = limit_line("Q8_0", 6.0, 7.0)
    trials = [t.model_copy(update={"stage_id": f"s{i}"}) for i, t in enumerate(line.trials)]
    line = line.model_copy(update={"trials": trials})  # levels 1 2 4 8 6 7: met at 6 in s4
    stages = pd.DataFrame({
        "stage_id": [f"s{i}" for i in range(6)],
        "goodput_rps": [0.5, 1.0, 1.5, 0.1, 2.2, 0.2],
        "output_tok_s": [10.0, 20.0, 30.0, 5.0, 44.0, 6.0],
    })  # fmt: skip
    (verdict,) = capacity(pd.DataFrame(), ["Q8_0"], Slo(1.0, 0.1), [line], stages)
    assert verdict.held_users == 6
    assert verdict.searched_goodput_rps == 2.2 and verdict.searched_output_tok_s == 44.0
    (no_stages,) = capacity(pd.DataFrame(), ["Q8_0"], Slo(1.0, 0.1), [line])
    assert no_stages.searched_goodput_rps is None
