"""Plots a person reads, each rendered and read back (its ticks, labels, legend and texts):

- the limit search: levels over time, a verdict mark per trial, whole users on the user axis (one
  trial too: no "0.945" or "1.0" ticks), a panel per quantization, the legend outside the panels;
- the servers' time series: a band per quantization's experiment, the band names never on top of
  each other, the legend outside the data;
- quality: intervals, no KLD below the floor (F16's own, never below zero), the floor drawn and named.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pandas as pd
import pytest
from analysis_synthetic import T0, write_kv, write_quality, write_synthetic_run

from quantload.analysis.analyze import Analysis, analyze_run
from quantload.analysis.chapters.load import limit_search_figure
from quantload.analysis.chapters.model_files import quality_speed_figure
from quantload.analysis.chapters.server import server_timeseries_figure, stage_bands
from quantload.analysis.run_data import load_run
from quantload.config import ReportSettings
from quantload.llamacpp.server import free_port
from quantload.load.limit_file import LimitLine, TrialLine

QUANTS = ("F16", "Q8_0", "Q4_K_M")


def _search(quant: str, trials: list[tuple[float, str]], limit: float | None) -> LimitLine:
    lines = [TrialLine(level=level, outcome=outcome, hard_failure=False, seconds=6.0, why="x")  # type: ignore[arg-type]
             for level, outcome in trials]  # fmt: skip
    missed = [level for level, outcome in trials if outcome == "misses"]
    return LimitLine(
        run_id="synthetic", server=f"llama-{quant.lower()}", quant=quant, experiment="limit_users", kind="users",
        workload="prompts", slo_ttft_s=1.0, slo_tpot_s=0.1, limit=limit, ending="found" if limit else "never_met",
        lowest_miss=min(missed) if missed else None, seconds=6.0 * len(trials), sentence="", trials=lines,
        unix_s=T0,
    )  # fmt: skip


@pytest.fixture(scope="module")
def analysis(tmp_path_factory: pytest.TempPathFactory) -> Analysis:
    run = write_synthetic_run(tmp_path_factory.mktemp("plots") / "run", quants=QUANTS, users_levels=(1, 2, 4, 8))
    write_quality(run, {"F16": {"f16": (-0.000001, 0.0)}, "Q8_0": {"f16": (0.004, 0.0002)},
                        "Q4_K_M": {"f16": (0.057, 0.003)}})  # fmt: skip
    write_kv(run, QUANTS)
    searches = [
        _search("F16", [(1.0, "meets"), (2.0, "meets"), (4.0, "misses"), (3.0, "undecided")], 2.0),
        _search("Q8_0", [(1.0, "misses")], None),  # one trial: the panel still has whole-user ticks
        _search("Q4_K_M", [(1.0, "meets"), (2.0, "meets"), (4.0, "meets"), (8.0, "misses"), (6.0, "meets"),
                           (7.0, "misses")], 6.0),
    ]  # fmt: skip
    (run / "limits.jsonl").write_text("".join(line.model_dump_json(by_alias=True) + "\n" for line in searches))
    return analyze_run(load_run(run), ReportSettings(), f"http://127.0.0.1:{free_port()}")


def _rendered(figure: Any) -> Any:
    figure.canvas.draw()
    return figure.canvas.get_renderer()


def _labels(ticks: Any) -> list[str]:
    return [tick.get_text() for tick in ticks if tick.get_text()]


def _overlaps(a: Any, b: Any) -> bool:
    return bool(a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1)


def _legend_outside_every_panel(figure: Any, renderer: Any) -> list[str]:
    assert len(figure.legends) == 1, "one legend for the figure"
    legend = figure.legends[0]
    box = legend.get_window_extent(renderer)
    for axis in figure.axes:
        if axis.get_visible():
            assert not _overlaps(box, axis.get_window_extent(renderer)), "the legend covers a panel"
    return [text.get_text() for text in legend.get_texts()]


def test_the_limit_search_is_levels_over_time_with_verdict_marks_and_whole_user_ticks(analysis: Analysis) -> None:
    figure = limit_search_figure(analysis)
    assert figure is not None
    renderer = _rendered(figure)
    panels = [axis for axis in figure.axes if axis.get_visible()]
    titles = [axis.get_title() for axis in panels]
    assert [title.split(":")[0] for title in titles] == list(QUANTS)  # a panel per quantization
    assert "no limit found, 1 trial" in titles[1] and "limit 6, 6 trials" in titles[2]
    for axis in panels:
        assert axis.get_xlabel() == "seconds into the search" and axis.get_ylabel() == "concurrent users"
        users = _labels(axis.get_yticklabels())
        assert users and all(re.fullmatch(r"\d+", label) for label in users), users  # never "1.0" or "0.945"
        assert float(axis.get_xlim()[0]) == 0.0
    f16 = panels[0]
    lines = [line for line in f16.get_lines() if line.get_linestyle() == "None"]
    assert [line.get_marker() for line in lines] == ["o", "o", "x", "s"]  # met, met, missed, undecided
    assert [float(line.get_xdata()[0]) for line in lines] == [6.0, 12.0, 18.0, 24.0]  # each at its end
    assert _legend_outside_every_panel(figure, renderer) == ["met", "missed", "undecided", "the limit found"]


def _server_analysis(analysis: Analysis) -> Analysis:
    """The analysis with a Prometheus series over its stages (busy slots rising with the users)."""
    rows = []
    for stage in analysis.stages.itertuples():
        for unix_s in (stage.started_unix_s, stage.ended_unix_s):
            for metric, value in (("slots_busy", stage.users), ("slots", 8), ("kv_used_ratio", 0.1),
                                  ("requests_processing", stage.users), ("requests_deferred", 0)):  # fmt: skip
                rows.append({"metric": metric, "quant": stage.quant, "unix_s": unix_s, "value": float(value)})
    return dataclasses.replace(analysis, server_series=pd.DataFrame(rows))


def test_the_server_series_name_their_bands_apart_and_keep_the_legend_off_the_data(analysis: Analysis) -> None:
    served = _server_analysis(analysis)
    figure = server_timeseries_figure(served)
    assert figure is not None
    renderer = _rendered(figure)
    top = figure.axes[0]
    names = [text for text in top.texts if text.get_text()]
    bands = stage_bands(served.stages, float(served.stages["started_unix_s"].min()))
    assert [band.label for band in bands] == [f"{q} {e}" for q in QUANTS for e in ("sweep", "prompt-cache experiment")]
    assert len(names) >= len(QUANTS)  # at least each quantization's first band is named
    boxes = [text.get_window_extent(renderer) for text in names]
    for index, box in enumerate(boxes):
        assert all(not _overlaps(box, other) for other in boxes[index + 1 :]), "band names overlap"
    legend = _legend_outside_every_panel(figure, renderer)
    assert legend == [*QUANTS, *(f"{q} slots" for q in QUANTS)]
    legend_box = figure.legends[0].get_window_extent(renderer)
    assert all(not _overlaps(legend_box, box) for box in boxes)


def test_quality_has_intervals_and_nothing_below_the_floor_which_is_named(analysis: Analysis) -> None:
    from matplotlib.collections import LineCollection, PathCollection

    table = analysis.quant_table.assign(decode_tok_s=[127.0, 177.0, 187.0], file_size_bytes=[258e6, 138e6, 100e6])
    figure = quality_speed_figure(dataclasses.replace(analysis, quant_table=table))  # llama-bench's, the files'
    assert figure is not None
    renderer = _rendered(figure)
    size_panel = figure.axes[1]
    for axis in figure.axes:
        scatters = [c for c in axis.collections if isinstance(c, PathCollection)]
        points = [float(y) for collection in scatters for _, y in collection.get_offsets()]
        assert len(points) == len(QUANTS) and min(points) == 0.0  # F16's -0.000001 drawn at the floor
        low, _ = axis.get_ylim()
        assert low >= 0.0
        shown = [tick for tick in axis.get_yticks() if low <= tick <= axis.get_ylim()[1]]
        assert shown and min(shown) >= 0.0
    ticks = _labels(figure.axes[0].get_yticklabels())  # the panels share it
    assert ticks and not any(label.startswith(("-", "−")) for label in ticks), ticks
    for axis in figure.axes:
        errorbars = [c for c in axis.collections if isinstance(c, LineCollection)]
        assert len(errorbars) == len(QUANTS)
        bars = [segment for collection in errorbars for segment in collection.get_segments()]
        assert all(min(segment[:, 1]) >= 0.0 for segment in bars)  # no interval reaches below the floor
    assert _legend_outside_every_panel(figure, renderer) == ["floor: F16 against its own base (0.000000 nats)"]
    texts = [text.get_text() for axis in figure.axes for text in axis.texts]
    assert "F16\n0.000000 nats" in texts and not any("e-" in text or "-0.0" in text for text in texts)
    assert figure.axes[0].get_ylabel().startswith("mean KLD from F16, nats") and "±1 s.e." in figure.axes[0].get_ylabel()
    assert size_panel.get_xlabel() == "file size, MiB"
