"""The supervisor's watch: measured requests, the running stage and each stage's summary, from the
parsed new lines of records.jsonl and stages.jsonl."""

from __future__ import annotations

from pathlib import Path

from load_api import sweep_of
from quantload.config import LoadSettings
from quantload.load.prompts import Prompt
from quantload.load.records import JsonlAppender, RequestRecord
from quantload.load.supervisor import InvocationWatch, NewLines
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget
from quantload.slo import Slo

TARGET = ServedTarget(name="srv", quant="Q8_0", model="m", url="http://127.0.0.1:1")
PLAN = sweep_of(LoadSettings(users=(1, 2), repeats=1), TARGET, [Prompt("p", "hi", 1)], "run", "inv")


def record(stage_id: str, warmup: bool, spaced: bool = False) -> str:
    line = RequestRecord(
        run_id="run", server="srv", quant="Q8_0", model="m", url="http://127.0.0.1:1",
        experiment="sweep", stage_id=stage_id, warmup=warmup, cache_prompt=False, prompt_id="p",
        worker="h:1", intended_unix_s=1.0, sent_unix_s=1.0, lag_s=0.0, ok=True, within_deadline=True,
        ttft_s=0.2, e2e_s=0.5, tpot_s=0.01, completion_tokens=4,
    ).to_json_line()  # fmt: skip
    return line.replace(",", ", ").replace('":', '": ') if spaced else line


def test_progress_counts_this_invocation_s_measured_records_whatever_their_spacing(tmp_path: Path) -> None:
    records = JsonlAppender(tmp_path / "records.jsonl")
    stages = JsonlAppender(tmp_path / "stages.jsonl")
    records.append_line(record("old-0", False))  # before this invocation: not counted
    watch = InvocationWatch(PLAN, RunDir(tmp_path), Slo(1.0, 0.1))
    for line in (
        record("inv-0", True),  # warm-up
        record("inv-0", False),
        record("inv-0", False, spaced=True),  # another writer's whitespace counts the same
        record("other-inv-0", False),  # another invocation appending to the same file
        "not json at all",
    ):
        records.append_line(line)
    stages.append(PLAN.stage_event(PLAN.stages[1], "stage_start", 5.0))
    watch.poll()
    assert watch.done == 2
    assert watch.note == "srv sweep stage 2/2"
    records.append_line(record("inv-1", False))
    watch.poll()
    assert watch.done == 3


def test_a_stage_s_summary_is_written_when_its_end_line_appears(tmp_path: Path) -> None:
    records = JsonlAppender(tmp_path / "records.jsonl")
    stages = JsonlAppender(tmp_path / "stages.jsonl")
    run_dir = RunDir(tmp_path)
    watch = InvocationWatch(PLAN, run_dir, Slo(1.0, 0.1))
    stages.append(PLAN.stage_event(PLAN.stages[0], "stage_start", 5.0))
    records.append_line(record("inv-0", True))
    records.append_line(record("inv-0", False))
    watch.poll()
    assert list(run_dir.summaries()) == []  # not before its end
    stages.append(PLAN.stage_event(PLAN.stages[0], "stage_end", 7.0, requests_done=1, requests_ok=1))
    watch.poll()
    (written,) = run_dir.summaries()
    assert (written.stage_id, written.requests, written.good, written.started_unix_s) == ("inv-0", 1, 1, 5.0)
    assert written.ttft_p50_s == 0.2 and written.arrival == "closed"
    watch.close_stages("the load process ended")  # the second stage never ran
    outcome = watch.outcome()
    assert [(s.stage_id, s.status) for s in outcome.summaries] == [("inv-0", "ok"), ("inv-1", "aborted")]
    assert [s.stage_id for s in run_dir.summaries()] == ["inv-0", "inv-1"]
    assert outcome.busy_s == 2.0


def test_new_lines_keeps_a_torn_last_line_for_later(tmp_path: Path) -> None:
    path = tmp_path / "grow.jsonl"
    path.write_text("a\nb")
    tail = NewLines(tmp_path / "missing")
    assert tail.lines() == []
    lines = NewLines(tmp_path / "grow.jsonl")
    assert lines.lines() == []  # what was there before is not new
    with path.open("a") as handle:
        handle.write("c\nd")
    assert lines.lines() == ["c"]
    with path.open("a") as handle:
        handle.write("\n")
    assert lines.lines() == ["d"]
