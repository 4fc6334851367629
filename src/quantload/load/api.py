"""Running load against a target from plain Python: what `quantload load` and `quantload run` call.

    summaries = run_sweep(target, settings.load, run_dir, run_id, progress, observe=settings.observe)
    summaries = run_open_loop(target, settings.load, run_dir, run_id, progress, observe=settings.observe)
    summaries = run_prefix_cache_experiment(target, settings.load, run_dir, run_id, progress,
                                            observe=settings.observe)

Each call builds a plan (written to `<run_dir>/load-plans/<invocation>.json`), runs it in Locust
processes of its own (`python -m quantload.load.locust_process`: one local process, or a master
and `settings.workers` workers on loopback), which append to `<run_dir>/records.jsonl` and
`<run_dir>/stages.jsonl`, and returns one `StageSummary` per stage computed from those records.
Locust never runs in the caller's process: `import locust` monkey-patches the interpreter.

Robust by construction: every request has a deadline (`request_timeout_s`), every stage a time
bound (`stage_timeout_s`) and a circuit breaker (`max_consecutive_errors` failures in a row end
it as failed, and the stages after it are written as aborted); the whole invocation is bounded
in time, and if the Locust process dies or overruns, it is killed and its unfinished stages are
written as aborted. A dead target therefore costs at most a few failed requests, never a hang.

Progress: `progress(done, total, note)` with measured requests done out of planned, polled from
records.jsonl twice a second.

Grafana: given `observe=` settings with a `grafana_url`, each invocation pushes its own stages as
annotations once they have all ended (quantload.observe.annotations); a Grafana that does not
answer costs one warning line, never the load.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from quantload.childproc import die_with_parent
from quantload.config import LoadSettings, ObserveSettings
from quantload.errors import QuantloadError
from quantload.llamacpp.server import free_port
from quantload.load.plan import (
    LoadPlan,
    TargetInfo,
    open_loop_plan,
    prefix_cache_plan,
    sweep_plan,
)
from quantload.load.prefix import build_system_prompt, erase_slots
from quantload.load.prompts import Prompt, select_prompts
from quantload.load.records import JsonlAppender, StageEvent, iter_records, iter_stage_events
from quantload.load.summary import StageSummary, summarize_stage
from quantload.progress import ProgressCallback, no_progress
from quantload.rundir import LOGS_DIR, RECORDS_JSONL, STAGES_JSONL, write_json_atomic

LOAD_PLANS_DIR = "load-plans"
API_KEY_ENV = "QL_TARGET_API_KEY"  # same name as quantload.load.locust_runtime.API_KEY_ENV
POLL_S = 0.5
STARTUP_ALLOWANCE_S = 120.0
STOP_GRACE_S = 10.0
PREFIX_USER_MAX_TOKENS = 256  # the prompt-cache experiment's user turns stay short beside the prefix


class LoadError(QuantloadError):
    """The load generator could not run (not: the target failed requests)."""


@dataclass(frozen=True)
class Target:
    """A server to load: labels for records and metrics, its base URL, and its API key."""

    name: str
    quant: str
    model: str
    url: str
    api_key: str | None = None

    def info(self) -> TargetInfo:
        return TargetInfo(name=self.name, quant=self.quant, model=self.model, url=self.url)


def _prompts(settings: LoadSettings, prompts: Sequence[Prompt] | None) -> list[Prompt]:
    if prompts is not None:
        return list(prompts)
    return select_prompts(
        settings.prompts,
        settings.prompt_count,
        settings.min_prompt_tokens,
        settings.max_prompt_tokens,
        Path.cwd(),
    )


def _invocation(experiment: str, target: Target) -> str:
    label = "".join(c if c.isalnum() or c in "-_." else "_" for c in target.name)[:40]
    return f"{experiment}-{label}-{uuid.uuid4().hex[:6]}"


def run_sweep(
    target: Target,
    settings: LoadSettings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    prompts: Sequence[Prompt] | None = None,
    *,
    observe: ObserveSettings | None = None,
) -> list[StageSummary]:
    """Closed loop: the prompt set at each of `settings.users`, `settings.repeats` times."""
    plan = sweep_plan(
        settings, target.info(), _prompts(settings, prompts), run_id, _invocation("sweep", target)
    )
    return run_plan(plan, settings, run_dir, target.api_key, progress, observe=observe)


def run_open_loop(
    target: Target,
    settings: LoadSettings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    rates_rps: Sequence[float] | None = None,
    prompts: Sequence[Prompt] | None = None,
    *,
    observe: ObserveSettings | None = None,
) -> list[StageSummary]:
    """Open loop: Poisson arrivals at each rate (default `settings.rates_rps`)."""
    rates = tuple(rates_rps if rates_rps is not None else settings.rates_rps)
    if not rates:
        raise LoadError("no open-loop rate given", "set load.rates_rps, e.g. [0.5, 1, 2]")
    if any(rate <= 0 for rate in rates):
        raise LoadError(f"open-loop rates must be positive, got {list(rates)}")
    plan = open_loop_plan(
        settings,
        target.info(),
        _prompts(settings, prompts),
        run_id,
        _invocation("open_loop", target),
        rates,
    )
    return run_plan(plan, settings, run_dir, target.api_key, progress, observe=observe)


def run_prefix_cache_experiment(
    target: Target,
    settings: LoadSettings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    reset_server: Callable[[], None] | None = None,
    prompts: Sequence[Prompt] | None = None,
    *,
    observe: ObserveSettings | None = None,
) -> list[StageSummary]:
    """Shared system prompt of `settings.prefix_tokens`: cache_prompt off, then on, repeated.

    The user turns after the shared prefix are the selected prompts of at most 256 tokens (all of
    them if none is that short), cycled to `settings.prefix_requests` requests per stage.

    Before it starts, `reset_server` (if given, e.g. a restart) runs, then every slot is erased
    where the server allows it (`POST /slots/{id}?action=erase`, needs --slot-save-path). The
    states measured do not depend on either: "off" sends cache_prompt=false (every prompt token is
    computed), "on" is measured after warm-up requests (one per user) put the prefix in the slots.
    Every stage line states the server state it ran in.
    """
    if settings.prefix_tokens <= 0 or settings.prefix_requests <= 0:
        return []
    text, tokens = build_system_prompt(target.url, settings.prefix_tokens, target.api_key)
    states = []
    if reset_server is not None:
        reset_server()
        states.append("server restarted")
    states.append(erase_slots(target.url, target.api_key))
    states.append(f"prefix primed by {settings.prefix_users} warm-up request(s)")
    candidates = _prompts(settings, prompts)
    short = [p for p in candidates if p.tokens <= PREFIX_USER_MAX_TOKENS] or candidates
    plan = prefix_cache_plan(
        settings,
        target.info(),
        short,
        text,
        tokens,
        run_id,
        _invocation("prefix_cache", target),
        "; ".join(states),
    )
    return run_plan(plan, settings, run_dir, target.api_key, progress, observe=observe)


# ---------------------------------------------------------------- running a plan


def _time_bound_s(plan: LoadPlan) -> float:
    per_stage = sum(2 * stage.timeout_s + plan.abort_grace_s + 60.0 for stage in plan.stages)
    return STARTUP_ALLOWANCE_S + per_stage


def _commands(plan_path: Path, settings: LoadSettings, run_dir: Path) -> list[list[str]]:
    base = [
        sys.executable,
        "-m",
        "quantload.load.locust_process",
        "--metrics-host",
        settings.metrics_host,
    ]
    common = ["--plan", str(plan_path), "--out", str(run_dir)]
    port = settings.metrics_port
    if settings.workers == 0:
        return [[*base, "--role", "local", *common, "--metrics-port", str(port)]]
    master_port = str(free_port())
    commands = [
        [
            *base,
            "--role",
            "master",
            *common,
            "--metrics-port",
            str(port),
            "--master-port",
            master_port,
            "--expect-workers",
            str(settings.workers),
        ]
    ]
    for index in range(settings.workers):
        worker_port = port + 1 + index if port else 0
        commands.append(
            [
                *base,
                "--role",
                "worker",
                "--master-port",
                master_port,
                "--metrics-port",
                str(worker_port),
            ]
        )
    return commands


class _Tail:
    """New complete lines of a growing file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.is_file() else 0
        self._partial = ""

    def lines(self) -> list[str]:
        if not self.path.is_file():
            return []
        with self.path.open(encoding="utf-8") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
            self.offset = handle.tell()
        text = self._partial + chunk
        parts = text.split("\n")
        self._partial = parts.pop()
        return parts


