"""`quantload stack`: the compose stack seen through the Docker engine (ps, kv)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path, PurePosixPath
from typing import Annotated

import typer
from rich.table import Table

from quantload.cli.context import cli_context
from quantload.compose.containers import connect, default_project_name, project_containers
from quantload.compose.gpu_devices import assign_gpus
from quantload.compose.server_kv import check_servers, kv_json, put_file, run_folder_of
from quantload.errors import ConfigError
from quantload.gpus import read_gpu_inventory
from quantload.rundir import KV_JSON
from quantload.rundir.handle import RunDir

ProjectOption = Annotated[
    str | None,
    typer.Option("--project", "-p", help="Compose project name (default: as compose picks it here)."),
]


def register(app: typer.Typer) -> None:
    """Add the `stack` command group."""
    stack = typer.Typer(
        help="The compose stack's containers, their health, and the KV check from the servers' logs.",
        no_args_is_help=True,
    )
    app.add_typer(stack, name="stack")

    @stack.command("gpus")
    def gpus(ctx: typer.Context) -> None:
        """Lines for .env giving each server of the GPU override its own GPU (QL_GPU_DEVICE_*),
        from the GPUs NVML lists here; they share in turn when there are fewer."""
        cli_context(ctx)
        for line in assign_gpus(read_gpu_inventory()):
            typer.echo(line)

    @stack.command("ps")
    def ps(
        ctx: typer.Context,
        project: ProjectOption = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Every container of the stack: state, health, restarts, ports; exit 1 if any is in trouble."""
        cli = cli_context(ctx)
        name = project or default_project_name(cli.cwd, cli.environ)
        client = connect(cli.environ)
        ctx.call_on_close(client.close)
        states = [state for state, _ in project_containers(client, name)]
        if not states:
            raise ConfigError(
                f"no containers of compose project {name!r} on this engine",
                "start it with 'docker compose up -d', or name it with --project",
            )
        problems = {state.name: state.problem() for state in states}
        if as_json:
            rows = [{**state.__dict__, "ports": list(state.ports), "problem": problems[state.name]}
                    for state in states]  # fmt: skip
            typer.echo(json.dumps(rows, indent=2))
        else:
            table = Table(
                "service", "container", "status", "ports", "problem", title=f"compose project {name}"
            )
            for state in states:
                table.add_row(
                    state.service, state.name, state.status_text(), " ".join(state.ports),
                    problems[state.name] or "",
                )  # fmt: skip
            cli.console.print(table)
        if any(problems.values()):
            raise typer.Exit(1)

    @stack.command("kv")
    def kv(
        ctx: typer.Context,
        project: ProjectOption = None,
        out: Annotated[Path | None, typer.Option("--out", help="Also write kv.json here.")] = None,
        into_run: Annotated[
            bool,
            typer.Option("--into-run/--no-into-run", help="Write kv.json into the servers' run folder."),
        ] = True,
        run_folder: Annotated[
            str | None,
            typer.Option(
                "--run-folder",
                help="That run folder, as the containers see it (default: where the servers' logs go).",
            ),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print kv.json.")] = False,
    ) -> None:
        """Check each llama-server's KV cache: predicted from its GGUF header and command line,
        against what its log (since it last started) reports; the report reads the kv.json."""
        cli = cli_context(ctx)
        name = project or default_project_name(cli.cwd, cli.environ)
        client = connect(cli.environ)
        ctx.call_on_close(client.close)  # the containers below are read through it until the end
        pairs = project_containers(client, name)
        results = check_servers(pairs)
        if not results:
            raise ConfigError(
                f"no llama-server containers in compose project {name!r}",
                "start the stack with 'docker compose up -d', or name it with --project",
            )
        written: list[str] = []
        with tempfile.TemporaryDirectory(prefix="quantload-kv-") as tmp:
            fresh = RunDir(Path(tmp)).kv_path  # every server's check, nothing older
            kv_json(results, fresh)
            payload = json.loads(fresh.read_text(encoding="utf-8"))
            if into_run:
                by_name = {state.name: container for state, container in pairs}
                for result in results:  # the first running server that writes into a run folder
                    container = by_name[result.container]
                    folder = PurePosixPath(run_folder) if run_folder else run_folder_of(container)
                    if result.check is not None and folder is not None:
                        path = put_file(container, folder, KV_JSON, fresh.read_bytes())
                        written.append(f"{path} (in {result.container}'s volume)")
                        break
        if out is not None:
            kv_json(results, out)
            written.append(str(out))
        if as_json:
            typer.echo(json.dumps(payload, indent=2))
        else:
            table = Table("server", "quant", "predicted MiB", "reported MiB", "difference", title="KV cache")
            for r in results:
                if r.check is None:
                    table.add_row(r.service, r.label, "-", "-", str(r.error))
                    continue
                diff = r.check.diff_pct
                table.add_row(
                    r.service, r.label, f"{r.check.predicted_mib:.2f}",
                    f"{r.check.reported_mib:.2f}" if r.check.reported_mib is not None else "-",
                    f"{diff:+.2f} %" if diff is not None else "-",
                )  # fmt: skip
            cli.console.print(table)
            for where in written:
                cli.console.print(f"kv.json: {where}")
        if any(r.check is None for r in results):
            raise typer.Exit(1)
