"""`quantload predict`: the capacity each GGUF file is predicted to serve within the SLO, before
any load: cost curves from llama-batched-bench, a model of llama-server's scheduler, the limit."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from quantload.cli.context import CliContext, cli_context
from quantload.cli.progress_view import progress_bar
from quantload.cli.result_labels import result_labels
from quantload.cli.slo_options import (
    CONFIDENCE,
    SLO_TPOT,
    SLO_TPOT_PERCENTILE,
    SLO_TTFT,
    SLO_TTFT_PERCENTILE,
    slo_flags,
)
from quantload.config import Settings
from quantload.errors import ConfigError
from quantload.llamacpp.toolchain import Toolchain, ensure_toolchain
from quantload.models.gguf_meta import check_is_gguf, read_gguf
from quantload.predict.costs import CostsFile, load_costs_file, write_costs_file
from quantload.predict.limit import LevelPrediction
from quantload.predict.measure import GEN_TOKENS, describe, measure_costs, measuring_grid
from quantload.predict.prediction import (
    FilePrediction,
    client_timing,
    predict_body,
    predict_file,
    search_budget,
    search_rules,
    server_flags_used,
    write_predict_file,
)
from quantload.predict.workload_shapes import WorkloadShapes, workload_shapes
from quantload.rundir import RunPaths
from quantload.slo import Slo


def level_table(prediction: FilePrediction) -> Table:
    """Each simulated level: the SLO's percentiles, throughput and where a request's time goes."""
    slo = prediction.limit.slo
    table = Table(
        "users", f"TTFT {slo.ttft_percentile} s", f"TPOT {slo.tpot_percentile} s", "req/s", "tokens/s",
        "queue", "prefill", "decode", "SLO", "search",
        title=f"{prediction.label}: predicted per level ({prediction.flags.text()})",
    )  # fmt: skip
    for level in prediction.limit.levels:
        table.add_row(
            f"{level.level:g}",
            "-" if level.ttft_s is None else f"{level.ttft_s:.3f}",
            "-" if level.tpot_s is None else f"{level.tpot_s:.4f}",
            f"{level.throughput_rps:.2f}",
            f"{level.output_tokens_per_s:.1f}",
            f"{level.queue_share:.0%}",
            f"{level.prefill_share:.0%}",
            f"{level.decode_share:.0%}",
            "meets" if level.meets else "misses",
            _decided(level),
        )
    return table


def _decided(level: LevelPrediction) -> str:
    """The level's verdict as a limit search would reach it, and the simulated time it takes."""
    decision = level.decision
    if decision is None:
        return "-"
    ended = ", simulation ended" if decision.why else ""
    return f"{decision.outcome} ({decision.seconds:.0f} s{ended})"


def _costs_for(costs: list[Path], count: int) -> list[Path | None]:
    if costs and len(costs) != count:
        raise ConfigError(
            f"{len(costs)} --costs file(s) for {count} model file(s)", "give one --costs per MODEL, in order"
        )
    return list(costs) if costs else [None] * count


def _curves(
    cli: CliContext,
    settings: Settings,
    files_given: list[tuple[Path, str, CostsFile | None]],
    shapes: WorkloadShapes,
    repeats: int,
    out: RunPaths | None,
) -> list[CostsFile]:
    """Each file's cost curves: the ones given, else measured by llama-batched-bench with the
    server's flags (and written to `out` as costs-<quant>.json)."""
    flags = server_flags_used(settings)
    toolchain: Toolchain | None = None
    curves = []
    for model, label, known in files_given:
        if known is not None:
            curves.append(known)
            continue
        if toolchain is None:
            with progress_bar(cli.err_console, "llama.cpp build") as progress:
                toolchain = ensure_toolchain(
                    settings.toolchain, cli.environ, progress, gpu_layers=settings.server.gpu_layers
                )
        npp, npl = measuring_grid(shapes, flags)
        with cli.err_console.status(
            f"llama-batched-bench {model.name}: -npp {','.join(map(str, npp))} -ntg {GEN_TOKENS}"
            f" -npl {','.join(map(str, npl))}, {repeats} run(s)"
        ):
            found = measure_costs(
                toolchain, model, npp, (GEN_TOKENS,), npl, flags.threads, flags.n_batch, flags.n_ubatch,
                repeats=repeats,
            )  # fmt: skip
        cli.err_console.print(describe(found), highlight=False)
        if out is not None:
            write_costs_file(out.costs_path_of(label), found)
        curves.append(found)
    return curves


