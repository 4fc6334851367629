"""`quantload calibrate`: measure this machine's load client against a fake server of known timing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from quantload.cli.context import cli_context
from quantload.cli.progress_view import progress_bar
from quantload.errors import ConfigError
from quantload.load.calibrate import calibration_script, run_calibration
from quantload.load.calibration_file import CALIBRATION_DIR, Calibration, machine_limits, write_calibration
from quantload.load.fakeserver import FakeScript, serve_forever
from quantload.load.processes import choose_workers, usable_cores
from quantload.urls import BadUrl, http_address


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _pair(low: float | None, high: float | None) -> str:
    return f"{_ms(low)}/{_ms(high)}"


def _table(result: Calibration) -> Table:
    limit = f"{result.max_error_p99_s * 1000:g} ms"
    workers = sorted({count.workers for count in result.counts})
    processes = "one load process" if workers == [0] else f"Locust workers: {workers}"
    late = max((c.server_token_late_p99_s or 0.0 for c in result.counts), default=0.0)
    where = f"; the fake at {result.fake_url}: errors include the way back" if result.fake_url else ""
    table = Table(
        title="quantload calibrate: the load client against a fake server of known timing",
        caption=(
            "errors in ms (TTFT: client's own, the fake's lateness taken out; vs script: not);"
            f" the fake itself sent tokens up to {_ms(late)} ms late (p99); CPU: % of one core per"
            f" 100 streams, all load processes; {processes}"
            + where
        ),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for header in (
        "streams", "ok", "TTFT err\np50/p99", "ITL err\np50/p99", "TTFT vs\nscript p99",
        "conc.", "CPU per\n100 str.", "loop lag\np99", f"within\n{limit}",
    ):  # fmt: skip
        table.add_column(header, no_wrap=True, justify="right")
    for count in result.counts:
        cpu = count.client_cpu_per_100_streams
        table.add_row(
            str(count.streams),
            f"{count.ok}/{count.requests}",
            _pair(count.ttft_error_p50_s, count.ttft_error_p99_s),
            _pair(count.itl_error_p50_s, count.itl_error_p99_s),
            _ms(count.ttft_error_vs_script_p99_s),
            "-" if count.delivered_concurrency is None else f"{count.delivered_concurrency:.1f}",
            "-" if cpu is None else f"{100 * cpu:.0f}",
            _ms(count.loop_lag_p99_s),
            "yes" if count.within_error else "NO",
        )
    return table


def _streams(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"not a comma list of stream counts: {text!r}", "e.g. 1,8,64,256") from None


def _serve_fake(console: Console, address: str, script: FakeScript) -> None:
    """Serve the calibration fake on HOST:PORT (port 0: a free one) until Ctrl-C or SIGTERM."""
    host, sep, port_text = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"--serve-fake {address!r} is not HOST:PORT", "e.g. --serve-fake 10.0.0.7:8090")

    def ready(port: int) -> None:
        url = f"http://{host}:{port}"
        console.print(
            f"calibration fake serving on {url}; on the client host: quantload calibrate --fake-url {url}",
            highlight=False,
            soft_wrap=True,
        )

    try:
        serve_forever(script, host, int(port_text), None, on_ready=ready)
    except OSError as error:
        raise ConfigError(
            f"cannot serve on {address}: {error.strerror or error}", "give a free port of this host"
        ) from None


def register(app: typer.Typer) -> None:
    """Add the `calibrate` command."""

    @app.command("calibrate")
    def calibrate_command(
        ctx: typer.Context,
        streams: Annotated[
            str | None, typer.Option(help="Rising stream counts, e.g. 1,8,64,256 (at most 8, each <= 1024).")
        ] = None,
        seconds: Annotated[float | None, typer.Option(help="Seconds of streaming per count.")] = None,
        max_error_ms: Annotated[
            float | None, typer.Option(help="TTFT and ITL error p99 still counted as right (default 5).")
        ] = None,
        workers: Annotated[str | None, typer.Option(help="Locust workers: auto (default), 0, N.")] = None,
        keep_alive: Annotated[
            bool, typer.Option("--keep-alive", help="The fake keeps connections (llama-server closes them).")
        ] = False,
        fake_url: Annotated[
            str | None,
            typer.Option(
                help="A fake already serving on another host (--serve-fake there), e.g. http://10.0.0.7:8090."
            ),
        ] = None,
        serve_fake: Annotated[
            str | None,
            typer.Option(
                help="Only serve the calibration fake on HOST:PORT until stopped (for a client on"
                " another host).",
                metavar="HOST:PORT",
            ),
        ] = None,
        out: Annotated[
            Path | None, typer.Option(help="Folder for the JSON result (default <run.out>/calibration).")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    ) -> None:
        """Measure how accurately this machine's load client times streams, at rising stream counts.

        Starts a fake OpenAI-style server of known timing on loopback (or drives one another host
        serves, --fake-url), streams from it with the client `quantload load` uses, and says up to
        how many concurrent streams the client's TTFT and ITL errors stay within
        calibrate.max_error_p99_s.
        """
        cli = cli_context(ctx)
        flags: dict[str, Any] = {
            "calibrate.streams": _streams(streams),
            "calibrate.seconds_per_count": seconds,
            "calibrate.max_error_p99_s": None if max_error_ms is None else max_error_ms / 1000,
            "calibrate.server_closes_connections": False if keep_alive else None,
            "load.workers": workers,
            "calibrate.fake_url": fake_url,
        }
        settings = cli.config(flags).settings
        if serve_fake is not None:
            _serve_fake(cli.err_console, serve_fake, calibration_script(settings.calibrate))
            return
        if settings.calibrate.fake_url is not None:
            try:
                http_address(settings.calibrate.fake_url)
            except BadUrl as error:
                raise ConfigError(f"calibrate.fake_url: {error}", "e.g. http://10.0.0.7:8090") from None
        choice = choose_workers(settings.load.workers, max(settings.calibrate.streams), usable_cores())
        if choice.warning:
            cli.err_console.print(f"warning: {choice.warning}")
        with progress_bar(cli.err_console, "calibrate") as progress:
            result = run_calibration(settings.calibrate, settings.load, progress)
        folder = out if out is not None else settings.run.out / CALIBRATION_DIR
        path = write_calibration(result, folder)
        if as_json:
            typer.echo(json.dumps(result.model_dump(mode="json"), indent=2))
            return
        cli.console.print(_table(result))
        before, after = result.load_average_before, result.load_average_after
        if before is not None and after is not None:
            cli.console.print(
                f"{result.cores} cores; load average {before:.2f} before, {after:.2f} after"
                " (a busy machine makes every figure worse)",
                highlight=False,
            )
        cli.console.print(f"{result.verdict()}.", highlight=False)
        cli.console.print(f"written to {path}", highlight=False)
        if out is None:
            limits = machine_limits(settings, cli.cwd)
            proved = limits.streams_per_process
            cli.console.print(
                "every load on this machine is now held to it: a stage with more than"
                f" {0 if proved is None else proved:g} streams per load process, or whose event loop"
                f" wakes up more than {limits.lag_s * 1000:.1f} ms late (p99), says its figures may be"
                " worse than stated (client: degraded)",
                highlight=False,
            )
