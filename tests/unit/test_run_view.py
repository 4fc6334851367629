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
