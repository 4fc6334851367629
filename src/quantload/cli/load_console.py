"""What `quantload load` says on the console: the stage table, the limit lines, the master's and
the remote workers' lines, and each failure once, after the table."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from quantload.cli.context import CliContext
from quantload.config import LoadSettings
from quantload.errors import ConfigError
from quantload.load.processes import master_listen_port
from quantload.load.summary import StageSummary
from quantload.stack.run_driver import ExperimentOutcome
from quantload.urls import listen_problem

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _stage(s: StageSummary) -> str:
    load = f"{s.rate_rps:g}/s" if s.rate_rps is not None else f"{s.users}u"
    phase = f" {s.phase}" if s.phase else ""
    return f"{s.experiment}{phase} {load} #{s.repeat} cache {'on' if s.cache_prompt else 'off'}"


def _level(s: StageSummary) -> str:
    if s.level_outcome is None:
        return "-"
    busy = " (busy machine)" if s.machine_busy and s.level_outcome == "misses" else ""
    return f"{s.level_outcome}{busy} after {s.level_requests}"


def stage_table(summaries: Sequence[StageSummary]) -> Table:
    """One row per stage."""
    table = Table(
        "target", "stage", "status", "ok", "TTFT p50/p99 ms", "TPOT ms", "tok/s", "conc.", "client", "level",
        title="quantload load: one row per stage (level: its level's SLO verdict when the stage ended)",
    )  # fmt: skip
    for s in summaries:
        client = s.client_trust or (
            "saturated" if s.client_saturated else ("ok" if s.client_saturated is False else "-")
        )
        table.add_row(
            f"{s.server} {s.quant}",
            _stage(s),
            s.status if not s.reason else f"{s.status}: {s.reason[:60]}",
            f"{s.ok}/{s.requests_planned}",
            f"{_ms(s.ttft_p50_s)}/{_ms(s.ttft_p99_s)}",
            _ms(s.tpot_p50_s),
            "-" if s.output_tok_s is None else f"{s.output_tok_s:.1f}",
            "-" if s.delivered_concurrency is None else f"{s.delivered_concurrency:.2f}",
            client,
            _level(s),
        )
    return table


def remote_worker_lines(load: LoadSettings) -> list[str]:
    """What the console says about workers joining from other hosts (nothing without any)."""
    if not load.remote_workers:
        return []
    port = master_listen_port(load.master_host, load.master_port, load.remote_workers)
    lines = [
        f"the Locust master waits for {load.remote_workers} worker(s) from other hosts on"
        f" {load.master_host}:{port} (on each: quantload load-worker --master-host <this host>"
        f" --master-port {port})"
    ]
    if load.master_host in LOOPBACK:
        lines.append(
            f"warning: the master listens on {load.master_host}, which other hosts cannot reach"
            " (give --master-host this host's address, or 0.0.0.0)"
        )
    return lines


def master_lines(load: LoadSettings, workers: int, host_flag: str | None, port_flag: int | None) -> list[str]:
    """Warnings on the master's address flags where no worker joins a master (nothing reads them);
    ConfigError, before any process starts, where workers will join one this machine cannot listen
    on."""
    if load.remote_workers == 0 and workers == 0:
        flags = (("--master-host", host_flag), ("--master-port", port_flag))
        given = [flag for flag, value in flags if value]
        if given:
            return [
                f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} read only when workers join a"
                " master (--remote-workers N for workers on other hosts, or load.workers): this load"
                " runs in one process"
            ]
        return []
    problem = listen_problem(load.master_host)
    if problem is not None:
        raise ConfigError(
            f"load.master_host: the Locust master cannot listen on {load.master_host}: {problem}",
            "give an address of this host (ip addr), or 0.0.0.0 for every one",
        )
    return []


def show_stages(
    cli: CliContext, summaries: Sequence[StageSummary], outcomes: Sequence[ExperimentOutcome]
) -> None:
    """The stage table and each limit search's sentence on stdout."""
    cli.console.print(stage_table(summaries))
    for outcome in outcomes:
        found = outcome.run.limit if outcome.run is not None else None
        if found is not None:
            label = f"{found.server} {found.quant} ({found.kind})"
            cli.console.print(f"limit search {label}: {found.sentence}")


def say_stage_warnings(cli: CliContext, summaries: Sequence[StageSummary]) -> None:
    """Every stage that did not end ok (the table cuts reasons short: each distinct one in full,
    once), and the stages the load client may have measured worse than stated."""
    for reason in dict.fromkeys(f"{s.status}: {s.reason}" for s in summaries if s.status != "ok"):
        cli.err_console.print(f"stage {reason}", highlight=False, soft_wrap=True)
    saturated = [s for s in summaries if s.client_saturated]
    if saturated:
        cli.err_console.print(
            f"warning: the load generator may have been the bottleneck in {len(saturated)}"
            " stage(s) (client column): its numbers include client delay"
        )
    degraded = [s for s in summaries if s.client_trust == "degraded"]
    for why in dict.fromkeys(s.client_trust_why or "" for s in degraded):
        count = sum(1 for s in degraded if (s.client_trust_why or "") == why)
        cli.err_console.print(
            f"warning: {count} stage(s) (client column: degraded) may be measured worse than"
            f" stated: {why}", highlight=False, soft_wrap=True,
        )  # fmt: skip


def say_failures(
    cli: CliContext, load: LoadSettings, outcomes: Sequence[ExperimentOutcome], workers_missing: str | None
) -> None:
    """Each failure once: servers that stopped answering, workers that did not join, and
    experiments that measured nothing (a failed stage is said by its `stage` line)."""
    for outcome in outcomes:
        if outcome.unreachable:
            cli.err_console.print(
                f"error: {_labelled(outcome)}; the server's remaining experiments were not run"
            )
    if workers_missing:
        cli.err_console.print(
            f"error: the Locust workers did not join ({workers_missing}); the remaining experiments"
            f" were not run{_workers_hint(load)}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    for outcome in outcomes:
        unmeasured = outcome.run is None or outcome.run.limit is not None
        if outcome.failure is not None and not outcome.unreachable and unmeasured:
            cli.err_console.print(f"error: {_labelled(outcome)}", highlight=False, soft_wrap=True)


def _labelled(outcome: ExperimentOutcome) -> str:
    target = outcome.target
    return f"{target.name} ({target.quant}) {outcome.experiment}: {outcome.failure}"


def _workers_hint(load: LoadSettings) -> str:
    if not load.remote_workers:
        return ""
    port = master_listen_port(load.master_host, load.master_port, load.remote_workers)
    return (
        f" (start `quantload load-worker --master-host <this host> --master-port {port}` on each"
        f" load host, and let them reach {load.master_host}:{port})"
    )
