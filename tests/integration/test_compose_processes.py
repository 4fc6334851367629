"""The compose stack checked by the tools themselves, without a Docker engine: a real compose
implementation's `config` (docker compose v2, else Debian's docker-compose 1.29.2) on the base file
and with the GPU and stand-in overrides, dclint's and hadolint's rules, Locust's own parser on
every Locust command, prometheus' flags, git for the wheels folder, and the prepare job's script
run by sh against a stand-in `quantload`.

dclint rules switched off (tests/integration/dclint.json): `require-project-name-field` (a
top-level `name` is rejected by docker-compose 1.29, and the project name follows the folder or
`-p`), `no-unbound-port-interfaces` and `require-quotes-in-ports` (dclint reads
`${QL_BIND_ADDRESS:-127.0.0.1}:...` without interpolating it; the bindings are checked in the unit
tests after interpolation), and the four ordering rules (the file follows the order of a run).

Moved from tests/unit/test_compose.py, whose other tests start no process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from compose.cli_args import check_quantload_argv
from compose.stack import (
    BASE_FILE,
    GPU_FILE,
    REPO,
    command_of,
    environment_of,
    example_env,
    interpolate_tree,
    is_quantload,
    read_yaml,
    services,
)
from compose.tools import (
    INSTALL_HINTS,
    compose_command,
    compose_schema,
    dclint_command,
    hadolint_command,
)

from quantload.llamacpp.sdist import PINNED_SDIST
from support import missing

pytestmark = pytest.mark.integration

DOCKERFILE = REPO / "services" / "quantload" / "Dockerfile"
LLAMA_DOCKERFILE = REPO / "services" / "llama.cpp" / "Dockerfile"
STANDIN_OVERRIDE = REPO / "tests" / "e2e" / "compose_e2e" / "docker-compose.standins.yml"
STANDIN_DOCKERFILES = sorted((REPO / "services" / "standins").glob("*/Dockerfile"))
PREPARE_SCRIPT = REPO / "services" / "quantload" / "prepare.sh"
DCLINT_CONFIG = Path(__file__).parent / "dclint.json"
SERVERS = {"llama-f16": "F16", "llama-q8-0": "Q8_0", "llama-q4-k-m": "Q4_K_M"}
LONG_RUNNING = {*SERVERS, "exporter", "prometheus", "grafana", "locust-master", "locust-worker"}
ON_DEMAND = {"load": "load", "report": "report"}
LLAMA_BUILD = f"b{PINNED_SDIST.version.split('.')[0]}"


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    """docker-compose.yml parsed, not interpolated."""
    return read_yaml(BASE_FILE)


@pytest.fixture(scope="module")
def stack(raw: dict[str, Any]) -> dict[str, Any]:
    """docker-compose.yml interpolated with .env.example's values."""
    resolved: dict[str, Any] = interpolate_tree(raw, example_env())
    return resolved


def _tool(command: list[str] | None, name: str) -> list[str]:
    if command is None:
        missing(f"{name} not installed ({INSTALL_HINTS[name]})")
    assert command is not None
    return command


