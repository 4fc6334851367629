"""The soak experiment: its settings, level, slices and plan (pure); timed stages through the real
stage controller (greenlet users, no Locust); the whole experiment against the fake server in a
process of its own (real Locust processes), with its server's memory read from /proc and its
report section, figure and summary.json entry.

Its tests that start processes: tests/integration/load/test_soak_processes.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import gevent
import pytest

from load_api import context
from quantload.analysis.drift import fit_drift
from quantload.config import Settings, load_config
from quantload.errors import ConfigError
from quantload.experiments import registry
from quantload.experiments.base import ExperimentContext
from quantload.experiments.soak import stages as soak_stages
from quantload.experiments.soak.watch import container_memory_bytes
from quantload.load.in_locust.sinks import DriverSink
from quantload.load.in_locust.stages import StageController
from quantload.load.in_locust.ticket_sources import LocalTickets
from quantload.load.limit_file import LimitLine
from quantload.load.measure import build_record
from quantload.load.metrics import LoadMetrics
from quantload.load.prompts import Prompt
from quantload.load.records import JsonlAppender, RequestRecord, iter_records, iter_stage_events
from quantload.load.stream_result import StreamResult
from quantload.load.tickets import StageTracker, Ticket, TicketBook, stage_tickets
from quantload.load.timed_supply import TimedSupply
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget

TARGET = ServedTarget(name="llama-q4_k_m", quant="Q4_K_M", model="m", url="http://127.0.0.1:1")
POOL = StageRequests.of_prompts([Prompt(f"p{i}", f"prompt {i}", 2) for i in range(3)])


def settings(**soak_keys: Any) -> Settings:
    return Settings.model_validate({"soak": soak_keys, "load": {"warmup_requests": 1}})


# ----------------------------------------------------------------------------- settings and plan


def test_the_soak_runs_only_with_a_duration_and_its_settings_are_bounded(tmp_path: Path) -> None:
    assert soak_stages.missing(Settings()) == "soak.duration_s is 0 (give --duration)"
    planned = [e.name for e in registry.planned(load_config(tmp_path, {}, {"soak.duration_s": 60}).settings)]
    assert planned[-1] == "soak" and "soak" not in [e.name for e in registry.planned(Settings())]
    assert "soak" in registry.for_any_server()  # `quantload load -e soak` may run it
    for bad in ({"soak.duration_s": math.inf}, {"soak.duration_s": 86_401}, {"soak.slice_s": 0.5},
                {"soak.duration_s": 3600, "soak.slice_s": 1}, {"soak.rate_rps": math.nan}):  # fmt: skip
        with pytest.raises(ConfigError):
            load_config(tmp_path, {}, bad)


@pytest.mark.parametrize(("chosen", "warned"), [([], True), (["-e", "sweep"], True), (["-e", "soak"], False)])
def test_a_duration_without_the_soak_is_said(
    chosen: list[str], warned: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from quantload.cli.main import main
    from quantload.stack import run_steps

    asked: list[str] = []

    def stand_in(name: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(name)
        raise ConfigError("stopped before any load")

    monkeypatch.setattr(run_steps, "run_experiment", stand_in)
    argv = ["load", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "out"), "--duration", "2m", *chosen]
    main(argv)
    err = capsys.readouterr().err
    assert ("--duration is read by the soak experiment only: add -e soak" in err) is warned, err
    assert asked == [chosen[-1] if chosen else "sweep"]


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("20m", 1200.0), ("1h", 3600.0), (" 1.5 h", 5400.0)]
)
def test_a_duration_reads_as_people_write_it(text: str, seconds: float) -> None:
    assert soak_stages.duration_text_s(text) == seconds


@pytest.mark.parametrize("text", ["an hour", "-5m", "inf", "nan", "1d"])
def test_a_duration_that_is_none_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ConfigError, match="not a duration"):
        soak_stages.duration_text_s(text)


def test_slices_are_whole_and_the_rest_is_a_slice_unless_it_is_a_sliver() -> None:
    assert soak_stages.slice_lengths(3600, 60) == [60.0] * 60
    assert soak_stages.slice_lengths(150, 60) == [60.0, 60.0, 30.0]
    assert soak_stages.slice_lengths(122, 60) == [60.0, 62.0]  # 2 s is under a tenth of a slice
    assert soak_stages.slice_lengths(30, 60) == [30.0]


def _limit(kind: str, found: float | None, run_id: str = "run-1", variant: str | None = None) -> LimitLine:
    return LimitLine(
        run_id=run_id, server=TARGET.name, quant="Q4_K_M", experiment=kind,  # type: ignore[arg-type]
        kind="users" if kind == "limit_users" else "rate_rps", workload="prompts", slo_ttft_s=1.0,
        slo_tpot_s=0.1, limit=found, ending="found", lowest_miss=None, seconds=1.0,
        sentence="", trials=[], unix_s=1.0, variant=variant,
    )  # fmt: skip


def test_the_level_is_the_set_one_or_the_runs_found_limit_less_the_headroom() -> None:
    assert soak_stages.soak_level(settings(users=6), [], TARGET, "run-1").users == 6
    limits = [_limit("limit_users", 11.0), _limit("limit_users", 40.0, variant="-np 4"),
              _limit("limit_users", 50.0, run_id="older")]  # fmt: skip
    level = soak_stages.soak_level(settings(users=6, from_limit=True), limits, TARGET, "run-1")
    assert (level.users, level.fallback) == (7, None)  # floor(11 x 0.7); variants and other runs left out
    assert "limit_users found 11 users, 30 % kept free" in level.origin
    rate = soak_stages.soak_level(settings(rate_rps=1.0, from_limit=True), [_limit("limit_rate", 4.0)], TARGET, "run-1")
    assert rate.rate_rps == pytest.approx(2.8) and rate.users is None
    none = soak_stages.soak_level(settings(users=3, from_limit=True), [_limit("limit_users", None)], TARGET, "run-1")
    assert none.users == 3 and none.fallback == f"no limit_users search of {TARGET.name} found a limit in this run"


def test_the_plan_is_one_timed_stage_per_slice_warm_ups_in_the_first_only() -> None:
    chosen = settings(duration_s=150, slice_s=60, users=4)
    plan = soak_stages.soak_plan(chosen, TARGET, POOL, soak_stages.SoakLevel(4, None, "soak.users"), "run-1", "soak-x")
    assert [s.duration_s for s in plan.stages] == [60.0, 60.0, 30.0]
    assert [len(s.warmup) for s in plan.stages] == [1, 0, 0]
    assert {(s.experiment, s.users, s.arrival, s.repeat) for s in plan.stages} == {("soak", 4, "closed", 0)}
    assert [s.phase for s in plan.stages] == ["slice 1/3", "slice 2/3", "slice 3/3"]
    assert all(s.timeout_s == s.duration_s + 300.0 + soak_stages.SLICE_MARGIN_S for s in plan.stages)
    assert all(len(s.requests) == 3 and s.warning is None for s in plan.stages)  # the pool, not an hour's worth
    opened = soak_stages.soak_plan(chosen, TARGET, POOL, soak_stages.SoakLevel(None, 2.5, "soak.rate_rps"), "run-1", "soak-y")
    assert {(s.arrival, s.rate_rps, s.users) for s in opened.stages} == {("poisson", 2.5, 64)}
    assert all(r.offset_s is None for s in opened.stages for r in s.requests)  # scheduled as the slice runs


# ----------------------------------------------------------------------------- timed supply


def _book_and_pool(count: int = 3) -> tuple[TicketBook[Any], list[Any], StageTracker]:
    plan = soak_stages.soak_plan(settings(duration_s=10, slice_s=10), TARGET, POOL,
                          soak_stages.SoakLevel(2, None, ""), "run-1", "soak-z")  # fmt: skip
    handed: list[Any] = []
    book: TicketBook[Any] = TicketBook(lambda waiter, ticket: handed.append(ticket))
    return book, stage_tickets(plan, plan.stages[0], warmup=False), StageTracker("soak-z-0", 0, False, 5)


def test_closed_loop_the_pool_comes_again_until_the_time_is_up_then_only_the_handed_out_count() -> None:
    book, pool, tracker = _book_and_pool()
    supply = TimedSupply(book, pool, tracker, users=2, starts_at_s=0.0, ends_at_s=10.0)
    supply.tick(0.0)
    assert (book.pending, tracker.planned) == (3, 3)
    book.want("u1"), book.want("u2")  # two users take a ticket each: one left, under two users
    supply.tick(1.0)
    assert (book.pending, tracker.planned) == (4, 6)
    seqs = [t.seq for t in book._tickets]
    assert len(set(seqs)) == len(seqs)  # refills get fresh sequence numbers
    book.want("u3")
    supply.tick(10.0)
    assert not supply.running and book.pending == 0 and tracker.planned == 3  # the three handed out
    book.put_back(pool[0])  # a worker's user had gone: the ticket comes back after the stop
    supply.tick(11.0)
    assert book.pending == 0 and tracker.planned == 2  # dropped, and not counted: it was never sent


def test_open_loop_poisson_arrivals_are_scheduled_ahead_and_never_at_or_after_the_end() -> None:
    book, pool, tracker = _book_and_pool()
    supply = TimedSupply(book, pool, tracker, users=64, starts_at_s=100.0, ends_at_s=110.0, rate_rps=20.0, seed=3)
    for now in range(100, 112):
        supply.tick(float(now))
    due = [t.intended_unix_s for t in book._tickets]
    assert not supply.running and tracker.planned == len(due) == book.pending  # nothing dropped
    assert all(100.0 <= d < 110.0 for d in due) and due == sorted(due)
    assert 120 <= len(due) <= 280  # about 20/s for 10 s
    assert [t.prompt_id for t in list(book._tickets)[:4]] == ["p0", "p1", "p2", "p0"]


def finished(ticket: Ticket) -> RequestRecord:
    """A stream of two tokens, as a user records it."""
    result = StreamResult(
        sent_unix_s=1.0, sent_perf_s=0.0, status=200, ttfb_s=0.001, content_times_s=[0.01, 0.02], end_s=0.03,
        done_seen=True, finish_reason="length", usage={"completion_tokens": 2, "prompt_tokens": 3},
    )  # fmt: skip
    return build_record(ticket, result, 0.0, "h:1")


class GreenletRunner:
    """Quacks like a Locust local runner: `start` keeps `user_count` greenlet users taking tickets,
    each request taking 10 ms."""

    def __init__(self, tickets: LocalTickets, sink: DriverSink) -> None:
        self.tickets, self.sink = tickets, sink
        self.users: list[gevent.Greenlet] = []

    @property
    def user_count(self) -> int:
        return len(self.users)

    def start(self, users: int, spawn_rate: float) -> None:
        while len(self.users) < users:
            self.users.append(gevent.spawn(self._user))

    def _user(self) -> None:
        while (ticket := self.tickets.take()) is not None:
            gevent.sleep(0.01)
            self.sink.put(finished(ticket))

    def quit(self) -> None:
        gevent.killall(self.users)


class StatsCounter:
    def __init__(self) -> None:
        self.resets = 0

    def reset_all(self) -> None:
        self.resets += 1


class TimedEnvironment:
    def __init__(self) -> None:
        self.runner: Any = None
        self.stats = StatsCounter()


def test_timed_stages_run_for_their_time_and_say_what_they_sent(tmp_path: Path) -> None:
    chosen = settings(duration_s=3, slice_s=1, users=2)
    plan = soak_stages.soak_plan(chosen, TARGET, POOL, soak_stages.SoakLevel(2, None, "soak.users"), "run-1", "inv")
    tickets = LocalTickets()
    sink = DriverSink(JsonlAppender(tmp_path / "records.jsonl"))
    environment = TimedEnvironment()
    environment.runner = GreenletRunner(tickets, sink)
    controller = StageController(
        environment, plan, tickets.book, sink, JsonlAppender(tmp_path / "stages.jsonl"), LoadMetrics()  # type: ignore[arg-type]
    )
    gevent.spawn(controller.run).join(timeout=30)
    ends = [e for e in iter_stage_events(tmp_path / "stages.jsonl") if e.event == "stage_end"]
    starts = [e for e in iter_stage_events(tmp_path / "stages.jsonl") if e.event == "stage_start"]
    records = [r for r in iter_records(tmp_path / "records.jsonl") if not r.warmup]
    assert [e.status for e in ends] == ["ok"] * 3 and environment.stats.resets == 3
    for start, end in zip(starts, ends, strict=True):
        mine = [r for r in records if r.stage_id == end.stage_id]
        assert end.requests_planned == end.requests_done == len(mine) > 3  # the pool came again
        assert end.unix_s - start.unix_s >= 1.0
    assert sum(r.warmup for r in iter_records(tmp_path / "records.jsonl")) == 1


# ----------------------------------------------------------------------------- readings and drift


def test_a_containers_memory_is_its_usage_less_inactive_file_pages() -> None:
    v2 = {"memory_stats": {"usage": 900, "stats": {"inactive_file": 300}}}
    v1 = {"memory_stats": {"usage": 900, "stats": {"total_inactive_file": 100}}}
    assert container_memory_bytes(v2) == 600 and container_memory_bytes(v1) == 800
    assert container_memory_bytes({"memory_stats": {}}) is None  # a stopped container
    assert container_memory_bytes({"memory_stats": {"usage": 50, "stats": {"inactive_file": 80}}}) == 50


def test_drift_finds_a_slope_beyond_noise_and_none_in_noise_alone() -> None:
    times = [i * 60.0 for i in range(60)]
    growing = [100e6 + 2e6 * (t / 3600) + (1e4 if i % 2 else -1e4) for i, t in enumerate(times)]
    found = fit_drift("server memory", times, growing)
    assert found.beyond_noise and found.slope_per_h == pytest.approx(2e6, rel=0.01)
    assert found.ci_low_per_h is not None and found.ci_low_per_h > 0 and found.points == 60
    noisy = [0.2 + (0.01 if (i * 7) % 3 == 0 else -0.005) for i in range(60)]
    assert fit_drift("TTFT p99", times, noisy).beyond_noise is False
    assert fit_drift("TTFT p99", times[:2], noisy[:2]).beyond_noise is None  # too few
    flat = fit_drift("load client memory", times, [5e7] * 60)
    assert (flat.slope_per_h, flat.beyond_noise) == (0.0, False)
    assert fit_drift("x", times[:4], [1.0, None, float("nan"), 2.0]).points == 2


def test_a_container_the_engine_cannot_be_reached_for_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    run = context(tmp_path, soak={"duration_s": 10, "server_container": "llama-q4-k-m"})
    run = type(run)(**{**run.__dict__, "environ": {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}})
    probe, why = soak_stages.memory_probe(ExperimentContext(run, TARGET, None))
    assert probe is None and why is not None and "cannot reach the Docker engine" in why


def test_a_reading_that_cannot_be_taken_says_why_in_its_line(tmp_path: Path) -> None:
    import httpx

    from quantload.experiments.soak.watch import ProcMemory, SoakLine, SoakWatch

    start = SoakLine(event="soak_start", unix_s=1.0, run_id="r", invocation="soak-x", server="s", quant="Q")
    watch = SoakWatch(tmp_path / "soak.jsonl", start, TARGET, ProcMemory(2**22 + 12345), 1.0)
    with httpx.Client(timeout=1.0) as client:
        line = watch.reading(client)
    assert line.server_rss_bytes is None and line.kv_cells_used is None
    assert line.errors[0].startswith("memory: /proc/") and "the server process is gone?" in line.errors[0]
    assert line.errors[1].startswith("/slots: ConnectError")


def test_a_torn_soak_line_is_counted_and_the_slices_are_still_shown(tmp_path: Path) -> None:
    from quantload.analysis.capacity_plan import plan_from_run, plan_view
    from quantload.analysis.report_input import ReportInput
    from quantload.analysis.run_data import load_run
    from quantload.analysis.stage_tables import stage_table
    from quantload.config import PlanSettings
    from quantload.experiments.soak.findings import soak_findings
    from quantload.slo import Slo

    start = {"schema": "quantload.soak/1", "event": "soak_start", "unix_s": 1.0, "run_id": "r",
             "invocation": "soak-x", "server": "s", "quant": "Q4_K_M", "users": 2, "slices": 3}  # fmt: skip
    (tmp_path / "soak.jsonl").write_text(json.dumps(start) + '\n{"schema": "quantload.soak/1", "ev\n')
    run = load_run(tmp_path)
    slo, stages = Slo(1.0, 0.1), stage_table(run, Slo(1.0, 0.1))
    plan = plan_from_run(run, (), plan_view(**PlanSettings().model_dump()), slo.ttft_s, slo.tpot_s, stages)
    view = soak_findings(ReportInput(run, stages, slo, (), plan))
    assert view.notes == (
        "1 line of soak.jsonl could not be read (torn, foreign or damaged: line 2) and were left out",
    )
    (only,) = view.runs
    assert only.level == "2 users" and only.slices.empty
    assert [g.what for g in view.gaps] == ["every slice during the soak of Q4_K_M"]


def test_a_memory_that_grew_and_stopped_is_told_from_one_still_growing() -> None:
    import pandas as pd

    from quantload.experiments.soak.chapter import trend_sentence
    from quantload.experiments.soak.tables import SLICE_COLUMNS, SoakRun, drifts

    def run_of(server_mib: list[float]) -> SoakRun:
        rows = [dict.fromkeys(SLICE_COLUMNS) | {"slice": i + 1, "status": "ok", "mid_unix_s": 300.0 * i,
                "server_rss_bytes": mib * 2**20, "ttft_p99_s": 0.2, "client_rss_bytes": 7e7}
                for i, mib in enumerate(server_mib)]  # fmt: skip
        slices = pd.DataFrame(rows, columns=list(SLICE_COLUMNS))
        return SoakRun("s", "Q4_K_M", "soak-x", "4 users", "soak.users", 3600.0, 300.0, 12, "proc", None,
                       slices, pd.DataFrame(), drifts(slices, 1), 1)  # fmt: skip

    filled = run_of([900, 920, 940, 960, 970, 970, 970, 970, 970, 970, 970, 970])
    assert trend_sentence(filled, "server memory").endswith("but not beyond noise in its second half: it stopped.")
    leaking = run_of([900 + 5 * i + (0.3 if i % 2 else -0.3) for i in range(12)])
    assert "Server memory: still drifting in the second half, +6" in trend_sentence(leaking, "server memory")
    assert trend_sentence(filled, "TTFT p99") == "TTFT p99: no drift beyond noise."