def print_predictions(console: Console, predictions: list[FilePrediction]) -> None:
    for prediction in predictions:
        console.print(level_table(prediction))
        console.print(prediction.sentence(), highlight=False)
        for note in prediction.workload_notes:
            console.print(f"note: {note}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the `predict` command."""

    @app.command("predict")
    def predict(
        ctx: typer.Context,
        models: list[Path] = typer.Argument(..., help="One or more .gguf files.", metavar="MODEL"),
        costs: list[Path] = typer.Option(
            [], "--costs", help="A costs.json measured before, one per MODEL in order (skips measuring)."
        ),
        slots: int | None = typer.Option(None, "--slots", help="llama-server --parallel [8]."),
        ctx_per_slot: int | None = typer.Option(None, "--ctx-per-slot", help="Context per slot [4096]."),
        threads: int | None = typer.Option(None, "--threads", help="Threads [0 = llama.cpp's default]."),
        max_users: int = typer.Option(32, "--max-users", min=1, max=1024, help="Most users to simulate."),
        requests: int = typer.Option(
            2000, "--requests", min=50, max=100_000, help="Simulated requests per level."
        ),
        repeats: int = typer.Option(
            1, "--repeats", min=1, max=10, help="llama-batched-bench runs; each test keeps its fastest."
        ),
        slo_ttft: float | None = SLO_TTFT,
        slo_ttft_percentile: str | None = SLO_TTFT_PERCENTILE,
        slo_tpot: float | None = SLO_TPOT,
        slo_tpot_percentile: str | None = SLO_TPOT_PERCENTILE,
        confidence: float | None = CONFIDENCE,
        as_json: bool = typer.Option(False, "--json", help="Print predict.json's object."),
        out: Path | None = typer.Option(
            None, "--out", help="Folder for costs-<quant>.json and predict.json (created if absent)."
        ),
    ) -> None:
        """Predict each file's SLO limit (users) from its measured cost curves, without serving."""
        cli = cli_context(ctx)
        settings = cli.config(
            {
                "server.slots": slots,
                "server.ctx_per_slot": ctx_per_slot,
                "server.threads": threads,
                **slo_flags(slo_ttft, slo_ttft_percentile, slo_tpot, slo_tpot_percentile, confidence),
            }
        ).settings
        given = _costs_for(costs, len(models))
        for model in models:
            check_is_gguf(model)
        known = [load_costs_file(path) if path is not None else None for path in given]
        flags = server_flags_used(settings)
        shapes = workload_shapes(settings, cli.cwd)
        slo = Slo.of(settings.slo)
        labels = result_labels(models, [read_gguf(model).file_type for model in models])
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        files = RunPaths(out) if out is not None else None
        curves = _curves(cli, settings, list(zip(models, labels, known, strict=True)), shapes, repeats, files)
        predictions = []
        for label, found in zip(labels, curves, strict=True):
            with cli.err_console.status(f"simulating {label} at 1 to {max_users} users"):
                predictions.append(
                    predict_file(
                        label, found, flags, shapes, slo, max_users, requests, seed=settings.load.seed,
                        client=client_timing(settings),
                        search=(search_budget(settings), search_rules(settings)),
                    )
                )
        if files is not None:
            write_predict_file(files.predict_path, predictions)
        if as_json:
            typer.echo(json.dumps(predict_body(predictions), indent=2))
            return
        cli.console.print(f"workload: {shapes.source}; SLO {slo.text()}", highlight=False)
        print_predictions(cli.console, predictions)
        if files is not None:
            cli.console.print(f"written to {files.predict_path}", highlight=False)
