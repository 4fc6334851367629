"""The soak's chapter. One load held for a long time: latency, errors and memory over time (one
figure), the drift per hour of TTFT p99 and of the server's and the load client's memory, and every
slice."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from quantload.analysis import fmt
from quantload.analysis.chapters.parts import Chapter, Plots, gap_blocks, not_run_section, shown, value
from quantload.analysis.document import Block, Details, Paragraph, Section, Table
from quantload.analysis.drift import Drift
from quantload.analysis.plotting import Figure, colors, new_figure, save_figure
from quantload.experiments.soak.findings import findings_of
from quantload.experiments.soak.tables import DRIFT_SERVER, DRIFT_TTFT, PART_ALL, PART_LATE, SERIES, SoakRun

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis

MIB = 2.0**20
DRAIN_WARNING_FRAC = 0.1


def drift_text(drift: Drift) -> str:
    """'+1.2 ms/h (95 % interval -0.5 to +2.9 ms/h, 58 slices): within noise'."""
    if drift.slope_per_h is None:
        return f"{fmt.DASH} ({fmt.counted(drift.points, 'slice')}: too few to fit)"
    show = _per_hour(drift.what)
    interval = f"95 % interval {show(drift.ci_low_per_h)} to {show(drift.ci_high_per_h)}"
    verdict = "beyond noise" if drift.beyond_noise else "within noise"
    share = drift.relative_per_h
    relative = f", {fmt.percent(share, 2, True)} of its mean" if share is not None else ""
    return f"{show(drift.slope_per_h)}/h ({interval}, {drift.points} slices{relative}): {verdict}"


def _per_hour(what: str) -> Callable[[float | None], str]:
    if what == DRIFT_TTFT:
        return lambda v: fmt.DASH if v is None else f"{v * 1000:+.2f} ms"
    return lambda v: fmt.DASH if v is None else f"{v / MIB:+.2f} MiB"


def trend_sentence(run: SoakRun, what: str) -> str:
    """One sentence per series: no drift, a drift that stopped, or one still going on."""
    whole, late = run.drift(what, PART_ALL), run.drift(what, PART_LATE)
    label, show = f"{what[0].upper()}{what[1:]}", _per_hour(what)
    if whole is None or whole.beyond_noise is None:
        return f"{label}: too few slices to judge."
    if not whole.beyond_noise and not (late is not None and late.beyond_noise):
        return f"{label}: no drift beyond noise."
    if late is None or late.beyond_noise is None:
        return f"{label}: drifts {show(whole.slope_per_h)}/h (too few slices to tell whether it stopped)."
    if late.beyond_noise:
        share = late.relative_per_h
        size = f" ({fmt.percent(abs(share), 2)} of its level an hour)" if share is not None else ""
        return f"{label}: still drifting in the second half, {show(late.slope_per_h)}/h{size}."
    return (
        f"{label}: drifted {show(whole.slope_per_h)}/h over the whole soak but not beyond noise in"
        " its second half: it stopped."
    )


def _slices(count: int) -> str:
    return "slice" if count == 1 else f"{count} slices"


def _minutes(run: SoakRun, unix_s: Iterable[float]) -> list[float]:
    start = run.started_unix_s or 0.0
    return [(float(t) - start) / 60.0 for t in unix_s]


def _soak_figure(analysis: Analysis, path: Path) -> Path | None:
    """Per soak: TTFT and TPOT per slice; server and client memory; KV cells in use and failures."""
    runs = [run for run in findings_of(analysis).runs if not run.slices.empty]
    if not runs:
        return None
    figure, axes = new_figure(10.0, 8.0, 3, 1, sharex=True)
    palette = colors([run.quant for run in runs])
    latency, memory, kv = axes[0][0], axes[1][0], axes[2][0]
    client_axis = memory.twinx()  # the client's memory on its own scale: tens of MiB beside hundreds
    for run in runs:
        color = palette.get(run.quant)
        slices = run.slices.dropna(subset=["mid_unix_s"])
        minutes = _minutes(run, slices["mid_unix_s"])
        latency.plot(minutes, slices["ttft_p99_s"] * 1000, "-o", ms=3, color=color,
                     label=f"{run.quant} TTFT p99")  # fmt: skip
        latency.plot(minutes, slices["ttft_p50_s"] * 1000, "--", color=color, label=f"{run.quant} TTFT p50")
        latency.plot(minutes, slices["tpot_p99_s"] * 1000, ":", color=color, label=f"{run.quant} TPOT p99")
        samples = run.samples.dropna(subset=["server_rss_bytes"])
        if not samples.empty:
            memory.plot(_minutes(run, samples["unix_s"]), samples["server_rss_bytes"] / MIB, "-",
                        color=color, label=f"{run.quant} server")  # fmt: skip
        client = slices.dropna(subset=["client_rss_bytes"])
        if not client.empty:
            client_minutes = _minutes(run, client["mid_unix_s"])
            client_axis.plot(client_minutes, client["client_rss_bytes"] / MIB, "s--", ms=3, color=color,
                             alpha=0.7, label=f"{run.quant} load client (right)")  # fmt: skip
        cells = run.samples.dropna(subset=["kv_cells_used"])
        if not cells.empty:
            kv.plot(_minutes(run, cells["unix_s"]), cells["kv_cells_used"], "-", color=color,
                    label=f"{run.quant} KV cells in use")  # fmt: skip
        failed = slices[slices["failed"].fillna(0) > 0]
        if not failed.empty:
            kv.bar(_minutes(run, failed["mid_unix_s"]), failed["failed"], width=0.3, color="#d62728",
                   alpha=0.6, label=f"{run.quant} failed requests")  # fmt: skip
    latency.set_ylabel("per slice (ms)")
    memory.set_ylabel("server resident memory (MiB)")
    client_axis.set_ylabel("load client resident memory (MiB)")
    if client_axis.get_legend_handles_labels()[0]:
        client_axis.legend(fontsize=7, loc="lower right")
    kv.set_ylabel("KV cells / failures")
    kv.set_xlabel("minutes since the soak started")
    for axis in (latency, memory, kv):
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7, loc="upper left")
    latency.set_ylim(bottom=0)
    figure.suptitle("Soak: latency, memory and KV cells over time")
    return save_figure(figure, path)


SOAK_FIGURES = (Figure("soak", "Soak: latency, memory and KV cells over time", _soak_figure),)


def _memory_sentence(run: SoakRun) -> str:
    """Where the server's memory was read from, or why it was not."""
    if run.memory_source:
        return f"Server memory read from {run.memory_source}."
    why = run.memory_missing or "no source of the server's memory was found"
    return f"Server memory not measured: {why.rstrip('.')}."


