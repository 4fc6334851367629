"""Running one llama.cpp measuring tool to completion while watching what it prints.

Both output streams are read as they arrive (so a caller can drive a progress bar from them) and
kept whole for parsing afterwards. A run past its time limit, or interrupted, is stopped by killing
the tool's own process; nothing else is signalled.
"""

from __future__ import annotations

import codecs
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from quantload import cpu_share
from quantload.childproc import start_child, stop_group
from quantload.errors import MeasurementError, ModelError, ToolchainError
from quantload.progress import ProgressCallback

Stream = Literal["stdout", "stderr"]
OutputCallback = Callable[[Stream, str], None]
READ_BYTES = 65536
MODEL_LOAD_FAILURE = re.compile(
    r"unable to load model|failed to load model|error loading model|failed to create context"
)


@dataclass(frozen=True)
class ToolRun:
    """What one finished (or stopped) tool run printed, how it ended and how long it took."""

    command: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    wall_time_s: float
    timed_out: bool
    other_cpu_frac: float | None = None  # other processes' share of all CPUs during the run

    @property
    def signal_name(self) -> str | None:
        """The signal that ended the process (e.g. 'SIGKILL'), or None if it exited by itself."""
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def stderr_tail(self, lines: int = 3) -> str:
        """The last non-empty lines of stderr joined on one line, for error messages."""
        tail = [line.strip() for line in self.stderr.splitlines() if line.strip()][-lines:]
        return " | ".join(line[-200:] for line in tail) or "no output on stderr"


class OutputCutShort(MeasurementError):
    """A tool that exited 0 but whose output stops before its result.

    llama.cpp's tools print through a logging thread and do not wait for it at exit (common/log.cpp
    leaks its logger on purpose, "logs may be lost if not flushed before the program exits"):
    when that thread is behind, as on a busy machine, the last lines, the result among them,
    never come. Running the tool again is the remedy (`LOST_OUTPUT_ATTEMPTS`).
    """


# Runs of one measurement when the output was cut short: the tool's work is deterministic, so a
# second run gives the same figures; three in a row cut short is a machine that needs a look.
LOST_OUTPUT_ATTEMPTS = 3


def lost_output_line(tool_name: str, attempts: int) -> str:
    """What to say when every attempt's output was cut short."""
    return (
        f"{tool_name} exited 0 but its output ended before its result in {attempts} runs in a row"
        " (llama.cpp's logging thread had not written its last lines when the tool ended; a"
        " busy machine makes this likelier)"
    )


Parsed = TypeVar("Parsed")


def run_until_whole(
    run_once: Callable[[], ToolRun],
    parse: Callable[[ToolRun], Parsed],
    tool_name: str,
    progress: ProgressCallback,
) -> tuple[ToolRun, Parsed]:
    """Run a tool and parse what it printed; run it again while its output is cut short
    (`OutputCutShort`), `LOST_OUTPUT_ATTEMPTS` runs at most, then MeasurementError."""
    for attempt in range(1, LOST_OUTPUT_ATTEMPTS + 1):
        run = run_once()
        try:
            return run, parse(run)
        except OutputCutShort as error:
            if attempt == LOST_OUTPUT_ATTEMPTS:
                raise MeasurementError(
                    f"{lost_output_line(tool_name, attempt)}: {error.problem}",
                    "run it again on a quieter machine; its log keeps every run",
                ) from None
            progress(0, None, f"output cut short ({error.problem[:60]}): running it again")
    raise AssertionError("LOST_OUTPUT_ATTEMPTS is at least 1")


UNCAUGHT = re.compile(r"terminate called after throwing an instance of '([^']+)'\s*what\(\):\s*([^\n]*)")


def raise_for_uncaught_exception(run: ToolRun, tool_name: str, text_path: Path | None = None) -> None:
    """MeasurementError quoting the C++ exception a tool died of (it then aborts: SIGABRT, which
    is not running out of memory); llama.cpp's tokenizer throws `invalid codepoint` on text that
    is not UTF-8."""
    found = UNCAUGHT.search(run.stderr)
    if found is None:
        return
    kind, what = found.group(1), found.group(2).strip() or "no message"
    if "invalid codepoint" in what and text_path is not None:
        raise MeasurementError(
            f"{tool_name} could not tokenize {text_path}: it is not UTF-8 text (llama.cpp: {what})",
            "give a UTF-8 text file, such as WikiText-2's wiki.test.raw; the tool's log is kept",
        )
    raise MeasurementError(
        f"{tool_name} stopped on an error it did not catch: {what} ({kind})", "see the tool's log"
    )


def raise_for_load_failure_or_exit(run: ToolRun, tool_name: str, model_path: Path) -> None:
    """Raise the errors every measuring tool shares: the model did not load, or a non-zero exit."""
    if MODEL_LOAD_FAILURE.search(run.stderr):
        raise ModelError(
            f"{tool_name} could not load {model_path}: {run.stderr_tail()}",
            "check the file with 'quantload prepare' or llama.cpp's own tools",
        )
    if run.returncode != 0:
        raise MeasurementError(
            f"{tool_name} exited with status {run.returncode}: {run.stderr_tail()}",
            "see the message above",
        )


