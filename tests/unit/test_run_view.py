"""The live view of `quantload run`: a whole-run line above one line per step."""

from __future__ import annotations

import io

from rich.console import Console

from quantload.cli.run_view import RichRunView


def test_the_view_shows_the_whole_run_and_every_step() -> None:
    out = io.StringIO()
    console = Console(file=out, width=160, force_terminal=False, color_system=None)
    with RichRunView(console) as view:
        prepare = view.step("prepare tiny")
        prepare(3, 3, "done")
        load = view.step("load sweep Q8_0")
        load(4, 10, "stage 1/2")
        view.message("llama-server Q8_0 died; its remaining stages are marked failed")
    text = out.getvalue()
    lines = [line for line in text.splitlines() if line.strip()]
    whole = next(line for line in lines if "whole run" in line)
    assert "2/2" in whole  # both steps ended when the view closed
    assert any("prepare tiny" in line and "3/3" in line for line in lines)
    assert any("load sweep Q8_0" in line and "4/10" in line and "stage 1/2" in line for line in lines)
    assert "remaining stages are marked failed" in text


def test_every_progress_line_fits_100_columns_and_cuts_no_word() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False, color_system=None)
    title = "wait for a quiet machine before the machine limits probe and llama-bench"
    note = "llama-q4_k_m limit_users stage 12/40: waiting for the Locust workers to report their stage"
    with RichRunView(console) as view:
        build = view.step("llama.cpp tools")
        build(37, 222, "[37/222] eta 6m10s")
        step = view.step(title)
        step(3, 12, note)
    lines = [line.rstrip() for line in out.getvalue().splitlines() if line.strip()]
    assert lines and max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert any("37/222" in line and "[37/222] eta 6m10s" in line for line in lines)
    words = set(f"{title} {note}".split())
    for line in lines:
        if "wait for a quiet" in line:
            shown = line.split("(+")[0].split()
            assert all(word in words or word.endswith("…") for word in shown), line
