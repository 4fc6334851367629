"""Entry point of the `quantload` command."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from quantload import __version__
from quantload.cli.commands import LazyGroup
from quantload.cli.context import CliContext
from quantload.cli.stop_relay import StopRelay
from quantload.errors import QuantloadError, write_failure

INTERRUPTED_EXIT_CODE = 130  # the shell's code for a process ended by SIGINT
REDELIVER_AFTER_S = 0.01  # a swallowed interrupt is sent again this much later
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # ended like Ctrl-C: children stopped, work kept


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[list[int]]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, so they end a command as Ctrl-C does: every
    child stopped by its handle, records kept, a run marked interrupted. Yields the signals
    received. A repeated signal does not interrupt the clean-up the first one started.

    A signal's KeyboardInterrupt that lands inside a finalizer (`__del__`, a generator closed by
    the garbage collector) is swallowed by Python and reported as unraisable; the signal is sent
    again a moment later, so the stop is never lost. One the kernel hands to another thread while
    the main thread waits wakes the main thread all the same (`StopRelay`), as does Ctrl-C."""
    received: list[int] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) == 1:
            raise KeyboardInterrupt

    def redeliver(unraisable: sys.UnraisableHookArgs) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            signum = received[-1] if received else signal.SIGINT
            received.clear()  # the swallowed interrupt never reached the command: send it again,
            # from a moment later (a handler run inside this hook would be swallowed as well)
            resend = threading.Timer(REDELIVER_AFTER_S, os.kill, (os.getpid(), signum))
            resend.daemon = True
            resend.start()
            return
        previous_hook(unraisable)

    previous = {}
    previous_hook = sys.unraisablehook
    with contextlib.ExitStack() as stack:
        if threading.current_thread() is threading.main_thread():
            previous = {number: signal.signal(number, interrupt) for number in STOP_SIGNALS}
            sys.unraisablehook = redeliver
            stack.enter_context(StopRelay((*STOP_SIGNALS, signal.SIGINT)))
        try:
            yield received
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
            if previous:
                sys.unraisablehook = previous_hook


HELP_WIDTH = 100  # help wraps at the terminal's width, at most this many columns
START_HERE = """Measure llama.cpp quantizations (quality, speed, KV cache, streaming load) and report
which one to serve, with which server flags and how many servers.

Start here:

\b
  quantload run --model smollm2-135m --profile quick
      what `make run` does in a checkout: F16, Q8_0 and Q4_K_M of SmolLM2-135M measured on this
      machine, then the report in results/<run-id>/ (about 10 minutes on 2 cores once llama.cpp
      is built; give WikiText-2 with --dataset PATH, or make run DATASET=PATH, when offline)
  quantload report results/<run-id>
      the report again, e.g. against another SLO (--slo-ttft) or with a capacity plan
      (--target-rps)

`quantload run` alone runs the full profile on qwen2.5-0.5b: it downloads the model from Hugging
Face and measures every experiment, about an hour on 2 cores.

\b
Profiles (--profile):
  quick  the sweep, the prompt cache, a limit search and the KV-cache types: minutes
  full   the default: every experiment, three repeats, 100 prompts (also: seed)
  ci     the smallest end-to-end run, for tests on the tiny synthetic model
  wide   quick over seven types (F16 to Q3_K_M, IQ4_XS with an importance matrix)

Every setting can also come from quantload.toml or QUANTLOAD_<SECTION>__<KEY>; `quantload config
show` prints each value and where it came from.
"""


def _print_version(value: bool) -> None:
    """Eager --version: print and stop before a subcommand is asked for."""
    if value:
        typer.echo(f"quantload {__version__}")
        raise typer.Exit()


def build_app() -> typer.Typer:
    """The typer application with every subcommand registered."""
    app = typer.Typer(
        name="quantload",
        cls=LazyGroup,
        help=START_HERE,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        rich_markup_mode=None,
        context_settings={"max_content_width": HELP_WIDTH},
    )

    @app.callback()
    def root(
        ctx: typer.Context,
        config_file: Annotated[
            Path | None, typer.Option("--config", help="Configuration file (default ./quantload.toml).")
        ] = None,
        version: Annotated[
            bool,
            typer.Option("--version", help="Print the version.", is_eager=True, callback=_print_version),
        ] = False,
    ) -> None:
        ctx.obj = CliContext(
            cwd=Path.cwd(),
            environ=dict(os.environ),
            config_file=config_file,
            console=Console(markup=False),  # labels and paths are shown as they are, never as markup
            err_console=Console(stderr=True, markup=False),
        )

    return app


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; a QuantloadError becomes one line on stderr and exit code 2."""
    app = build_app()
    with stop_signals_interrupt() as received:
        exit_code = _run(app, argv)
    if received and exit_code == INTERRUPTED_EXIT_CODE:
        return 128 + received[0]  # the shell's code for a process ended by that signal
    return exit_code


def _run(app: typer.Typer, argv: list[str] | None) -> int:
    try:
        # Without standalone mode, typer turns `typer.Exit(n)` and Ctrl-C (130) into a return value.
        exit_code = app(args=argv, standalone_mode=False)
    except QuantloadError as error:
        message = Text("error: ", style="bold red") + Text(error.one_line())
        Console(stderr=True, highlight=False, soft_wrap=True).print(message)
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        return INTERRUPTED_EXIT_CODE
    except OSError as error:  # what only writing finds (a full disk mid-stage): one line, what is kept stays
        failure = write_failure(error)
        if failure is None:
            raise
        message = Text("error: ", style="bold red") + Text(failure.one_line())
        Console(stderr=True, highlight=False, soft_wrap=True).print(message)
        return 1
    except typer.Exit as done:
        return int(done.exit_code or 0)
    except typer.Abort:
        return 1
    except Exception as error:
        exit_code = getattr(error, "exit_code", None)
        show = getattr(error, "show", None)
        if exit_code is not None and callable(show):
            show()
            return int(exit_code)
        raise
    if exit_code == INTERRUPTED_EXIT_CODE:
        Console(stderr=True).print("interrupted")
    return exit_code if isinstance(exit_code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