def _stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_GRACE_S)


def run_plan(
    plan: LoadPlan,
    settings: LoadSettings,
    run_dir: Path,
    api_key: str | None = None,
    progress: ProgressCallback = no_progress,
    *,
    observe: ObserveSettings | None = None,
) -> list[StageSummary]:
    """Run a plan in Locust processes and summarize its stages (see the module docstring).

    With `observe.grafana_url` set, the plan's stages then go to Grafana as annotations.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    plan_path = run_dir / LOAD_PLANS_DIR / f"{plan.invocation}.json"
    write_json_atomic(plan_path, plan.model_dump(mode="json"))
    logs = run_dir / LOGS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    if api_key:
        env[API_KEY_ENV] = api_key
    records = _Tail(run_dir / RECORDS_JSONL)
    stages = _Tail(run_dir / STAGES_JSONL)
    prefix = f'"stage_id":"{plan.invocation}-'
    total = plan.total_requests
    processes: list[subprocess.Popen[bytes]] = []
    handles: list[IO[bytes]] = []
    exit_note = ""
    try:
        for index, command in enumerate(_commands(plan_path, settings, run_dir)):
            role = command[command.index("--role") + 1]
            name = f"locust-{plan.invocation}-{role}{index - 1 if role == 'worker' else ''}.log"
            handle: IO[bytes] = (logs / name).open("ab")
            handles.append(handle)
            try:
                processes.append(
                    subprocess.Popen(
                        command,
                        stdout=handle,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=env,
                        preexec_fn=die_with_parent(),
                    )
                )
            except OSError as error:
                raise LoadError(f"cannot start the load process: {error}") from None
        driver = processes[0]
        done, note = 0, "starting"
        progress(0, total, note)
        deadline = time.monotonic() + _time_bound_s(plan)
        while driver.poll() is None:
            if time.monotonic() > deadline:
                exit_note = "load process overran its time bound and was killed"
                break
            done += sum(1 for line in records.lines() if prefix in line and '"warmup":false' in line)
            for line in stages.lines():
                if prefix in line and '"stage_start"' in line:
                    event = StageEvent.from_json_line(line)
                    note = (
                        f"{plan.target.name} {event.experiment}"
                        f" stage {event.stage_index + 1}/{len(plan.stages)}"
                    )
            progress(done, total, note)
            time.sleep(POLL_S)
        else:
            if driver.returncode != 0:
                exit_note = f"load process exited with code {driver.returncode}"
    except KeyboardInterrupt:
        exit_note = "interrupted (Ctrl-C, SIGTERM or SIGHUP)"
        raise
    finally:
        _stop(processes)
        for handle in handles:
            handle.close()
        # every stage of the plan ends with a line, even when the load was interrupted
        _close_stages(plan, run_dir, exit_note or "load process ended before this stage")
    summaries = summarize_invocation(plan, run_dir)
    if observe is not None and observe.grafana_url:
        progress(sum(s.requests_done for s in summaries), total, "annotating stages in Grafana")
        _push_annotations(plan, run_dir, observe)
    progress(sum(s.requests_done for s in summaries), total, "done")
    return summaries


def _push_annotations(plan: LoadPlan, run_dir: Path, observe: ObserveSettings) -> int:
    """This invocation's stages as Grafana annotations; 0 when Grafana is unset or unreachable."""
    # Imported here: grafana-client costs ~0.4 s at import, which no run without Grafana should pay.
    from quantload.observe.annotations import push_invocation_annotations

    return push_invocation_annotations(run_dir / STAGES_JSONL, observe, plan.invocation)