def _ignore(stream: Stream, text: str) -> None:
    """An output callback that does nothing."""


@contextmanager
def logged_output(
    log_path: Path | None, command: Sequence[str], on_output: OutputCallback
) -> Iterator[OutputCallback]:
    """`on_output`, also appending both streams to `log_path` as they arrive (None: no log).

    The log starts with the command line; its last line says how the run ended, so a tool that
    was killed or raised mid-way still leaves what it printed behind.
    """
    if log_path is None:
        yield on_output
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("a", encoding="utf-8") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()

        def tee(stream: Stream, text: str) -> None:
            log.write(text)
            log.flush()
            on_output(stream, text)

        try:
            yield tee
        except BaseException as error:
            elapsed_s = time.monotonic() - started
            log.write(f"\n# quantload: stopped by {type(error).__name__} after {elapsed_s:.1f} s\n")
            raise
        log.write(f"\n# quantload: the tool's output ended after {time.monotonic() - started:.1f} s\n")


class ChunkProgress:
    """Turns a llama.cpp tool's streamed output into progress calls: chunks done out of chunks
    planned. `plan` finds the chunk count in stderr (first group); `rows` reads the rows stdout
    holds so far as (chunk number, note) pairs."""

    def __init__(
        self,
        progress: ProgressCallback,
        plan: re.Pattern[str],
        label: str,
        rows: Callable[[str], Sequence[tuple[int, str]]],
    ) -> None:
        self._progress = progress
        self._plan = plan
        self._label = label
        self._rows = rows
        self._stdout = ""
        self._stderr = ""
        self._total: int | None = None
        self._done = 0

    def __call__(self, stream: Stream, text: str) -> None:
        if stream == "stderr":
            self._stderr += text
            if self._total is None and (plan := self._plan.search(self._stderr)):
                self._total = int(plan.group(1))
                self._progress(0, self._total, self._label)
            return
        self._stdout += text
        rows = self._rows(self._stdout)
        if len(rows) > self._done:
            self._done = len(rows)
            chunk, note = rows[-1]
            self._progress(chunk, self._total, note)


def run_tool(
    command: Sequence[str],
    on_output: OutputCallback = _ignore,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
) -> ToolRun:
    """Run `command` to its end or `timeout_s`, passing output to `on_output` as it comes."""
    started = time.monotonic()
    cpu_at_start = cpu_share.mark()
    try:
        process = start_child(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
        )
    except OSError as error:
        raise ToolchainError(f"{command[0]} cannot run: {error}", "rebuild or reinstall llama.cpp") from None
    assert process.stdout is not None and process.stderr is not None
    streams: dict[int, tuple[Stream, codecs.BufferedIncrementalDecoder, list[str]]] = {
        process.stdout.fileno(): ("stdout", codecs.getincrementaldecoder("utf-8")("replace"), []),
        process.stderr.fileno(): ("stderr", codecs.getincrementaldecoder("utf-8")("replace"), []),
    }
    deadline = None if timeout_s is None else started + timeout_s
    timed_out = False
    with selectors.DefaultSelector() as selector:
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        try:
            while selector.get_map():
                wait_s = None if deadline is None else deadline - time.monotonic()
                if wait_s is not None and wait_s <= 0:
                    timed_out = True
                    break
                for key, _ in selector.select(wait_s):
                    fd = int(key.fd)
                    name, decoder, parts = streams[fd]
                    data = os.read(fd, READ_BYTES)
                    text = decoder.decode(data, final=not data)
                    if text:
                        parts.append(text)
                        on_output(name, text)
                    if not data:
                        selector.unregister(fd)
            if not timed_out:
                timed_out = not _exited_by(process, deadline)
        finally:
            # timed out, interrupted or failed: the tool and anything it started, by its group
            stop_group(process, grace_s=0.0)
            process.stdout.close()
            process.stderr.close()
    return ToolRun(
        command=tuple(command),
        returncode=process.returncode,
        stdout="".join(_parts(streams, "stdout")),
        stderr="".join(_parts(streams, "stderr")),
        wall_time_s=time.monotonic() - started,
        timed_out=timed_out,
        other_cpu_frac=cpu_share.other_cpu_frac(cpu_at_start),
    )


def _exited_by(process: subprocess.Popen[bytes], deadline: float | None) -> bool:
    """Wait for a process whose output has ended; False if it is still running at `deadline`."""
    try:
        process.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


def _parts(
    streams: Mapping[int, tuple[Stream, codecs.BufferedIncrementalDecoder, list[str]]], name: Stream
) -> list[str]:
    return next(parts for stream, _, parts in streams.values() if stream == name)
