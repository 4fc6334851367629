"""The compose stack checked without a Docker engine.

What is checked, and with what:
- the files as compose reads them (anchors, `${VAR:-default}` interpolation with .env.example);
- a real compose implementation's `config` (docker compose v2, else Debian's docker-compose 1.29.2)
  on the base file and with the GPU override, then the Compose Specification JSON schema (shipped
  in the npm package dclint) on what it produced, and dclint's own rules;
- every command: quantload subcommands and flags through the real CLI, Locust's through Locust's
  own parser, llama-server's flags and LLAMA_* variables against the pinned llama.cpp source;
- ports, images, mounts, secrets, health and start order;
- the Dockerfile: hadolint, base images, build context, non-root user, tool folder; and the
  prepare job's script run against a stand-in `quantload`.

dclint rules switched off (tests/integration/dclint.json): `require-project-name-field` (a
top-level `name` is rejected by docker-compose 1.29, and the project name follows the folder or
`-p`), `no-unbound-port-interfaces` and `require-quotes-in-ports` (dclint reads
`${QL_BIND_ADDRESS:-127.0.0.1}:...` without interpolating it; the bindings are checked here after
interpolation), and the four ordering rules (the file follows the order of a run).

Its tests that start processes: tests/integration/test_compose_processes.py.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from compose.cli_args import BadParameter, UsageError, check_quantload_argv
from compose.dockerfile import DockerIgnore, copy_sources, env_assignments, parse_dockerfile
from compose.llama_args import arg_cpp_path, flags_in, parse_arg_cpp, server_env, server_flags
from compose.stack import (
    BASE_FILE,
    ENV_EXAMPLE,
    GPU_FILE,
    REPO,
    MissingVariable,
    all_strings,
    command_of,
    env_example,
    environment_of,
    example_env,
    interpolate,
    interpolate_tree,
    is_quantload,
    option_value,
    parse_port,
    read_yaml,
    references,
    services,
)
from compose.tools import (
    INSTALL_HINTS,
    compose_schema,
)

from fake_nvml import FakeGpu, FakeNvml
from quantload.compose.gpu_devices import assign_gpus, device_variable
from quantload.config import load_config
from quantload.errors import ConfigError
from quantload.gpus import read_gpu_inventory
from quantload.llamacpp.build import TOOL_NAMES
from quantload.llamacpp.sdist import PINNED_SDIST
from support import missing

DOCKERFILE = REPO / "services" / "quantload" / "Dockerfile"
LLAMA_DOCKERFILE = REPO / "services" / "llama.cpp" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"  # at the root: BuildKit and the classic builder both read it
STANDIN_OVERRIDE = REPO / "tests" / "e2e" / "compose_e2e" / "docker-compose.standins.yml"
PREPARE_SCRIPT = REPO / "services" / "quantload" / "prepare.sh"
SERVERS = {"llama-f16": "F16", "llama-q8-0": "Q8_0", "llama-q4-k-m": "Q4_K_M"}
LONG_RUNNING = {*SERVERS, "exporter", "prometheus", "grafana", "locust-master", "locust-worker"}
ON_DEMAND = {"load": "load", "report": "report"}
LLAMA_BUILD = f"b{PINNED_SDIST.version.split('.')[0]}"
LOOPBACK = "127.0.0.1"


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    """docker-compose.yml parsed, not interpolated."""
    return read_yaml(BASE_FILE)


@pytest.fixture(scope="module")
def gpu_raw() -> dict[str, Any]:
    """docker-compose.gpu.yml parsed, not interpolated."""
    return read_yaml(GPU_FILE)


@pytest.fixture(scope="module")
def stack(raw: dict[str, Any]) -> dict[str, Any]:
    """docker-compose.yml interpolated with .env.example's values."""
    resolved: dict[str, Any] = interpolate_tree(raw, example_env())
    return resolved