def _close_stages(plan: LoadPlan, run_dir: Path, reason: str) -> None:
    """Write an aborted stage_end for every stage of the plan that has none."""
    ended = {
        event.stage_id
        for event in iter_stage_events(run_dir / STAGES_JSONL)
        if event.event == "stage_end" and event.stage_id.startswith(f"{plan.invocation}-")
    }
    missing = [stage for stage in plan.stages if stage.stage_id not in ended]
    if not missing:
        return
    appender = JsonlAppender(run_dir / STAGES_JSONL)
    try:
        for stage in missing:
            appender.append(
                plan.stage_event(stage, "stage_end", time.time(), status="aborted", reason=reason)
            )
    finally:
        appender.close()


def summarize_invocation(plan: LoadPlan, run_dir: Path) -> list[StageSummary]:
    """One summary per stage of `plan`, from run_dir's records and stage lines."""
    head = f"{plan.invocation}-"
    ends: dict[str, StageEvent] = {}
    for event in iter_stage_events(run_dir / STAGES_JSONL):
        if event.event == "stage_end" and event.stage_id.startswith(head):
            ends[event.stage_id] = event
    records = [r for r in iter_records(run_dir / RECORDS_JSONL) if (r.stage_id or "").startswith(head)]
    return [summarize_stage(ends[s.stage_id], records) for s in plan.stages if s.stage_id in ends]
