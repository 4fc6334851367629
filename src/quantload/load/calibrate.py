"""`quantload calibrate`: how far this machine's load client can be trusted, measured here.

It starts the fake server of known timing (`quantload.load.fakeserver`) in a process of its own on
loopback and drives it with the same client `quantload load` uses (a plan run by the supervisor in
Locust processes, `load.workers` and the other [load] settings as configured), one closed-loop
stage per stream count, in rising order. The fake reports what it scripted and when it really sent
the first token, so every request's error is exact:

- TTFT error: measured TTFT minus the TTFT the fake really delivered (its scripted TTFT, plus the
  time it took to read the request and its lateness in sending the first token, both of which it
  reports). The client's own error: reading and stamping the answer.
- TTFT error against the script: the same without taking the fake's lateness out (an upper bound).
- ITL error: every measured gap between content chunks minus the scripted gap (the fake's own
  lateness per token is not taken out, so this bounds the client's from above).

A stream count is measured right when every request succeeded and both TTFT error p99 and ITL
error p99 are within `calibrate.max_error_p99_s` (5 ms unless configured); the answer is the
largest count up to which every count was measured right. Client CPU is every load process's CPU
time during the stage, as a share of one core per 100 streams.

Across hosts: `quantload calibrate --serve-fake HOST:PORT` serves the same fake on one host and
`calibrate.fake_url` (`--fake-url`) makes the client on another drive it instead of a loopback
one; the client checks the fake's script first (`GET /script`). Its errors then include the
network's: the fake's receive time is its host's clock, so the request's way there is taken out
(as far as the two clocks agree) and the first token's way back stays in.

The result is also written as JSON (schema quantload.calibration/1) to
`<out>/calibration-<UTC time>.json`, and copied to `<out>/latest.json`, so a report can link the
machine's latest calibration; `<out>` defaults to `<run.out>/calibration`.

Every load then holds its stages to it (`machine_limits`): the error its figures are stated within
(`max_error_p99_s`) and the streams one load process measured right here; a stage that held more
streams per process, or whose event loop woke later than that error, says so (degraded), and
`load.workers = "auto"` spreads a plan over workers above that many streams when the cores allow.
"""

from __future__ import annotations

__all__ = ["calibration_script", "fake_delay_s", "run_calibration"]

import dataclasses
import json
import os
import platform
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import httpx

from quantload import http_errors
from quantload.config import CalibrateSettings, LoadSettings, Settings
from quantload.errors import QuantloadError
from quantload.load.calibration_file import Calibration, CountResult, trusted_streams
from quantload.load.fakeserver import FakeScript, FakeServerProcess
from quantload.load.plan import LoadPlan, PlannedRequest, assemble_plan, stage_plan
from quantload.load.processes import choose_workers, usable_cores
from quantload.load.records import RequestRecord, StageEvent
from quantload.load.summary import StageSummary
from quantload.load.supervisor import run_plan
from quantload.load.workloads import StageRequests
from quantload.progress import ProgressCallback, no_progress
from quantload.run_context import RunContext
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget
from quantload.stats import percentile

SCRIPT = FakeScript(ttft_ms=(20.0, 200.0), itl_ms=(5.0, 20.0), tokens=16, seed=7, pathological=True)
MEAN_REQUEST_S = (sum(SCRIPT.ttft_ms) / 2 + (SCRIPT.tokens - 1) * sum(SCRIPT.itl_ms) / 2) / 1000
MIN_REQUESTS_PER_STREAM = 2
MIN_REQUESTS = 50
STAGE_TIMEOUT_FACTOR = 10.0
REQUEST_TIMEOUT_S = 30.0


class CalibrationError(QuantloadError):
    """The calibration could not measure (the fake or the client failed)."""


class CalibrationFake(Protocol):
    """The fake a calibration streams from: where it is, and its counters."""

    @property
    def url(self) -> str: ...

    def stats(self, reset: bool = False) -> dict[str, Any]: ...


def calibration_script(settings: CalibrateSettings) -> FakeScript:
    """The script every calibration fake runs (connections closed after each stream or not)."""
    return dataclasses.replace(SCRIPT, close_after_stream=settings.server_closes_connections)


