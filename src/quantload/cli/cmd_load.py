"""`quantload load`: stream load at running servers, headless, and summarize every stage."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import SecretStr
from rich.table import Table

from quantload.cli.context import cli_context
from quantload.cli.exclusive_option import EXCLUSIVE, quiet_before
from quantload.cli.progress_view import progress_bar
from quantload.cli.slo_options import (
    CONFIDENCE,
    SLO_TPOT,
    SLO_TPOT_PERCENTILE,
    SLO_TTFT,
    SLO_TTFT_PERCENTILE,
    slo_flags,
)
from quantload.config import LoadSettings
from quantload.errors import ConfigError, ServerError
from quantload.experiments import registry
from quantload.experiments.soak import NAME as SOAK
from quantload.experiments.soak import duration_text_s
from quantload.load.calibration_file import machine_limits
from quantload.load.processes import choose_workers, master_listen_port, usable_cores, workers_absent
from quantload.load.summary import StageSummary
from quantload.load.workload_builder import ignored_flags
from quantload.paths import check_out_dir
from quantload.run_context import RunContext
from quantload.rundir import make_run_id
from quantload.rundir.config_file import write_load_config
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget
from quantload.steps.load import run_experiment
from quantload.steps.serve import watch_idle
from quantload.urls import listen_problem

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _numbers(text: str | None, kind: type[int] | type[float]) -> list[Any] | None:
    if text is None:
        return None
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"not a comma list of numbers: {text!r}", "e.g. 1,2,4,8") from None


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


def _table(summaries: list[StageSummary]) -> Table:
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


def register(app: typer.Typer) -> None:
    """Add the `load` command."""

    @app.command("load")
    def load(
        ctx: typer.Context,
        url: Annotated[list[str], typer.Option("--url", help="Server base URL; repeat for several.")],
        out: Annotated[Path, typer.Option("--out", help="Folder for records.jsonl, stages.jsonl.")],
        name: Annotated[list[str] | None, typer.Option("--name", help="Server label, per --url.")] = None,
        quant: Annotated[list[str] | None, typer.Option("--quant", help="Quant label, per --url.")] = None,
        model: Annotated[str, typer.Option(help="Model name sent in requests.")] = "",
        experiment: Annotated[
            list[str] | None,
            typer.Option(
                "--experiment",
                "-e",
                help=f"One of {', '.join(registry.for_any_server())}; repeatable.",
            ),
        ] = None,
        workload: Annotated[
            str | None,
            typer.Option(
                help="What sweep, open loop and limit search send:"
                " prompts, lengths, dataset, sessions, trace."
            ),
        ] = None,
        input_lengths: Annotated[
            str | None, typer.Option(help="Prompt tokens per request, e.g. lognormal:mean=300,spread=0.6.")
        ] = None,
        output_lengths: Annotated[
            str | None, typer.Option(help="max_tokens per request, e.g. fixed:128.")
        ] = None,
        dataset: Annotated[
            str | None, typer.Option(help="ShareGPT JSON or JSONL for the dataset workload.")
        ] = None,
        trace: Annotated[str | None, typer.Option(help="JSONL trace to replay (trace experiment).")] = None,
        speed: Annotated[
            float | None, typer.Option(help="Trace replay speed factor (2 = twice as fast).")
        ] = None,
        turns: Annotated[int | None, typer.Option(help="Turns per conversation (sessions).")] = None,
        sessions: Annotated[int | None, typer.Option(help="Conversations per sessions stage.")] = None,
        think_time: Annotated[float | None, typer.Option(help="Mean think time between turns, s.")] = None,
        affinity: Annotated[
            str | None, typer.Option(help="Session slot affinity: none (server's -sps) or id_slot.")
        ] = None,
        batch_sizes: Annotated[
            str | None, typer.Option(help="Mixed experiment -b/-ub pairs, e.g. 2048/512,256/256.")
        ] = None,
        time_cap: Annotated[float | None, typer.Option(help="Limit search time cap per search, s.")] = None,
        max_users: Annotated[int | None, typer.Option(help="Limit search: most users to try.")] = None,
        duration: Annotated[
            str | None, typer.Option(help="Soak length (-e soak), e.g. 1h, 20m, 90s.")
        ] = None,
        users: Annotated[str | None, typer.Option(help="Closed-loop users, e.g. 1,2,4,8.")] = None,
        repeats: Annotated[int | None, typer.Option(help="Repeats of each stage.")] = None,
        rates: Annotated[str | None, typer.Option(help="Open-loop rates in requests/s, e.g. 0.5,1.")] = None,
        prompts: Annotated[str | None, typer.Option(help="builtin, a ShareGPT JSON or a JSONL.")] = None,
        prompt_count: Annotated[int | None, typer.Option(help="Prompts per stage.")] = None,
        max_tokens: Annotated[int | None, typer.Option(help="max_tokens per request.")] = None,
        ignore_eos: Annotated[bool | None, typer.Option("--ignore-eos/--stop-at-eos")] = None,
        cache_prompt: Annotated[
            bool | None, typer.Option("--cache-prompt/--no-cache-prompt", help="Sweep/open loop.")
        ] = None,
        workers: Annotated[
            str | None, typer.Option(help="Locust workers: auto (default), or 0 = one process, N.")
        ] = None,
        remote_workers: Annotated[
            int | None,
            typer.Option(help="Workers on other hosts (`quantload load-worker`) to wait for."),
        ] = None,
        master_host: Annotated[
            str | None,
            typer.Option(help="Address the Locust master listens on (this host's, for remote workers)."),
        ] = None,
        master_port: Annotated[
            int | None, typer.Option(help="The master's port (default 5557 with remote workers).")
        ] = None,
        workers_timeout: Annotated[
            float | None, typer.Option(help="Seconds the master waits for its workers at each plan [60].")
        ] = None,
        metrics_host: Annotated[
            str | None, typer.Option(help="Address to serve /metrics on (default loopback).")
        ] = None,
        metrics_port: Annotated[int | None, typer.Option(help="/metrics port; 0 = none.")] = None,
        request_timeout: Annotated[float | None, typer.Option(help="Per-request deadline, s.")] = None,
        first_byte_timeout: Annotated[
            float | None, typer.Option(help="Most seconds to wait for a response's first byte.")
        ] = None,
        api_key_env: Annotated[
            str | None, typer.Option(help="Environment variable holding the API key.")
        ] = None,
        run_id: Annotated[str | None, typer.Option(help="Run id (default: time + config hash).")] = None,
        exclusive: bool | None = EXCLUSIVE,
        slo_ttft: float | None = SLO_TTFT,
        slo_ttft_percentile: str | None = SLO_TTFT_PERCENTILE,
        slo_tpot: float | None = SLO_TPOT,
        slo_tpot_percentile: str | None = SLO_TPOT_PERCENTILE,
        confidence: float | None = CONFIDENCE,
        as_json: Annotated[bool, typer.Option("--json", help="Print the summaries as JSON.")] = False,
    ) -> None:
        """Stream chat completions at each --url in turn; one record per request, one summary per stage.

        With observe.grafana_url set, each experiment's stages then become Grafana annotations.
        """
        cli = cli_context(ctx)
        flags: dict[str, Any] = {
            "load.users": _numbers(users, int),
            "load.repeats": repeats,
            "load.rates_rps": _numbers(rates, float),
            "load.prompts": prompts,
            "load.prompt_count": prompt_count,
            "load.max_tokens": max_tokens,
            "load.ignore_eos": ignore_eos,
            "load.cache_prompt": cache_prompt,
            "load.workers": workers,
            "load.remote_workers": remote_workers,
            "load.master_host": master_host,
            "load.master_port": master_port,
            "load.workers_timeout_s": workers_timeout,
            "load.metrics_host": metrics_host,
            "load.metrics_port": metrics_port,
            "load.request_timeout_s": request_timeout,
            "load.first_byte_timeout_s": first_byte_timeout,
            "workload.kind": workload,
            "workload.input_lengths": input_lengths,
            "workload.output_lengths": output_lengths,
            "workload.dataset": dataset,
            "trace.path": trace,
            "trace.speed": speed,
            "sessions.turns": turns,
            "sessions.count": sessions,
            "sessions.think_time_s": think_time,
            "sessions.affinity": affinity,
            "mixed.batch_sizes": batch_sizes.split(",") if batch_sizes else None,
            "limit.time_cap_s": time_cap,
            "limit.max_users": max_users,
            "load.exclusive": exclusive,
            "soak.duration_s": duration_text_s(duration) if duration is not None else None,
            **slo_flags(slo_ttft, slo_ttft_percentile, slo_tpot, slo_tpot_percentile, confidence),
        }
        config = cli.config(flags)
        settings = config.settings
        for line in ignored_flags(settings, flags):
            cli.err_console.print(f"warning: {line}", highlight=False, soft_wrap=True)
        check_out_dir(out)
        experiments = registry.against_any_server(experiment or ["sweep"], settings)
        if duration is not None and all(kind.name != SOAK for kind in experiments):
            cli.err_console.print(
                f"warning: --duration is read by the soak experiment only: add -e {SOAK}",
                highlight=False, soft_wrap=True,
            )  # fmt: skip
        names, quants = list(name or []), list(quant or [])
        if len(names) > len(url) or len(quants) > len(url):
            raise ConfigError("more --name/--quant than --url", "give one per --url, in order")
        api_key = settings.server.api_key.get_secret_value() if settings.server.api_key else None
        if api_key_env is not None:
            api_key = cli.environ.get(api_key_env) or os.environ.get(api_key_env)
            if not api_key:
                raise ConfigError(f"environment variable {api_key_env} is empty or unset")
        secret = SecretStr(api_key) if api_key else None
        targets = [
            ServedTarget(
                name=names[i] if i < len(names) else f"server{i}",
                quant=quants[i] if i < len(quants) else "unknown",
                model=model,
                url=address,
                api_key=secret,
            )
            for i, address in enumerate(url)
        ]
        most_users = max(
            *settings.load.users,
            settings.limit.max_users if any(kind.name == "limit_users" for kind in experiments) else 1,
        )
        per_process = machine_limits(settings, cli.cwd).streams_per_process  # as the layout will
        choice = choose_workers(settings.load.workers, most_users, usable_cores(), per_process)
        if choice.warning:
            cli.err_console.print(f"warning: {choice.warning}")
        for line in master_lines(settings.load, choice.workers, master_host, master_port):
            cli.err_console.print(f"warning: {line}", highlight=False, soft_wrap=True)
        for line in remote_worker_lines(settings.load):
            cli.err_console.print(line, highlight=False, soft_wrap=True)
        run = run_id or make_run_id(settings.model_dump(mode="json"))
        write_load_config(out, config)  # the report's sections read the settings this load ran with
        summaries: list[StageSummary] = []
        limits = []
        searched: set[str] = set()  # a search's trials may fail on purpose: they do not fail the command
        unreachable: list[str] = []  # a server that stopped answering costs its own experiments only
        unmeasured: list[str] = []  # limit searches none of whose trials measured anything
        absent: str | None = None  # workers that did not join: no later plan would fare better
        with progress_bar(cli.err_console, "load") as progress:
            context = RunContext(
                RunDir(out), run, settings, progress,
                warn=lambda line: cli.err_console.print(f"warning: {line}", soft_wrap=True),
                cwd=cli.cwd, environ=cli.environ,
            )  # fmt: skip
            if settings.observe.idle_baseline == "on":  # these servers are not ours: asked for only
                seconds = settings.observe.idle_baseline_s
                cli.err_console.print(f"GPUs idle for {seconds:g} s before the load (observe.idle_baseline)")
                watch_idle([target.quant for target in targets], seconds, RunDir(out).gpu_path)
            for target in targets:
                if absent:
                    break
                waited = quiet_before(settings.load, target.url, lambda line: progress(0, None, line))
                if waited is not None:
                    cli.err_console.print(f"{target.name}: {waited}", highlight=False, soft_wrap=True)
                for kind in experiments:
                    # observe.grafana_url: stage annotations; no server control: these servers are not ours
                    try:
                        done = run_experiment(kind.name, target, context)
                    except ServerError as error:
                        unreachable.append(f"{target.name} ({target.quant}) {kind.name}: {error.one_line()}")
                        break
                    summaries += done.summaries
                    absent = workers_absent(done.summaries)
                    if absent:
                        break
                    if done.limit is not None:
                        limits.append(done.limit)
                        searched.update(s.stage_id for s in done.summaries)
                        if done.problem is not None:  # nothing measured: fails like a sweep
                            unmeasured.append(f"{target.name} ({target.quant}) {kind.name}: {done.problem}")
        RunDir(out).write_load_summary(summaries)
        if as_json:
            typer.echo(json.dumps([s.to_dict() for s in summaries], indent=2))
        else:
            cli.console.print(_table(summaries))
            for found in limits:
                label = f"{found.server} {found.quant} ({found.kind})"
                cli.console.print(f"limit search {label}: {found.sentence}")
            cli.console.print(f"records: {out / 'records.jsonl'}  run id: {run}")
        # the table cuts reasons short: each distinct one in full, once
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
        for failure in unreachable:
            cli.err_console.print(f"error: {failure}; the server's remaining experiments were not run")
        if absent:
            load_settings, hint = settings.load, ""
            if load_settings.remote_workers:
                port = master_listen_port(
                    load_settings.master_host, load_settings.master_port, load_settings.remote_workers
                )
                hint = (
                    f" (start `quantload load-worker --master-host <this host> --master-port {port}` on each"
                    f" load host, and let them reach {load_settings.master_host}:{port})"
                )
            cli.err_console.print(
                f"error: the Locust workers did not join ({absent}); the remaining experiments were not"
                f" run{hint}",
                highlight=False,
                soft_wrap=True,
            )
        for failure in unmeasured:
            cli.err_console.print(f"error: {failure}", highlight=False, soft_wrap=True)
        failed_stages = any(s.status != "ok" for s in summaries if s.stage_id not in searched)
        if absent or unreachable or unmeasured or failed_stages:
            raise typer.Exit(1)