def _run_blocks(run: SoakRun) -> list[Block]:
    slices = run.slices
    ok = slices[slices["status"] == "ok"]
    requests, failed = int(slices["requests"].fillna(0).sum()), int(slices["failed"].fillna(0).sum())
    held = run.held_s
    blocks: list[Block] = [
        Paragraph(
            f"{run.quant or run.server}: {run.level} held for"
            f" {fmt.number(held / 60 if held is not None else None, 1)} min"
            f" ({fmt.number(run.duration_s, 0)} s asked; level from {run.level_from or 'unknown'}),"
            f" in {fmt.counted(len(slices), 'slice')} of {fmt.number(run.slice_s, 0)} s, {len(ok)} ended ok:"
            f" {fmt.number(requests, 0)} requests, {fmt.number(failed, 0)} failed"
            f" ({fmt.percent(failed / requests if requests else None, 2)})."
            f" {_memory_sentence(run)}"
        )
    ]
    drain = run.drain_frac
    if drain is not None and drain > DRAIN_WARNING_FRAC:
        blocks.append(
            Paragraph(
                f"The slices drained for {fmt.percent(drain, 0)} of the time held: each slice's last"
                " requests finished with no new ones sent, so the load was below its level that long"
                " (requests take a large part of a slice); a longer soak.slice_s holds it better.",
                "warning",
            )
        )
    rows = tuple((d.what, d.part, drift_text(d)) for d in run.drifts)
    blocks.append(
        Table(
            ("drift per hour", "slices fitted", "slope, its 95 % interval, and the verdict"),
            rows,
            (False, False, False),
            f"Least-squares lines through the slices after the first {_slices(run.settle_slices)}"
            " (all), and through the second half of those alone (a slice's value: its TTFT p99, the"
            " median of the server's memory readings inside it, the load client's memory at its"
            " end); beyond noise when the interval leaves out zero.",
        )
    )
    verdicts = [trend_sentence(run, what) for what, _ in SERIES]
    still = any(d.beyond_noise for d in run.drifts if d.part == PART_LATE)
    blocks.append(Paragraph(" ".join(verdicts), "warning" if still else "plain"))
    server = run.drift(DRIFT_SERVER)
    if server is not None and server.beyond_noise and (server.slope_per_h or 0.0) > 0:
        blocks.append(
            Paragraph(
                "llama-server allocates its KV cache up front and the kernel backs its pages as they"
                " are first written, so its resident memory grows while slots write cells they never"
                " used before (see the KV cells in use): growth that stops once they have is not a leak.",
                "muted",
            )
        )
    slice_rows = tuple(
        (
            str(r["slice"]),
            str(r["status"]),
            f"{int(value(r['ok']) or 0)} / {int(value(r['requests']) or 0)}",
            str(r["errors"] or fmt.DASH),
            fmt.percent(value(r["good_frac"]), 0),
            fmt.number(value(r["goodput_rps"]), 2),
            fmt.duration(value(r["ttft_p50_s"])),
            fmt.duration(value(r["ttft_p99_s"])),
            fmt.duration(value(r["tpot_p50_s"])),
            fmt.duration(value(r["tpot_p99_s"])),
            fmt.mib(value(r["server_rss_bytes"])),
            fmt.mib(value(r["client_rss_bytes"])),
            fmt.number(value(r["kv_cells_used"]), 0),
            str(r.get("slo_outcome") or fmt.DASH),
        )
        for r in slices.to_dict("records")
    )
    columns = ("slice", "status", "ok / sent", "errors", "good", "goodput /s", "TTFT p50", "TTFT p99",
               "TPOT p50", "TPOT p99", "server memory", "client memory", "KV cells", "SLO")  # fmt: skip
    numeric = (True, False, True, False, *([True] * 9), False)
    table = Table(columns, slice_rows, numeric)
    blocks.append(Details(f"Every slice of {run.quant or run.server}", (table,)))
    if run.reading_errors:
        blocks.append(Paragraph(f"Readings that failed: {'; '.join(run.reading_errors[:5])}.", "muted"))
    return blocks


def soak_section(analysis: Analysis, plots: Plots) -> Section:
    """The soak's verdict, its figure and its slices."""
    runs = findings_of(analysis).runs
    if not runs:
        return not_run_section("soak", "Soak", "no soak in this run (the soak experiment)", analysis, "soak")
    blocks = [
        Paragraph(
            "One load held for a long time, in slices (each slice its own stage): does latency or"
            " memory creep up while nothing else changes? Each slice drains before the next starts"
            " (at most one request's time per user)."
        ),
        *shown(plots, SOAK_FIGURES[0]),
    ]
    for run in runs:
        blocks += _run_blocks(run)
    blocks += gap_blocks(analysis, "soak")
    return Section("soak", "Soak", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    asked = findings_of(analysis).runs or any(gap.section == "soak" for gap in analysis.gaps)
    return (soak_section(analysis, plots),) if asked else ()  # no soak asked for: no section


CHAPTER = Chapter(_sections, SOAK_FIGURES)
