"""`quantload kv`: predict the KV-cache size from GGUF metadata (or config.json) and check it."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from quantload import json_input
from quantload.cli.context import cli_context
from quantload.errors import ConfigError, ModelError
from quantload.kvcache import KvPrediction, kv_shape_from_gguf, kv_shape_from_hf_config, predict_kv
from quantload.kvcheck import KvCheck, kv_check_from_log, kv_check_with_server, merge_kv_file, unchecked_dict
from quantload.llamacpp.server import ServerSpec
from quantload.llamacpp.toolchain import ensure_toolchain
from quantload.models.gguf_meta import read_gguf


def _predict(model: Path, slots: int, ctx: int, type_k: str, type_v: str, unified: bool) -> KvPrediction:
    if model.suffix == ".json":
        try:
            config = json_input.loads(model.read_bytes())
        except (OSError, ValueError) as error:
            raise ModelError(f"cannot read {model}: {error}", "give a Hugging Face config.json") from None
        shape = kv_shape_from_hf_config(config, model.name)
    else:
        shape = kv_shape_from_gguf(read_gguf(model))
    return predict_kv(shape, slots, ctx, type_k, type_v, unified)


def register(app: typer.Typer) -> None:
    """Add the `kv` command."""

    @app.command("kv")
    def kv(
        ctx: typer.Context,
        model: Path = typer.Argument(..., help="A .gguf file, or a Hugging Face config.json."),
        slots: int | None = typer.Option(None, "--slots", help="Server slots (-np)."),
        ctx_per_slot: int | None = typer.Option(None, "--ctx-per-slot", help="Tokens per slot."),
        cache_type_k: str | None = typer.Option(None, "--cache-type-k", help="K cache type (-ctk)."),
        cache_type_v: str | None = typer.Option(None, "--cache-type-v", help="V cache type (-ctv)."),
        unified: bool | None = typer.Option(None, "--unified/--no-unified", help="One KV pool (-kvu)."),
        check: bool = typer.Option(False, "--check", help="Start llama-server and compare."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        log: Path | None = typer.Option(None, "--log", help="Where to keep the server log (--check)."),
        from_log: Path | None = typer.Option(
            None, "--from-log", help="Compare with the log of a server already started with -lv 4."
        ),
        out: Path | None = typer.Option(None, "--out", help="Merge the result into this kv.json."),
        label: str | None = typer.Option(None, "--label", help="Its key in --out (default: file type)."),
    ) -> None:
        """Predict the KV-cache size, show the formula, and optionally check it against llama-server."""
        cli = cli_context(ctx)
        settings = cli.config(
            {
                "server.slots": slots,
                "server.ctx_per_slot": ctx_per_slot,
                "server.cache_type_k": cache_type_k,
                "server.cache_type_v": cache_type_v,
                "server.kv_unified": unified,
            }
        ).settings
        server = settings.server
        prediction = _predict(
            model, server.slots, server.ctx_per_slot, server.cache_type_k, server.cache_type_v,
            server.kv_unified,
        )
        result = unchecked_dict(prediction)
        checked: KvCheck | None = None
        llama_cpp: dict[str, object] | None = None  # known when quantload starts the server itself
        if from_log is not None:
            try:
                text = from_log.read_text(encoding="utf-8", errors="replace")
            except OSError as error:
                raise ConfigError(
                    f"cannot read {from_log}: {error.strerror}", "check the --from-log path"
                ) from None
            checked = kv_check_from_log(prediction, text, from_log)
        elif check:
            if model.suffix == ".json":
                raise ConfigError("--check needs a .gguf model, not a config.json", "pass the GGUF file")
            toolchain = ensure_toolchain(settings.toolchain, cli.environ)
            llama_cpp = toolchain.version_record()
            log_path = log or Path(f"kv-check-{model.stem}.log")
            spec = ServerSpec.from_settings(server, model, model.stem)
            checked = kv_check_with_server(toolchain, spec, prediction, log_path, server.startup_timeout_s)
        if checked is not None:
            result = checked.as_dict()
        if out is not None:
            key = label or (read_gguf(model).file_type if model.suffix != ".json" else model.stem)
            merge_kv_file(
                out, key, checked if checked is not None else "not checked against a server", llama_cpp
            )
        if as_json:
            typer.echo(json.dumps(result, indent=2))
            return
        table = Table("factor", "value", title=f"KV cache of {model.name}")
        for key in ("n_layer", "n_head_kv", "head_dim_k", "head_dim_v", "slots", "ctx_per_slot",
                    "unified", "n_stream", "cells_per_stream", "cache_type_k", "type_size_k",
                    "cache_type_v", "type_size_v"):
            table.add_row(key, str(result[key]))
        table.add_row("predicted", f"{result['predicted_mib']:.2f} MiB")
        if checked is not None:
            table.add_row("reported by llama-server", f"{result['reported_mib']:.2f} MiB")
            table.add_row("difference", f"{result['diff_pct']:+.2f} %")
        cli.console.print(table)
        cli.console.print(prediction.formula(), highlight=False)
