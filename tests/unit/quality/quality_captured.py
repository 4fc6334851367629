"""Captured llama-perplexity runs as ToolRun objects (a plain module, importable by tests)."""

from __future__ import annotations

from pathlib import Path

from quantload.llamacpp.tool_run import ToolRun

CAPTURED = Path(__file__).resolve().parents[2] / "fixtures" / "llamacpp"


def captured_run(name: str, returncode: int = 0, timed_out: bool = False) -> ToolRun:
    """A ToolRun made of the captured `<name>.stdout` and `<name>.stderr`."""
    return ToolRun(
        command=("llama-perplexity",),
        returncode=returncode,
        stdout=(CAPTURED / f"{name}.stdout").read_text(encoding="utf-8"),
        stderr=(CAPTURED / f"{name}.stderr").read_text(encoding="utf-8"),
        wall_time_s=1.5,
        timed_out=timed_out,
    )
