"""Running llama-imatrix: an importance matrix of one model over a calibration text (GGUF output).

`llama-imatrix -m MODEL -f TEXT -o OUT.gguf -c CTX --chunks N` (`tools/imatrix/imatrix.cpp`) needs
at least 2 x CTX tokens of text ("you need at least ... tokens"), prints "computing over N chunks"
and then `[i]ppl,` after each chunk. The matrix is written under a partial name and renamed when
the tool has finished, so a final name never holds half a file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from quantload.errors import MeasurementError, ModelError
from quantload.llamacpp.tool_run import Stream, ToolRun, run_tool
from quantload.llamacpp.toolchain import Toolchain
from quantload.progress import ProgressCallback, no_progress

_CHUNKS = re.compile(r"computing over (\d+) chunks")
_CHUNK_DONE = re.compile(r"\[(\d+)\]")
_TOO_SHORT = re.compile(r"you need at least (\d+) tokens")


@dataclass(frozen=True)
class ImatrixRun:
    """One finished llama-imatrix run."""

    path: Path
    chunks: int
    wall_time_s: float
    command: tuple[str, ...]


def run_imatrix(
    toolchain: Toolchain,
    model: Path,
    text: Path,
    out: Path,
    ctx_tokens: int,
    chunks: int,
    log_path: Path,
    progress: ProgressCallback = no_progress,
    timeout_s: float | None = None,
    runner: Callable[..., ToolRun] = run_tool,
) -> ImatrixRun:
    """Compute the importance matrix of `model` on `text` into `out`; ModelError or
    MeasurementError in one line when llama-imatrix refuses or fails."""
    partial = out.with_name(out.name + ".partial.gguf")
    command = [
        str(toolchain.path("llama-imatrix")), "-m", str(model), "-f", str(text), "-o", str(partial),
        "-c", str(ctx_tokens), "--chunks", str(chunks), *toolchain.layer_args("llama-imatrix"),
    ]  # fmt: skip
    log_path.parent.mkdir(parents=True, exist_ok=True)
    planned = [chunks]
    with log_path.open("w", encoding="utf-8") as log:
        log.write("$ " + " ".join(command) + "\n")

        def on_output(stream: Stream, piece: str) -> None:
            log.write(piece)
            log.flush()
            if found := _CHUNKS.search(piece):
                planned[0] = int(found.group(1))
            done = _CHUNK_DONE.findall(piece)
            if done:
                progress(int(done[-1]), planned[0], "importance matrix")

        try:
            run = runner(command, on_output, timeout_s)
        finally:
            log.flush()
    output = run.stdout + run.stderr
    if too_short := _TOO_SHORT.search(output):
        partial.unlink(missing_ok=True)
        raise MeasurementError(
            f"the calibration text {text} is too short for one chunk: llama-imatrix needs at least"
            f" {too_short.group(1)} tokens for a context of {ctx_tokens}",
            "give a longer text (prepare.calibration) or lower prepare.imatrix_ctx",
        )
    if run.timed_out or run.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        how = "timed out" if run.timed_out else f"exited with status {run.returncode}"
        if "failed to load model" in output or "unable to load model" in output:
            raise ModelError(f"llama-imatrix could not load {model}: {run.stderr_tail()}", f"see {log_path}")
        raise MeasurementError(f"llama-imatrix {how}: {run.stderr_tail()}", f"see {log_path}")
    partial.replace(out)
    found = _CHUNKS.search(output)
    return ImatrixRun(out, int(found.group(1)) if found else chunks, run.wall_time_s, tuple(command))