def test_locust_commands_parse_with_the_locustfile(stack: dict[str, Any]) -> None:
    """Locust's own parser, with quantload's options registered by the locustfile: `--list` parses
    everything, then lists the user classes and exits without starting anything. Master and worker
    are checked at the same time."""
    processes: dict[str, subprocess.Popen[str]] = {}
    for name in ("locust-master", "locust-worker"):
        argv = command_of(services(stack)[name])
        assert argv[:3] == ["locust", "-f", "locustfiles/chat_stream.py"], name
        assert (REPO / argv[2]).is_file()
        environ = {k: v for k, v in os.environ.items() if not k.startswith("QUANTLOAD_")}
        environ.update(environment_of(services(stack)[name]))
        processes[name] = subprocess.Popen(
            [sys.executable, "-m", "locust", *argv[1:], "--list"],
            cwd=REPO, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    for name, process in processes.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, f"{name}: {err[-2000:]}"
        assert "ChatStreamUser" in out, name


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX only")
def test_prometheus_flags_exist(stack: dict[str, Any]) -> None:
    """Against the prometheus binary native mode uses, when installed (an older 2.x; the same flags)."""
    binary = subprocess.run(
        ["sh", "-c", "command -v prometheus"], capture_output=True, text=True, check=False
    )
    if binary.returncode != 0:
        missing("prometheus not installed (apt-get install prometheus)")
    text = subprocess.run(
        [binary.stdout.strip(), "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    help_text = text.stdout + text.stderr
    for arg in command_of(services(stack)["prometheus"]):
        assert arg.split("=", 1)[0] in help_text, arg


# ---------------------------------------------------------------- the stand-in override of the e2e


def _sorted_lists(node: Any) -> Any:
    """Lists of strings sorted: docker-compose 1.29's merge reorders volumes and ports."""
    if isinstance(node, dict):
        return {key: _sorted_lists(value) for key, value in node.items()}
    if isinstance(node, list):
        items = [_sorted_lists(item) for item in node]
        return sorted(items, key=json.dumps) if all(isinstance(i, str | dict) for i in items) else items
    return node


def _differences(left: Any, right: Any, path: str = "") -> list[str]:
    """Dotted paths where two parsed configurations differ."""
    if isinstance(left, dict) and isinstance(right, dict):
        found: list[str] = []
        for key in sorted(set(left) | set(right), key=str):
            found += _differences(left.get(key), right.get(key), f"{path}.{key}" if path else str(key))
        return found
    return [] if left == right else [path]


def test_the_standin_override_changes_only_images_and_build_arguments(tmp_path: Path) -> None:
    """The e2e runs the user's stack: merged with the override, only `image:` of the servers and
    Prometheus and our image's base-image build arguments (and PIP_NO_INDEX) differ."""
    profiles = ["load", "report"]
    base = _sorted_lists(_compose_config([BASE_FILE], profiles, tmp_path))
    merged = _sorted_lists(_compose_config([BASE_FILE, STANDIN_OVERRIDE], profiles, tmp_path))
    changed = _differences(base, merged)
    ours = [name for name, service in services(base).items() if is_quantload(service)]
    allowed = {f"services.{name}.image" for name in (*SERVERS, "prometheus")}
    allowed |= {f"services.{name}.build.args.{arg}" for name in ours
                for arg in ("PYTHON_IMAGE", "LLAMA_CPP_FULL_IMAGE", "PIP_NO_INDEX")}  # fmt: skip
    allowed.add("services.llama-tools.pull_policy")  # docker-compose 1.x rewrites it when files merge
    assert changed and set(changed) <= allowed, sorted(set(changed) - allowed)
    assert {f"services.{name}.image" for name in (*SERVERS, "prometheus")} <= set(changed)
    assert "grafana" in merged["services"], "Grafana is left out by the test's service list, not here"
    for name in SERVERS:
        assert merged["services"][name]["image"] == f"quantload-standin/llama.cpp:server-{LLAMA_BUILD}"


@pytest.mark.parametrize("path", STANDIN_DOCKERFILES, ids=lambda p: p.parent.name)
def test_standin_dockerfiles_pass_hadolint(path: Path) -> None:
    command = _tool(hadolint_command(), "hadolint")
    result = subprocess.run(
        [*command, "--no-color", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_wheels_folder_exists_in_a_fresh_clone() -> None:
    """services/quantload/Dockerfile copies it; only its README is committed."""
    tracked = subprocess.run(
        ["git", "ls-files", "services/quantload/wheels"], cwd=REPO, capture_output=True, text=True, check=False
    )
    if tracked.returncode != 0:
        missing("not a git checkout")
    assert tracked.stdout.split() == ["services/quantload/wheels/README.md"]


# ---------------------------------------------------------------- real validators


def _compose_config(files: list[Path], profiles: list[str], tmp_path: Path) -> dict[str, Any]:
    command = _tool(compose_command(), "compose")
    empty = tmp_path / "empty.env"  # a developer's own .env must not change what is checked
    empty.write_text("", encoding="utf-8")
    argv = [*command, "--env-file", str(empty)]
    for path in files:
        argv += ["-f", str(path)]
    for profile in profiles:
        argv += ["--profile", profile]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QL_", "COMPOSE_", "GRAFANA_", "LLAMA_"))}
    env["GRAFANA_ADMIN_PASSWORD"] = "not-a-real-password"
    result = subprocess.run(
        [*argv, "config"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded: dict[str, Any] = yaml.safe_load(result.stdout)
    return loaded


VARIANTS = {
    "base": [BASE_FILE],
    "gpu": [BASE_FILE, GPU_FILE],
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_compose_config_accepts_the_stack(variant: str, tmp_path: Path) -> None:
    config = _compose_config(VARIANTS[variant], ["load", "report"], tmp_path)
    measure = {"measure"} if variant == "gpu" else set()
    # docker-compose 1.x lists the build-only llama-tools (profile build) too; Compose v2 leaves it out
    assert set(config["services"]) - {"llama-tools"} == {"prepare", *LONG_RUNNING, *ON_DEMAND, *measure}
    for name in SERVERS:
        image = config["services"][name]["image"]
        assert ("server-cuda-" in image) == (variant == "gpu"), image
    schema = compose_schema()
    if schema is None:
        missing(f"Compose Specification schema not found ({INSTALL_HINTS['dclint']})")
    jsonschema.Draft7Validator(schema).validate(_json_safe(config))


def test_dclint_passes() -> None:
    command = _tool(dclint_command(), "dclint")
    result = subprocess.run(
        [*command, "-c", str(DCLINT_CONFIG), "--color", "false", str(BASE_FILE), str(GPU_FILE)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]


def _json_safe(node: Any) -> Any:
    """compose config output through JSON, as the schema sees documents (keys as strings)."""
    return json.loads(json.dumps(node, default=str))


# ---------------------------------------------------------------- the Dockerfile


def test_hadolint_passes() -> None:
    command = _tool(hadolint_command(), "hadolint")
    result = subprocess.run(
        [*command, "--no-color", str(DOCKERFILE), str(LLAMA_DOCKERFILE)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- the prepare job's script


STUB = """#!{python}
import json, pathlib, sys
args = sys.argv[1:]
with open({log!r}, "a", encoding="utf-8") as handle:
    handle.write(json.dumps(["quantload", *args]) + "\\n")
def value(option):
    return args[args.index(option) + 1]
if args[0] == "prepare":
    out = pathlib.Path(value("--out"))
    out.mkdir(parents=True, exist_ok=True)
    files = {{}}
    for quant in ("F16", "Q8_0", "Q4_K_M"):
        name = "stub-model-" + quant + ".gguf"
        (out / name).write_bytes(b"GGUF")
        files[quant] = {{"quant": quant, "file": name, "path": str(out / name)}}
    (out / "manifest.json").write_text(json.dumps({{"files": files}}))
elif args[0] in ("quality", "speed"):
    for model in args[1:args.index("--out")]:
        assert pathlib.Path(model).read_bytes() == b"GGUF", model
    pathlib.Path(value("--out")).write_text("{{}}")
"""


def _run_prepare(
    tmp_path: Path, **extra_env: str
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls.jsonl"
    stub = bin_dir / "quantload"
    stub.write_text(STUB.format(python=sys.executable, log=str(log)), encoding="utf-8")
    stub.chmod(0o755)
    python = bin_dir / "python"
    if not python.exists():
        python.symlink_to(sys.executable)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "QL_MODELS_DIR": str(tmp_path / "models"),
        "QL_RESULTS_DIR": str(tmp_path / "results"),
        "QL_RUN": "r1",
        "QL_MODEL": "tiny",
        **extra_env,
    }
    result = subprocess.run(
        ["sh", str(PREPARE_SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    calls = (
        [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []
    )
    return result, calls


def test_prepare_script_links_each_quantization_and_fills_the_run_folder(tmp_path: Path) -> None:
    result, calls = _run_prepare(tmp_path)
    assert result.returncode == 0, result.stderr
    models, run_dir = tmp_path / "models", tmp_path / "results" / "r1"
    for quant in ("F16", "Q8_0", "Q4_K_M"):
        link = models / f"{quant}.gguf"
        assert link.is_symlink() and os.readlink(link) == f"stub-model-{quant}.gguf"  # relative
    assert json.loads((run_dir / "manifest.json").read_text()) == json.loads(
        (models / "manifest.json").read_text()
    )
    assert (run_dir / "logs").is_dir()
    assert (run_dir / "quality.json").is_file() and (run_dir / "speed.json").is_file()
    assert [call[1] for call in calls] == ["prepare", "quality", "speed"]
    for call in calls:
        check_quantload_argv(call)  # every step is a real subcommand with real flags
    again, _ = _run_prepare(tmp_path)  # running it again replaces the links
    assert again.returncode == 0, again.stderr


def test_prepare_script_run_again_keeps_the_measurements_of_unchanged_files(tmp_path: Path) -> None:
    """Compose re-runs prepare before every `run load` (the servers depend on it): with the same
    files, quality and speed are kept; QL_REMEASURE=1 measures them again."""
    first, _ = _run_prepare(tmp_path)
    assert first.returncode == 0, first.stderr
    again, calls = _run_prepare(tmp_path)
    assert again.returncode == 0, again.stderr
    assert [call[1] for call in calls] == ["prepare", "quality", "speed", "prepare"]
    assert "kept" in again.stdout
    forced, calls = _run_prepare(tmp_path, QL_REMEASURE="1")
    assert forced.returncode == 0, forced.stderr
    assert [call[1] for call in calls][-3:] == ["prepare", "quality", "speed"]
    (tmp_path / "results" / "r1" / "speed.json").unlink()  # a missing result is measured again
    _, calls = _run_prepare(tmp_path)
    assert [call[1] for call in calls][-3:] == ["prepare", "quality", "speed"]


def test_prepare_script_without_measuring_only_makes_the_files_and_links(tmp_path: Path) -> None:
    """QL_MEASURE=0: what a Kubernetes server's init container runs (deploy/kubernetes/)."""
    result, calls = _run_prepare(tmp_path, QL_MEASURE="0")
    assert result.returncode == 0, result.stderr
    assert [call[1] for call in calls] == ["prepare"]
    assert (tmp_path / "models" / "Q4_K_M.gguf").is_symlink()
    assert not (tmp_path / "results").exists()


def test_prepare_script_goes_on_when_quality_cannot_be_measured(tmp_path: Path) -> None:
    """Offline, WikiText-2 cannot be fetched: the servers must still get their files."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "calls.jsonl").write_text("")
    stub = STUB.format(python=sys.executable, log=str(tmp_path / "calls.jsonl"))
    stub = stub.replace('elif args[0] in ("quality", "speed"):', 'elif args[0] == "quality":\n    sys.exit(2)\nelif args[0] == "speed":')
    (bin_dir / "quantload").write_text(stub, encoding="utf-8")
    (bin_dir / "quantload").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "QL_MODELS_DIR": str(tmp_path / "models"),
        "QL_RESULTS_DIR": str(tmp_path / "results"),
        "QL_RUN": "r1",
    }
    result = subprocess.run(["sh", str(PREPARE_SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "quality failed for some or all files" in result.stderr
    run_dir = tmp_path / "results" / "r1"
    assert not (run_dir / "quality.json").exists() and (run_dir / "speed.json").is_file()
    assert (tmp_path / "models" / "Q4_K_M.gguf").is_symlink()


def test_prepare_script_stops_at_the_first_failure(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "manifest.json").mkdir()  # unreadable manifest: the link step fails
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    failing = bin_dir / "quantload"
    failing.write_text('#!/bin/sh\n[ "$1" = prepare ] && exit 0\necho ran >> "$0.calls"\n', encoding="utf-8")
    failing.chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "QL_MODELS_DIR": str(tmp_path / "models"),
        "QL_RESULTS_DIR": str(tmp_path / "results"),
    }
    result = subprocess.run(["sh", str(PREPARE_SCRIPT)], env=env, capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert not (bin_dir / "quantload.calls").exists(), "quality/speed ran after a failed step"
