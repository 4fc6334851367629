"""`quantload speed`: llama-bench prefill and decode of GGUF files, beside this machine's roofline."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from quantload.cli.context import cli_context
from quantload.cli.progress_view import progress_bar
from quantload.cli.result_labels import result_labels, source_notes
from quantload.llamacpp.toolchain import ensure_toolchain
from quantload.models.gguf_meta import check_is_gguf, read_gguf
from quantload.paths import cache_root, check_out_file
from quantload.roofline.measure import measure_file_speed
from quantload.roofline.probe import MachineLimits, probe_in_cache
from quantload.roofline.speed_file import SpeedFile, busy_note, load_speed_file


def speed_table(speeds: SpeedFile) -> Table:
    """One row per file and test: measured tokens/s, the ceiling, the bound and the fraction."""
    table = Table(
        "quant", "test", "tokens/s", "+/- sd", "ceiling", "bound", "of ceiling", "MB/token", "device",
        title="llama-bench speed against the roofline of the device it ran on",
    )  # fmt: skip
    for label, entry in speeds.results.items():
        bench, roof = entry.bench, entry.roofline
        for test in (bench.prefill, bench.decode):
            ceiling = None if roof is None else roof.prefill if test is bench.prefill else roof.decode
            name = f"pp{test.n_prompt}" if test is bench.prefill else f"tg{test.n_gen}"
            table.add_row(
                label,
                name,
                f"{test.tokens_per_s:,.1f}",
                f"{test.stddev_tokens_per_s:,.1f}",
                f"{ceiling.ceiling_tokens_per_s:,.0f}" if ceiling else "-",
                ceiling.bound if ceiling else "-",
                f"{ceiling.fraction_of_ceiling:.0%}" if ceiling else "-",
                f"{ceiling.bytes_per_token / 1e6:,.2f}" if ceiling else "-",
                roof.device if roof else "GPU, limits unknown",
            )
    return table


def print_machine(console: Console, limits: MachineLimits) -> None:
    """The probe's two numbers and where they came from."""
    others = "unknown" if limits.other_cpu_frac is None else f"{limits.other_cpu_frac:.0%}"
    console.print(
        f"machine: memory bandwidth {limits.bandwidth_bytes_per_s / 1e9:.1f} GB/s, f32 arithmetic"
        f" {limits.arithmetic_flops_per_s / 1e9:.1f} GFLOP/s ({limits.source}, {limits.probed_at};"
        f" {limits.machine.usable_cpus} CPUs, other processes used {others} of them meanwhile)",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    """Add the `speed` command."""

    @app.command("speed")
    def speed(
        ctx: typer.Context,
        models: list[Path] = typer.Argument(..., help="One or more .gguf files.", metavar="MODEL"),
        prompt: int | None = typer.Option(None, "--prompt", help="Prefill test tokens [512]."),
        gen: int | None = typer.Option(None, "--gen", help="Decode test tokens [128]."),
        reps: int | None = typer.Option(None, "--reps", help="Repetitions of each test [5]."),
        threads: int | None = typer.Option(None, "--threads", help="Threads [0 = default]."),
        reprobe: bool = typer.Option(
            False, "--reprobe", help="Measure the machine again instead of using the cached probe."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the speed.json object."),
        out: Path | None = typer.Option(
            None, "--out", help="Add the results to this speed.json (created if absent)."
        ),
    ) -> None:
        """Measure pp/tg tokens/s with llama-bench and place them on this machine's roofline."""
        cli = cli_context(ctx)
        settings = cli.config(
            {
                "speed.prompt_tokens": prompt,
                "speed.gen_tokens": gen,
                "speed.reps": reps,
                "speed.threads": threads,
            }
        ).settings
        if out is not None and check_out_file(out).exists():
            load_speed_file(out)  # a file that is not a speed.json is refused before measuring
        for model in models:
            check_is_gguf(model)
        labels = result_labels(models, [read_gguf(model).file_type for model in models])
        with progress_bar(cli.err_console, "llama.cpp build") as progress:
            toolchain = ensure_toolchain(
                settings.toolchain, cli.environ, progress, gpu_layers=settings.server.gpu_layers
            )
        with cli.err_console.status("measuring memory bandwidth and arithmetic rate"):
            cache = cache_root(settings.toolchain.cache_dir, cli.environ)
            limits = probe_in_cache(cache, settings.speed, refresh=reprobe)
        speeds = SpeedFile()
        for model, label in zip(models, labels, strict=True):
            with progress_bar(cli.err_console, f"llama-bench {model.name}") as progress:
                entry = measure_file_speed(
                    toolchain, model, settings.speed, limits, label, progress, out
                )
            speeds = speeds.with_entry(label, entry, limits)
        if as_json:
            typer.echo(json.dumps(speeds.to_json(), indent=2))
            return
        cli.console.print(speed_table(speeds))
        for source_note in source_notes(models):
            cli.console.print(f"note: {source_note}", highlight=False)
        print_machine(cli.console, limits)
        note = busy_note(speeds)
        if note is not None:
            cli.console.print(note, style="yellow", highlight=False)
        for label, entry in speeds.results.items():
            said = entry.roofline.explanation if entry.roofline else f"no roofline: {entry.roofline_missing}"
            cli.console.print(f"{label}: {said}", highlight=False)
            if entry.roofline and entry.roofline.device != "cpu":
                cli.console.print(f"{label}: set against {entry.roofline.device_note}", highlight=False)
        if out is not None:
            cli.console.print(f"written to {out}", highlight=False)