@pytest.fixture(scope="module")
def llama_options() -> Any:
    """llama-server's options from the pinned source tree, or a skip when it is not cached."""
    path = arg_cpp_path()
    if not path.is_file():
        missing(f"pinned llama.cpp source not cached ({path}): run 'quantload toolchain'")
    return parse_arg_cpp(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- the files and .env.example


def test_the_stack_has_every_service(raw: dict[str, Any]) -> None:
    assert set(services(raw)) == {"llama-tools", "prepare", *LONG_RUNNING, *ON_DEMAND}


def test_env_example_lists_every_variable_with_the_compose_default() -> None:
    texts = [BASE_FILE.read_text(encoding="utf-8"), GPU_FILE.read_text(encoding="utf-8")]
    used = [ref for text in texts for ref in references(text)]
    documented = env_example()
    assert {ref.name for ref in used} == set(documented), "compose variables and .env.example differ"
    for ref in used:
        if ref.operator in (":-", "-"):
            assert documented[ref.name] == ref.default, f"{ref.name}: .env.example and compose disagree"
    # The two secrets have no value anywhere; everything else has a default in the files.
    assert documented["GRAFANA_ADMIN_PASSWORD"] == "" and documented["LLAMA_API_KEY"] == ""
    unguarded = {ref.name for ref in used if ref.operator == ""}
    assert not unguarded, f"variables without a default: {unguarded}"


def test_env_example_explains_every_variable() -> None:
    lines = ENV_EXAMPLE.read_text(encoding="utf-8").splitlines()
    for index, line in enumerate(lines):
        if line and not line.startswith("#"):
            # each assignment sits under a comment, possibly after sibling assignments
            above = reversed(lines[:index])
            first_non_assignment = next(row for row in above if not re.match(r"^[A-Z_0-9]+=", row))
            assert first_non_assignment.startswith("#"), f"no comment above {line!r}"


def test_interpolating_with_nothing_set_equals_the_example(raw: dict[str, Any]) -> None:
    """.env.example is documentation of the defaults, not a requirement (bar the password)."""
    bare = interpolate_tree(raw, {"GRAFANA_ADMIN_PASSWORD": "not-a-real-password"})
    assert bare == interpolate_tree(raw, example_env())


def test_grafana_refuses_to_start_without_a_password(raw: dict[str, Any]) -> None:
    with pytest.raises(MissingVariable, match="GRAFANA_ADMIN_PASSWORD"):
        interpolate_tree(raw, {})
    grafana = raw["services"]["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "${GRAFANA_ANONYMOUS_VIEWER:-false}"
    assert grafana["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


# ---------------------------------------------------------------- ports, images, mounts


@pytest.mark.parametrize("path", [BASE_FILE, GPU_FILE], ids=lambda p: p.name)
def test_every_published_port_binds_to_loopback_by_default(path: Path) -> None:
    resolved = interpolate_tree(read_yaml(path), example_env())
    published = 0
    for name, service in services(resolved).items():
        assert service.get("network_mode") != "host", f"{name} uses the host network"
        for entry in service.get("ports", []):
            binding = parse_port(entry)
            assert binding.host_ip == LOOPBACK, f"{name}: {entry!r} does not bind to {LOOPBACK}"
            published += 1
    raw_text = path.read_text(encoding="utf-8")
    for entry in re.findall(r'^\s*- "(\$\{QL_BIND_ADDRESS[^"]*)"', raw_text, flags=re.M):
        assert entry.startswith("${QL_BIND_ADDRESS:-127.0.0.1}:"), entry
    if path == BASE_FILE:
        assert published == 7  # three servers, Prometheus, Grafana, Locust UI and master


def test_published_host_ports_do_not_collide(stack: dict[str, Any]) -> None:
    ports = [parse_port(e).host_port for s in services(stack).values() for e in s.get("ports", [])]
    assert len(ports) == len(set(ports)), ports
    assert "locust-worker" not in {n for n, s in services(stack).items() if s.get("ports")}


def _images(data: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for name, service in services(data).items():
        if "image" in service:
            yield name, str(service["image"])
    for name, service in services(data).items():
        for key, value in (service.get("build") or {}).get("args", {}).items():
            if key.endswith("_IMAGE"):
                yield f"{name} build arg {key}", str(value)


@pytest.mark.parametrize("path", [BASE_FILE, GPU_FILE], ids=lambda p: p.name)
def test_every_image_is_pinned(path: Path) -> None:
    resolved = interpolate_tree(read_yaml(path), example_env())
    for where, image in _images(resolved):
        repository, sep, tag = image.rpartition(":")
        assert sep and "/" not in tag, f"{where}: {image} has no tag"
        assert tag not in {"latest", "stable", "edge", "nightly"}, f"{where}: {image}"
        assert re.search(r"\d", tag), f"{where}: {image} has no version in its tag"
        if "llama.cpp" in repository:
            assert tag.endswith(f"-{LLAMA_BUILD}"), f"{where}: {image} is not llama.cpp {LLAMA_BUILD}"


def test_llama_cpp_images_match_the_native_pin(stack: dict[str, Any], gpu_raw: dict[str, Any]) -> None:
    """The servers, the tools in our image and the GPU servers are all the sdist's build, built here
    from it (no upstream tag is assumed to exist); one variable takes upstream's instead."""
    gpu = interpolate_tree(gpu_raw, example_env())
    found = {image for _, image in _images(stack) if "llama.cpp" in image}
    found |= {image for _, image in _images(gpu) if "llama.cpp" in image}
    prefix = "quantload/llama.cpp:"
    assert found == {
        f"{prefix}server-{LLAMA_BUILD}",
        f"{prefix}full-{LLAMA_BUILD}",
        f"{prefix}server-cuda-{LLAMA_BUILD}",
    }
    built = {name: service["build"] for name, service in services(stack).items() if "llama.cpp" in service.get("image", "")}
    assert set(built) == {*SERVERS, "llama-tools"}
    for name, build in built.items():
        assert build["dockerfile"] == "services/llama.cpp/Dockerfile", name
        assert build["target"] == ("full" if name == "llama-tools" else "server"), name
    assert services(stack)["llama-tools"]["profiles"] == ["build"]  # built, never started
    upstream = interpolate_tree(read_yaml(BASE_FILE), {**example_env(), "QL_LLAMA_IMAGES": "ghcr.io/ggml-org/llama.cpp"})
    assert {image for _, image in _images(upstream) if "llama.cpp" in image} == {
        f"ghcr.io/ggml-org/llama.cpp:server-{LLAMA_BUILD}", f"ghcr.io/ggml-org/llama.cpp:full-{LLAMA_BUILD}"
    }


def test_the_llama_cpp_image_builds_the_pinned_sdist_for_the_cpu_or_cuda(gpu_raw: dict[str, Any]) -> None:
    dockerfile = parse_dockerfile(LLAMA_DOCKERFILE)
    assert [stage.name for stage in dockerfile.stages] == ["build", "full", "server"]
    build = dockerfile.stages[0]
    assert f"SDIST={PINNED_SDIST.requirement}" in " ".join(i.text for i in build.of("ARG"))
    built = " ".join(i.text for i in build.of("RUN"))
    for tool in TOOL_NAMES:
        assert tool in built, tool
    assert "-DGGML_NATIVE=OFF" in built and "-DGGML_BACKEND_DL=ON" in built  # runs on any CPU like it
    assert dockerfile.global_args["BUILD_IMAGE"] == dockerfile.global_args["RUNTIME_IMAGE"]
    assert dockerfile.global_args["BUILD_IMAGE"] == parse_dockerfile(DOCKERFILE).global_args["PYTHON_IMAGE"]
    server = dockerfile.stages[2]
    assert [i.text for i in server.of("ENTRYPOINT")] == ['["/app/llama-server"]']
    gpu = interpolate_tree(gpu_raw, example_env())
    args = services(gpu)["llama-q4-k-m"]["build"]["args"]
    assert args["BUILD_IMAGE"] == "nvidia/cuda:12.8.1-devel-ubuntu24.04"  # upstream's cuda.Dockerfile's
    assert args["RUNTIME_IMAGE"] == "nvidia/cuda:12.8.1-runtime-ubuntu24.04"
    assert "-DGGML_CUDA=ON" in args["BACKEND_FLAGS"]
    assert "-DCMAKE_CUDA_ARCHITECTURES=80;86;89;90" in args["BACKEND_FLAGS"]


def test_our_image_is_tagged_with_the_package_version(stack: dict[str, Any]) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    ours = {service["image"] for service in services(stack).values() if is_quantload(service)}
    assert ours == {f"quantload:{version}"}
    for name, service in services(stack).items():
        if is_quantload(service):
            assert service["build"]["dockerfile"] == "services/quantload/Dockerfile", name
            assert (REPO / service["build"]["context"]).resolve() == REPO


def test_every_mount_exists_and_every_volume_is_declared(stack: dict[str, Any]) -> None:
    declared = set(stack.get("volumes") or {})
    used: set[str] = set()
    for name, service in services(stack).items():
        for entry in service.get("volumes", []):
            source, target = str(entry).split(":")[:2]
            assert target.startswith("/"), f"{name}: {entry}"
            if source.startswith((".", "/")):
                assert not source.startswith("/"), f"{name}: absolute host path {source}"
                assert (REPO / source).exists(), f"{name}: {source} is not in the repository"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"
                used.add(source)
    assert used == declared, f"declared but unused volumes: {declared - used}"


def test_prometheus_and_grafana_mount_the_native_files(stack: dict[str, Any]) -> None:
    prometheus = services(stack)["prometheus"]
    assert "./prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    config_flag = next(a for a in command_of(prometheus) if a.startswith("--config.file="))
    assert config_flag == "--config.file=/etc/prometheus/prometheus.yml"
    config = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    for rule_file in config["rule_files"]:
        assert (REPO / "prometheus" / rule_file).is_file(), rule_file
    grafana = services(stack)["grafana"]
    mounts = {str(v).split(":")[0]: str(v).split(":")[1] for v in grafana["volumes"]}
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = yaml.safe_load(
        (REPO / "grafana" / "provisioning" / "dashboards" / "quantload.yml").read_text(encoding="utf-8")
    )
    assert mounts["./grafana/dashboards"] == provider["providers"][0]["options"]["path"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (REPO / "grafana" / "dashboards" / Path(home).name).is_file()
    datasource = yaml.safe_load(
        (REPO / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text(encoding="utf-8")
    )
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


# ---------------------------------------------------------------- what Prometheus scrapes


def _scrape_targets() -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
    config = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    static: set[tuple[str, int]] = set()
    dns: set[tuple[str, int]] = set()
    for job in config["scrape_configs"]:
        for group in job.get("static_configs", []):
            for target in group["targets"]:
                host, _, port = target.partition(":")
                static.add((host, int(port)))
        for sd in job.get("dns_sd_configs", []):
            dns.update((name, int(sd["port"])) for name in sd["names"])
    return static, dns


def test_prometheus_scrape_addresses_are_services_of_the_stack(stack: dict[str, Any]) -> None:
    static, dns = _scrape_targets()
    named = services(stack)
    exporter = command_of(named["exporter"])
    master = command_of(named["locust-master"])
    assert ("exporter", int(option_value(exporter, "--port"))) in static
    assert option_value(exporter, "--host") == "0.0.0.0"
    assert ("locust-master", int(option_value(master, "--ql-metrics-port"))) in static
    assert ("localhost", 9090) in static  # Prometheus itself
    # Load generators are found by DNS: every locust-worker replica, and the `load` job by alias.
    (dns_name, dns_port) = next(iter(dns))
    assert dns == {(dns_name, dns_port)} and dns_name == "locust-worker"
    assert dns_name in named
    assert int(option_value(command_of(named["locust-worker"]), "--ql-metrics-port")) == dns_port
    assert named["load"]["networks"]["default"]["aliases"] == [dns_name]
    assert int(option_value(command_of(named["load"]), "--metrics-port")) == dns_port
    for name in ("locust-master", "locust-worker", "load"):
        assert environment_of(named[name])["QUANTLOAD_LOAD__METRICS_HOST"] == "0.0.0.0"


def test_the_exporter_reads_every_server_and_its_log(stack: dict[str, Any]) -> None:
    command = command_of(services(stack)["exporter"])
    targets = [command[i + 1] for i, arg in enumerate(command) if arg == "--target"]
    seen: dict[str, str] = {}
    for spec in targets:
        name, _, rest = spec.partition("=")
        url, *options = rest.split(",")
        fields = dict(option.split("=", 1) for option in options)
        assert url == f"http://{name}:8080", spec
        seen[name] = fields["quant"]
        log = environment_of(services(stack)[name])["LLAMA_ARG_LOG_FILE"]
        assert fields["log"] == log, f"{name}: the exporter reads another log than the server writes"
    assert seen == SERVERS


# ---------------------------------------------------------------- commands


def _quantload_commands(stack: dict[str, Any]) -> dict[str, list[str]]:
    return {
        name: command_of(service)
        for name, service in services(stack).items()
        if is_quantload(service) and command_of(service)[0] == "quantload"
    }


def test_quantload_services_run_real_subcommands_with_real_flags(stack: dict[str, Any]) -> None:
    commands = _quantload_commands(stack)
    assert set(commands) == {"exporter", "load", "report"}
    for name, argv in commands.items():
        try:
            check_quantload_argv(argv)
        except UsageError as error:
            pytest.fail(f"{name}: {shlex.join(argv)}: {error.format_message()}")


def test_the_cli_check_catches_a_wrong_flag() -> None:
    with pytest.raises(UsageError, match="No such option"):
        check_quantload_argv(["quantload", "exporter", "--target", "a=http://a:1", "--no-such-flag"])
    with pytest.raises(UsageError, match="no such quantload subcommand"):
        check_quantload_argv(["quantload", "no-such-command"])
    with pytest.raises(BadParameter):
        check_quantload_argv(["quantload", "exporter", "--port", "not-a-number"])


def test_the_load_job_names_match_the_exporter(stack: dict[str, Any]) -> None:
    params = check_quantload_argv(_quantload_commands(stack)["load"])
    assert params["url"] == [f"http://{name}:8080" for name in SERVERS]
    assert params["name"] == list(SERVERS) and params["quant"] == list(SERVERS.values())
    assert params["experiment"] == ["sweep", "prefix_cache"]
    report = check_quantload_argv(_quantload_commands(stack)["report"])
    assert str(report["run_dir"]) == str(params["out"]) == "/results/compose"
    assert report["prometheus"] == "http://prometheus:9090"


def test_the_load_job_annotates_the_stack_grafana_as_its_admin(raw: dict[str, Any], tmp_path: Path) -> None:
    """The load job pushes stage annotations to the compose Grafana with the admin's own login."""
    password = "p,1=x/y+z"  # a comma: the environment layer must not split it into a list
    stack = interpolate_tree(raw, example_env(GRAFANA_ADMIN_USER="ops", GRAFANA_ADMIN_PASSWORD=password))
    grafana = environment_of(services(stack)["grafana"])
    environ = {k: v for k, v in environment_of(services(stack)["load"]).items() if k.startswith("QUANTLOAD_")}
    observe = load_config(tmp_path, environ).settings.observe
    assert observe.grafana_url == "http://grafana:3000"
    assert any(str(p).endswith(":3000") for p in services(stack)["grafana"]["ports"])
    assert observe.grafana_user == grafana["GF_SECURITY_ADMIN_USER"] == "ops"
    assert observe.grafana_password is not None
    assert observe.grafana_password.get_secret_value() == grafana["GF_SECURITY_ADMIN_PASSWORD"] == password
    assert observe.grafana_token is None
    texts = [" ".join(all_strings(s.get("command", []))) for s in services(stack).values()]
    assert not any(password in text for text in texts), "the password must not be on a command line"


def test_servers_allow_slot_actions_in_a_folder_every_image_has(stack: dict[str, Any]) -> None:
    """--slot-save-path enables POST /slots/{id}?action=erase (the prompt-cache experiment); llama-server
    refuses to start when the folder does not exist, so it is /tmp, not a folder of our own."""
    for name in SERVERS:
        assert option_value(command_of(services(stack)[name]), "--slot-save-path") == "/tmp", name


def test_quantload_environment_is_valid_configuration(stack: dict[str, Any], tmp_path: Path) -> None:
    """Every QUANTLOAD_* variable given to a container is a key quantload accepts."""
    for name, service in services(stack).items():
        if not is_quantload(service):
            continue
        environ = {k: v for k, v in environment_of(service).items() if k.startswith("QUANTLOAD_")}
        settings = load_config(tmp_path, environ).settings
        assert settings.load.metrics_host == "0.0.0.0", name
        assert settings.server.api_key is None or settings.server.api_key.get_secret_value() == "", name


def test_an_api_key_reaches_servers_and_every_client(raw: dict[str, Any]) -> None:
    with_key = interpolate_tree(raw, example_env(LLAMA_API_KEY="k-123"))
    api_key_env = _locust_api_key_variable()
    for name, service in services(with_key).items():
        environment = environment_of(service)
        if name in SERVERS:
            assert environment["LLAMA_API_KEY"] == "k-123", name
        elif is_quantload(service):
            assert environment["QUANTLOAD_SERVER__API_KEY"] == "k-123", name
    assert environment_of(services(with_key)["locust-worker"])[api_key_env] == "k-123"
    texts = [" ".join(all_strings(s.get("command", []))) for s in services(with_key).values()]
    assert not any("k-123" in text for text in texts), "the key must not be on a command line"


def _locust_api_key_variable() -> str:
    """API_KEY_ENV of quantload.load.plan (the load processes read it), read without importing."""
    source = (REPO / "src" / "quantload" / "load" / "plan.py").read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "API_KEY_ENV" for t in node.targets
        ):
            assert isinstance(node.value, ast.Constant)
            return str(node.value.value)
    raise AssertionError("API_KEY_ENV not found")


def test_locust_workers_label_records_like_the_master(stack: dict[str, Any]) -> None:
    """Interactive workers build their own requests, so they need the master's --ql-* labels."""
    master = command_of(services(stack)["locust-master"])
    worker = command_of(services(stack)["locust-worker"])
    for option in ("--ql-server", "--ql-quant", "--ql-model", "--ql-run-id", "--ql-metrics-port"):
        assert option_value(worker, option) == option_value(master, option), option
    assert option_value(master, "--host") == f"http://{option_value(master, '--ql-server')}:8080"
    assert option_value(worker, "--master-host") == "locust-master"


def test_llama_server_flags_exist_in_the_pinned_source(stack: dict[str, Any], llama_options: Any) -> None:
    flags = server_flags(llama_options)
    variables = server_env(llama_options)
    for name in SERVERS:
        service = services(stack)[name]
        argv = command_of(service)
        unknown = [flag for flag in flags_in(argv) if flag not in flags]
        assert not unknown, f"{name}: llama-server has no {unknown}"
        for variable in environment_of(service):
            assert variable in variables, f"{name}: llama-server reads no {variable}"
    assert {"-np", "-c", "--metrics", "-lv"} <= set(argv)
    assert option_value(argv, "-np") == "8" and option_value(argv, "-c") == str(8 * 4096)
    assert option_value(argv, "-lv") == "4"
    assert "-kvu" not in argv  # 8 separate slots of 4,096 tokens, as native mode runs them


def test_the_source_check_catches_a_wrong_flag(llama_options: Any) -> None:
    flags = server_flags(llama_options)
    assert "--no-such-flag" not in flags
    assert "--kl-divergence" not in flags  # a llama-perplexity option
    assert {"-m", "--metrics", "-ngl"} <= flags


def test_every_server_loads_its_own_quantization(stack: dict[str, Any]) -> None:
    for name, quant in SERVERS.items():
        environment = environment_of(services(stack)[name])
        assert environment["LLAMA_ARG_MODEL"] == f"/models/{quant}.gguf"
        assert environment["LLAMA_ARG_LOG_FILE"] == f"/results/compose/logs/llama-server-{quant}.log"


def test_python_healthchecks_compile(stack: dict[str, Any]) -> None:
    for name, service in services(stack).items():
        test = service.get("healthcheck", {}).get("test", [])
        if test[:3] == ["CMD", "python", "-c"]:
            compile(test[3], f"<{name} healthcheck>", "exec")


def test_the_exporter_healthcheck_does_not_scrape(stack: dict[str, Any]) -> None:
    """Any GET to the exporter reads every server's /metrics, resetting llama-server's throughput
    gauges between Prometheus's scrapes; the healthcheck only opens a connection."""
    test = services(stack)["exporter"]["healthcheck"]["test"]
    port = option_value(command_of(services(stack)["exporter"]), "--port")
    assert "create_connection" in test[3] and port in test[3]
    assert not any(word in test[3] for word in ("urlopen", "http", "/metrics")), test


# ---------------------------------------------------------------- order, health, profiles


def test_start_order_and_health(stack: dict[str, Any]) -> None:
    named = services(stack)
    for name in SERVERS:
        assert named[name]["depends_on"] == {"prepare": {"condition": "service_completed_successfully"}}
        assert "/health" in " ".join(named[name]["healthcheck"]["test"])
    for name in ("exporter", "locust-master", "load"):
        assert named[name]["depends_on"] == {s: {"condition": "service_healthy"} for s in SERVERS}, name
    assert named["locust-worker"]["depends_on"] == {"locust-master": {"condition": "service_healthy"}}
    assert named["grafana"]["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    for name in LONG_RUNNING - {"locust-worker"}:
        assert "healthcheck" in named[name], f"{name} has no healthcheck"
    for name in LONG_RUNNING:
        assert named[name].get("restart") == "unless-stopped", name
        assert "profiles" not in named[name], name
    for name, profile in ON_DEMAND.items():
        assert named[name]["profiles"] == [profile] and "restart" not in named[name]
    assert "restart" not in named["prepare"] and "profiles" not in named["prepare"]


# ---------------------------------------------------------------- the GPU override


def test_gpu_override_swaps_image_layers_and_reservation(gpu_raw: dict[str, Any], llama_options: Any) -> None:
    gpu = interpolate_tree(gpu_raw, example_env())
    assert set(services(gpu)) == {*SERVERS, "exporter", "llama-tools", "prepare", "measure", "load"}
    # the exporter reads the GPUs through NVML: the utility capability, no compute
    exporter = services(gpu)["exporter"]
    assert set(exporter) == {"deploy"}
    (device,) = exporter["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": "all", "capabilities": ["utility"]}
    variables = server_env(llama_options)
    for name, quant in SERVERS.items():
        service = services(gpu)[name]
        assert service["image"] == f"quantload/llama.cpp:server-cuda-{LLAMA_BUILD}"
        assert environment_of(service) == {"LLAMA_ARG_N_GPU_LAYERS": "all"}
        assert "-ngl" in variables["LLAMA_ARG_N_GPU_LAYERS"].flags
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia", name
        # its own GPU by id (QL_GPU_DEVICE_<QUANT>), never a count: compose turns a count into 0..N-1
        assert "count" not in device and device["device_ids"] == ["0"], name
        assert f"QL_GPU_DEVICE_{quant}" in json.dumps(services(gpu_raw)[name]), name
        assert "command" not in service, f"{name}: keep the base command; -ngl comes as a variable"


def test_on_the_gpu_box_the_servers_start_before_the_measurements(gpu_raw: dict[str, Any]) -> None:
    gpu = interpolate_tree(gpu_raw, example_env())
    named = services(gpu)
    assert named["prepare"] == {"environment": {"QL_MEASURE": "0"}}  # files and links only
    assert named["measure"]["command"] == ["quantload-prepare"]
    assert named["measure"]["depends_on"] == {s: {"condition": "service_healthy"} for s in SERVERS}
    assert named["load"]["depends_on"] == {"measure": {"condition": "service_completed_successfully"}}
    assert named["load"]["environment"] == {"QUANTLOAD_OBSERVE__IDLE_BASELINE": "on"}


def test_each_server_gets_its_own_gpu_when_there_are_enough() -> None:
    three = read_gpu_inventory(FakeNvml([FakeGpu(uuid=f"GPU-{i}") for i in range(3)]).loader)
    lines = [line for line in assign_gpus(three) if not line.startswith("#")]
    assert lines == ["QL_GPU_DEVICE_F16=0", "QL_GPU_DEVICE_Q8_0=1", "QL_GPU_DEVICE_Q4_K_M=2"]
    one = assign_gpus(read_gpu_inventory(FakeNvml([FakeGpu(uuid="GPU-0")]).loader))
    assert [line for line in one if not line.startswith("#")] == [f"{device_variable(q)}=0" for q in SERVERS.values()]
    assert any("they share" in line for line in one)
    with pytest.raises(ConfigError, match="no GPU"):
        assign_gpus(read_gpu_inventory(FakeNvml(init_error=12).loader))


def test_the_standin_override_is_small_and_touches_known_services() -> None:
    override = read_yaml(STANDIN_OVERRIDE)
    keys = {key for service in services(override).values() for key in service}
    assert keys <= {"image", "build"}, keys
    for service in services(override).values():
        assert set(service.get("build", {})) <= {"args"}


def test_llama_standin_keeps_upstream_entrypoints_and_layout() -> None:
    """The compose commands run unchanged on it: /app/llama-*, the entrypoints, LLAMA_ARG_HOST, curl."""
    dockerfile = parse_dockerfile(REPO / "services" / "standins" / "llama.cpp" / "Dockerfile")
    server, full = dockerfile.stage("server"), dockerfile.stage("full")
    assert server.of("ENTRYPOINT")[0].text.strip() == '["/app/llama-server"]'
    assert full.of("ENTRYPOINT")[0].text.strip() == '["/app/tools.sh"]'
    env: dict[str, str] = {}
    for instruction in server.of("ENV"):
        env.update(env_assignments(instruction))
    assert env == {"LLAMA_ARG_HOST": "0.0.0.0"}
    assert '"curl", "-f", "http://localhost:8080/health"' in server.of("HEALTHCHECK")[0].text


@pytest.mark.parametrize("path", [BASE_FILE, GPU_FILE], ids=lambda p: p.name)
def test_files_match_the_compose_specification_schema(path: Path) -> None:
    schema = compose_schema()
    if schema is None:
        missing(f"Compose Specification schema not found ({INSTALL_HINTS['dclint']})")
    jsonschema.Draft7Validator(schema).validate(read_yaml(path))


def test_the_schema_check_catches_a_mistake() -> None:
    schema = compose_schema()
    if schema is None:
        missing(f"Compose Specification schema not found ({INSTALL_HINTS['dclint']})")
    broken = read_yaml(BASE_FILE)
    broken["services"]["prometheus"]["healthcheck"]["retry"] = 3  # a misspelt key
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(broken)


def test_dockerfile_bases_are_pinned() -> None:
    dockerfile = parse_dockerfile(DOCKERFILE)
    bases = [dockerfile.resolve(stage.base) for stage in dockerfile.stages]
    python, llama = dockerfile.global_args["PYTHON_IMAGE"], dockerfile.global_args["LLAMA_CPP_FULL_IMAGE"]
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-[a-z]+", python), python  # full version and distro
    assert llama == f"quantload/llama.cpp:full-{LLAMA_BUILD}"
    assert bases == [llama, python, python]
    assert dockerfile.stages[0].name == "llama-tools" and dockerfile.stages[1].name == "build"


def test_dockerfile_copies_only_what_the_context_sends() -> None:
    ignore = DockerIgnore(DOCKERIGNORE)
    copied = 0
    for stage in [*parse_dockerfile(DOCKERFILE).stages, *parse_dockerfile(LLAMA_DOCKERFILE).stages]:
        for instruction in stage.of("COPY"):
            flags, sources, _ = copy_sources(instruction)
            if "from" in flags:
                continue
            for source in sources:
                assert (REPO / source).exists(), f"line {instruction.line}: {source} is not in the repository"
                assert ignore.sends(source.rstrip("/")), f"line {instruction.line}: {source} is ignored"
                copied += 1
    assert copied >= 5
    for heavy in (".venv", ".git", "results", "tests", "grafana/dashboards", ".env", "services/standins"):
        assert not ignore.sends(heavy), f"{heavy} would be sent to the build"
    assert ignore.sends("services/quantload/wheels/numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert not (REPO / "services" / "quantload" / "Dockerfile.dockerignore").exists(), (
        "a Dockerfile-specific ignore file is read by BuildKit only; keep the one at the root"
    )
    assert ignore.sends("src/quantload/cli/main.py")
    assert not ignore.sends("src/quantload/__pycache__/x.pyc")


def test_dockerfile_runs_as_an_unprivileged_user_with_the_tools_on_hand(tmp_path: Path) -> None:
    dockerfile = parse_dockerfile(DOCKERFILE)
    final = dockerfile.final
    users = final.of("USER")
    assert len(users) == 1, "one USER, after every step that needs root"
    uid, _, gid = users[0].text.partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0
    after_user = [i for i in final.instructions if i.line > users[0].line]
    assert not any(i.keyword == "RUN" and "apt-get" in i.text for i in after_user)
    assert [i.keyword for i in final.instructions][-1] == "CMD"
    # The four tools the toolchain expects are copied, with the shared libraries beside them.
    (tools_run,) = dockerfile.stage("llama-tools").of("RUN")
    for tool in TOOL_NAMES:
        assert f"/app/{tool}" in tools_run.text, tool
    assert "/app/*.so*" in tools_run.text
    tools_copy = next(i for i in final.of("COPY") if copy_sources(i)[0].get("from") == "llama-tools")
    destination = copy_sources(tools_copy)[2].rstrip("/")
    env: dict[str, str] = {}
    for instruction in final.of("ENV"):
        env.update(env_assignments(instruction))
    assert env["QUANTLOAD_LLAMA_BIN"] == destination and env["LD_LIBRARY_PATH"] == destination
    quantload_env = {k: v for k, v in env.items() if k.startswith("QUANTLOAD_")}
    config = load_config(tmp_path, quantload_env)  # every QUANTLOAD_* is a real setting
    assert str(config.settings.toolchain.llama_bin) == destination
    # The folders named volumes mount on belong to that user, so new volumes do too.
    setup = next(i for i in final.of("RUN") if "useradd" in i.text)
    assert f"--uid {uid}" in setup.text
    for folder in ("/models", "/results", "/home/quantload/.cache"):
        assert folder in setup.text.split("chown", 1)[1], folder


def test_volume_targets_are_the_folders_the_image_prepares(stack: dict[str, Any]) -> None:
    setup = next(i for i in parse_dockerfile(DOCKERFILE).final.of("RUN") if "useradd" in i.text)
    for name, service in services(stack).items():
        if not is_quantload(service):
            continue
        for entry in service.get("volumes", []):
            target = str(entry).split(":")[1]
            assert target in setup.text, f"{name}: {target} is not made by the image"


def test_prepare_service_runs_the_script(stack: dict[str, Any]) -> None:
    prepare = services(stack)["prepare"]
    assert command_of(prepare) == ["quantload-prepare"]
    copy = next(i for i in parse_dockerfile(DOCKERFILE).final.of("COPY") if "prepare.sh" in i.text)
    assert copy_sources(copy)[2] == "/usr/local/bin/quantload-prepare"
    assert os.access(PREPARE_SCRIPT, os.X_OK), "prepare.sh must be executable (git mode 755)"
    volumes = {str(v).split(":")[1] for v in prepare["volumes"]}
    assert {"/models", "/results", "/home/quantload/.cache"} <= volumes
    assert environment_of(prepare)["QL_MODEL"] == "smollm2-135m"
    assert interpolate("${QL_RUN:-compose}", {}) == environment_of(prepare)["QL_RUN"]