class RemoteFake:
    """A calibration fake already serving elsewhere (`quantload calibrate --serve-fake`)."""

    def __init__(self, url: str, script: FakeScript, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.script = script
        self.timeout_s = timeout_s

    def _get(self, path: str) -> Any:
        try:
            answer = httpx.get(f"{self.url}{path}", timeout=self.timeout_s)
            answer.raise_for_status()
            return answer.json()
        except (httpx.HTTPError, ValueError) as error:
            raise CalibrationError(
                f"the calibration fake at {self.url} did not answer {path}: {http_errors.said(error)}",
                "start it on that host with `quantload calibrate --serve-fake HOST:PORT`",
            ) from None

    def check(self) -> RemoteFake:
        """CalibrationError unless the fake answers and runs this calibration's script."""
        running = self._get("/script")
        wanted = json.loads(json.dumps(dataclasses.asdict(self.script)))
        differs = sorted(key for key, value in wanted.items() if running.get(key) != value)
        if differs:
            hint = "start it with `quantload calibrate --serve-fake HOST:PORT` of this version"
            if differs == ["close_after_stream"]:
                hint = "give --keep-alive to both commands, or to neither"
            raise CalibrationError(
                f"the fake at {self.url} runs another script ({', '.join(differs)} differ)", hint
            )
        return self

    def stats(self, reset: bool = False) -> dict[str, Any]:
        answer: dict[str, Any] = self._get("/stats?reset=1" if reset else "/stats")
        return answer


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def requests_for(streams: int, seconds: float) -> int:
    """Enough requests to keep `streams` busy for about `seconds` (at least 50, two per stream)."""
    return max(MIN_REQUESTS, MIN_REQUESTS_PER_STREAM * streams, round(seconds * streams / MEAN_REQUEST_S))


def fake_delay_s(sent_unix_s: float, timings: dict[str, float]) -> float:
    """How much of a request's TTFT the fake itself added beyond its script: the time it took to
    read the request (its `request_received_unix_s` against the client's send) and its lateness
    in sending the first token (`first_token_late_ms`)."""
    late_s = timings.get("first_token_late_ms", 0.0) / 1000
    received = timings.get("request_received_unix_s")
    read_s = max(received - sent_unix_s, 0.0) if received is not None else 0.0
    return late_s + read_s


def count_result(
    streams: int,
    workers: int,
    records: list[RequestRecord],
    end: StageEvent | None,
    summary: StageSummary | None,
    server_late_p99_ms: float | None,
    max_error_p99_s: float,
) -> CountResult:
    """The errors of one stage's records against what the fake scripted and reported."""
    measured = [r for r in records if not r.warmup]
    ttft_own: list[float] = []
    ttft_script: list[float] = []
    itl: list[float] = []
    for record in measured:
        timings = record.timings or {}
        if not record.ok or record.ttft_s is None or "prompt_ms" not in timings:
            continue
        against_script = record.ttft_s - timings["prompt_ms"] / 1000
        ttft_script.append(against_script)
        ttft_own.append(against_script - fake_delay_s(record.sent_unix_s, timings))
        gap_s = timings.get("predicted_per_token_ms", 0.0) / 1000
        itl.extend(gap - gap_s for gap in record.itl_s or ())
    ok = sum(1 for r in measured if r.ok)
    total_cpu = end.client_cpu_total_frac if end is not None else None
    ttft_p99, itl_p99 = percentile(ttft_own, 99), percentile(itl, 99)
    within = (
        bool(measured)
        and ok == len(measured)
        and ttft_p99 is not None
        and ttft_p99 <= max_error_p99_s
        and (itl_p99 is None or itl_p99 <= max_error_p99_s)
    )
    return CountResult(
        streams=streams,
        workers=workers,
        requests=len(measured),
        ok=ok,
        ttft_error_p50_s=percentile(ttft_own, 50),
        ttft_error_p99_s=ttft_p99,
        ttft_error_vs_script_p99_s=percentile(ttft_script, 99),
        itl_error_p50_s=percentile(itl, 50),
        itl_error_p99_s=itl_p99,
        server_token_late_p99_s=None if server_late_p99_ms is None else server_late_p99_ms / 1000,
        delivered_concurrency=summary.delivered_concurrency if summary is not None else None,
        client_cpu_frac=total_cpu,
        client_cpu_per_100_streams=None if total_cpu is None else total_cpu * 100 / streams,
        within_error=within,
        loop_lag_p99_s=end.loop_lag_p99_s if end is not None else None,
    )


def _count_settings(load: LoadSettings, streams: int, seconds: float) -> LoadSettings:
    """The user's [load] settings, shaped into one closed-loop stage of `streams` users."""
    return load.model_copy(
        update={
            "users": (streams,),
            "repeats": 1,
            "warmup_requests": 0,
            "max_tokens": SCRIPT.tokens,
            "ignore_eos": False,
            "cache_prompt": False,
            "first_round_jitter_s": MEAN_REQUEST_S,
            "request_timeout_s": REQUEST_TIMEOUT_S,
            "stage_timeout_s": STAGE_TIMEOUT_FACTOR * (seconds + MEAN_REQUEST_S) + 30.0,
            "metrics_port": 0,
            "max_consecutive_errors": max(load.max_consecutive_errors, 50),
        }
    )


def _count_plan(settings: LoadSettings, target: ServedTarget, requests: int, streams: int) -> LoadPlan:
    """One closed-loop stage of `streams` users sending `requests` short prompts."""
    drawn = StageRequests(
        tuple(PlannedRequest(prompt_id=f"c{i}") for i in range(requests)),
        {f"c{i}": f"calibration request {i}" for i in range(requests)},
        "prompts",
    )
    invocation = f"calibrate-{streams}"
    stage = stage_plan(settings, invocation, 0, "sweep", streams, drawn)
    return assemble_plan(settings, target, "calibration", invocation, [drawn], [stage])


def _measure_count(
    fake: CalibrationFake,
    load: LoadSettings,
    streams: int,
    seconds: float,
    work_dir: Path,
    max_error_p99_s: float,
    progress: ProgressCallback,
) -> CountResult:
    requests = requests_for(streams, seconds)
    settings = _count_settings(load, streams, seconds)
    workers = choose_workers(settings.workers, streams, usable_cores()).workers
    target = ServedTarget(name="calibration-fake", quant="none", model="fake", url=fake.url)
    run_dir = work_dir / f"streams-{streams}"
    plan = _count_plan(settings, target, requests, streams)
    fake.stats(reset=True)
    context = RunContext(RunDir(run_dir), "calibration", Settings(load=settings), progress)
    summaries = run_plan(plan, context).summaries
    late = fake.stats(reset=True)["token_late_ms"]["p99"]
    records = list(context.run_dir.records())
    ends = [e for e in context.run_dir.stage_events() if e.event == "stage_end"]
    end = ends[0] if ends else None
    if end is not None and end.status != "ok":
        raise CalibrationError(
            f"calibration at {streams} streams did not complete: {end.reason}",
            f"see the load process log in {run_dir / 'logs'}",
        )
    return count_result(
        streams,
        workers,
        records,
        end,
        summaries[0] if summaries else None,
        late,
        max_error_p99_s,
    )


class _Overall:
    """One stage's progress as part of the whole calibration's."""

    def __init__(self, progress: ProgressCallback, before: int, total: int) -> None:
        self.progress = progress
        self.before = before
        self.total = total

    def __call__(self, completed: float, total: float | None, note: str = "") -> None:
        self.progress(self.before + completed, self.total, note)


def run_calibration(
    settings: CalibrateSettings,
    load: LoadSettings,
    progress: ProgressCallback = no_progress,
    work_dir: Path | None = None,
) -> Calibration:
    """Measure the client at each of `settings.streams` (see the module docstring).

    `progress` counts requests over all stream counts; `work_dir` keeps the load's records and
    logs (default: a temporary folder, removed afterwards).
    """
    load_before = _load_average()
    script = calibration_script(settings)
    total = sum(requests_for(streams, settings.seconds_per_count) for streams in settings.streams)
    finished = 0
    counts: list[CountResult] = []
    with tempfile.TemporaryDirectory(prefix="quantload-calibrate-") as scratch:
        folder = work_dir or Path(scratch)
        local: FakeServerProcess | None = None
        fake: CalibrationFake
        if settings.fake_url:
            fake = RemoteFake(settings.fake_url, script).check()
        else:
            try:
                fake = local = FakeServerProcess(script).start()
            except RuntimeError as error:
                raise CalibrationError(
                    f"{error}", "is python -m quantload.load.fakeserver runnable?"
                ) from None
        try:
            for streams in settings.streams:
                result = _measure_count(
                    fake, load, streams, settings.seconds_per_count, folder,
                    settings.max_error_p99_s, _Overall(progress, finished, total),
                )  # fmt: skip
                counts.append(result)
                finished += result.requests
            progress(finished, total, "done")
        finally:
            if local is not None:
                local.stop()
    done = tuple(counts)
    return Calibration(
        created_unix_s=time.time(),
        host=socket.gethostname(),
        cores=usable_cores(),
        python=platform.python_version(),
        load_average_before=load_before,
        load_average_after=_load_average(),
        fake_ttft_ms=script.ttft_ms,
        fake_itl_ms=script.itl_ms,
        fake_tokens=script.tokens,
        fake_closes_connections=script.close_after_stream,
        fake_url=settings.fake_url,
        max_error_p99_s=settings.max_error_p99_s,
        counts=done,
        trusted_streams=trusted_streams(done),
    )


