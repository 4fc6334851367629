"""docker-compose.yml and the rendered Kubernetes manifests, side by side: for every compose service
its Kubernetes container, compared field by field (image and tag, command and flags, ports,
health checks, environment). `differences()` lists every field where they disagree, so a drift in
either file names itself.

Both are read as they run: compose interpolated with .env.example's values (compose's defaults),
Kubernetes with each container's environment resolved (literal values, the settings ConfigMap made
from settings.env, the Secret's keys) and its arguments' $(NAME) expanded as the kubelet does.

What is meant to differ, and why (the only exceptions the comparison makes):
- QL_RUN, the run folder's name: `compose` there, `kubernetes` here (settings.env). Compose is read
  with the Kubernetes value so every path built from it still has to agree.
- The servers' log file (LLAMA_ARG_LOG_FILE) and the exporter's `log=` per target: compose shares
  the `results` volume between the servers and the exporter; on Kubernetes a server's log stays in
  its pod and the exporter takes KV cells from /slots.
- Environment variables a Kubernetes container holds only to expand its arguments (compose expands
  `${NAME}` in the file itself): allowed where the arguments use them as $(NAME).
- Published host ports: Kubernetes has Services instead; the container ports must agree.
- A GPU reservation: compose's `count: all` has no Kubernetes form (whole GPUs only): a server
  must limit `nvidia.com/gpu`; a service reserving GPUs for NVML only (the `utility` capability)
  gets what the NVIDIA runtime would set, NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compose.stack import interpolate_tree, parse_port, read_yaml, references

from kube.render import Manifest, config_map_data, containers, pod_spec, workloads

SETTINGS = "quantload-settings"
SECRET = "quantload-secrets"
# compose variables that are secrets -> the key of the quantload-secrets Secret holding them
SECRET_KEYS = {"LLAMA_API_KEY": "llama-api-key", "GRAFANA_ADMIN_PASSWORD": "grafana-admin-password"}
# compose service -> (Kubernetes workload, container)
SERVERS = {"llama-f16": "F16", "llama-q8-0": "Q8_0", "llama-q4-k-m": "Q4_K_M"}
COUNTERPARTS: dict[str, tuple[str, str]] = {
    **{name: (name, "llama-server") for name in SERVERS},
    **{name: (name, name) for name in ("prepare", "exporter", "prometheus", "grafana", "locust-master",
                                       "locust-worker", "load", "report")},
}  # fmt: skip
RUN_FOLDER_VARIABLE = "QL_RUN"
BUILD_ONLY_PROFILE = "build"
LOG_FILE_VARIABLE = "LLAMA_ARG_LOG_FILE"
# flags whose value is a port the container itself listens on
LISTEN_FLAGS = ("--port", "--web-port", "--ql-metrics-port", "--metrics-port")
_EXPANSION = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_DURATION = re.compile(r"(\d+)s")


@dataclass(frozen=True)
class Secret:
    """An environment value that comes from the Secret (compose: from a secret variable)."""

    key: str
    optional: bool


EnvValue = str | Secret


@dataclass(frozen=True)
class Probe:
    """A health check reduced to what both sides say: how, where, how often, how patient."""

    kind: str  # "http" or "tcp"
    path: str | None
    port: int
    period_s: int
    timeout_s: int
    retries: int
    start_s: int


@dataclass(frozen=True)
class View:
    """One container as it runs, normalised."""

    image: str
    args: tuple[str, ...]
    ports: frozenset[int]
    env: Mapping[str, EnvValue]
    probe: Probe | None
    expanded: frozenset[str] = frozenset()  # Kubernetes: the variables its arguments expand


# ---------------------------------------------------------------- compose side


def compose_files(root: Path, gpu: bool) -> dict[str, Any]:
    """docker-compose.yml, merged with docker-compose.gpu.yml when `gpu` (services: image replaced,
    environment merged, deploy replaced), not interpolated."""
    base = read_yaml(root / "docker-compose.yml")
    if not gpu:
        return base
    merged = copy.deepcopy(base)
    for name, override in read_yaml(root / "docker-compose.gpu.yml")["services"].items():
        service = merged["services"].setdefault(name, {})  # a service of the override alone: as it is
        for key, value in override.items():
            if key == "environment":
                service["environment"] = {**(service.get("environment") or {}), **value}
            else:
                service[key] = value
    return merged


def _duration_s(text: str) -> int:
    match = _DURATION.fullmatch(str(text))
    assert match, f"not a duration in seconds: {text!r}"
    return int(match[1])


def compose_probe(healthcheck: Mapping[str, Any] | None) -> Probe | None:
    if not healthcheck:
        return None
    test = " ".join(healthcheck["test"][1:])
    url = re.search(r"http://[^/'\" ]+:(\d+)(/[^'\" ]*)", test)
    connect = re.search(r"create_connection\(\('[^']+', (\d+)\)", test)
    if url:
        kind, path, port = "http", url[2], int(url[1])
    elif connect:
        kind, path, port = "tcp", None, int(connect[1])
    else:
        raise AssertionError(f"a compose health check this comparison cannot read: {test!r}")
    return Probe(
        kind, path, port,
        _duration_s(healthcheck["interval"]), _duration_s(healthcheck["timeout"]),
        int(healthcheck["retries"]), _duration_s(healthcheck["start_period"]),
    )  # fmt: skip


def _compose_env(raw: Mapping[str, Any], resolved: Mapping[str, Any]) -> dict[str, EnvValue]:
    env: dict[str, EnvValue] = {}
    for name, value in (resolved or {}).items():
        secret = [r for r in references(str((raw or {}).get(name, ""))) if r.name in SECRET_KEYS]
        if secret:
            env[name] = Secret(SECRET_KEYS[secret[0].name], optional=not secret[0].operator.endswith("?"))
        else:
            env[name] = "" if value is None else str(value)
    return env


def _without_logs(args: list[str]) -> list[str]:
    """The exporter's targets without `,log=PATH` (see the module docstring)."""
    return [re.sub(r",log=[^,]*", "", arg) for arg in args]


def _listen_ports(args: list[str]) -> set[int]:
    return {int(args[i + 1]) for i, arg in enumerate(args[:-1]) if arg in LISTEN_FLAGS}


def compose_view(name: str, raw: Mapping[str, Any], resolved: Mapping[str, Any]) -> View:
    args = [str(part) for part in resolved.get("command") or []]
    env = _compose_env(raw.get("environment") or {}, resolved.get("environment") or {})
    env.pop(LOG_FILE_VARIABLE, None)
    ports = {int(parse_port(entry).container_port) for entry in resolved.get("ports") or []}
    for device in (resolved.get("deploy") or {}).get("resources", {}).get("reservations", {}).get("devices", []):
        if name not in SERVERS and "gpu" not in device["capabilities"]:
            env["NVIDIA_VISIBLE_DEVICES"] = str(device["count"])
            env["NVIDIA_DRIVER_CAPABILITIES"] = ",".join(device["capabilities"])
    return View(
        str(resolved["image"]), tuple(_without_logs(args)), frozenset(ports | _listen_ports(args)), env,
        compose_probe(resolved.get("healthcheck")),
    )  # fmt: skip


def compose_views(root: Path, env: Mapping[str, str], gpu: bool) -> dict[str, View]:
    """Every compose service that runs (a build-only one, profile `build`, has no counterpart). On
    the GPU box compose's `prepare` only makes the files, as the servers' init containers do on
    Kubernetes, and `measure` measures, as the prepare Job does: it is compared with that Job."""
    raw = compose_files(root, gpu)
    resolved = interpolate_tree(raw, env)
    views = {
        name: compose_view(name, raw["services"][name], service)
        for name, service in resolved["services"].items()
        if BUILD_ONLY_PROFILE not in service.get("profiles", [])
    }
    if gpu and "measure" in views:
        views["prepare"] = views.pop("measure")
    return views


# ---------------------------------------------------------------- Kubernetes side


def _k8s_env(container: Manifest, settings: Mapping[str, str]) -> dict[str, EnvValue]:
    env: dict[str, EnvValue] = {}
    for entry in container.get("env", []):
        source = entry.get("valueFrom")
        if source is None:
            env[entry["name"]] = str(entry.get("value", ""))
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            assert ref["name"].startswith(f"{SETTINGS}-"), f"{entry['name']}: from ConfigMap {ref['name']}"
            env[entry["name"]] = settings[ref["key"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            assert ref["name"] == SECRET, f"{entry['name']}: from Secret {ref['name']}"
            env[entry["name"]] = Secret(ref["key"], bool(ref.get("optional", False)))
        else:
            raise AssertionError(f"{entry['name']}: a source this comparison cannot read: {source}")
    return env


def expand(arg: str, env: Mapping[str, EnvValue]) -> str:
    """$(NAME) replaced as the kubelet does (an unknown or secret NAME is left as written)."""

    def value(match: re.Match[str]) -> str:
        found = env.get(match[1])
        return found if isinstance(found, str) else match[0]

    return _EXPANSION.sub(value, arg)


def k8s_probe(container: Manifest) -> Probe | None:
    ready, startup = container.get("readinessProbe"), container.get("startupProbe")
    if ready is None and startup is None:
        return None
    assert ready is not None and startup is not None, "a readiness probe needs its startup probe"

    def where(probe: Manifest) -> tuple[str, str | None, int]:
        if "httpGet" in probe:
            return "http", probe["httpGet"]["path"], int(probe["httpGet"]["port"])
        return "tcp", None, int(probe["tcpSocket"]["port"])

    assert where(ready) == where(startup), "readiness and startup probes check different things"
    assert startup["periodSeconds"] == ready["periodSeconds"]
    assert startup["timeoutSeconds"] == ready["timeoutSeconds"]
    return Probe(
        *where(ready), int(ready["periodSeconds"]), int(ready["timeoutSeconds"]),
        int(ready["failureThreshold"]), int(startup["periodSeconds"]) * int(startup["failureThreshold"]),
    )  # fmt: skip


def k8s_view(container: Manifest, settings: Mapping[str, str]) -> View:
    env = _k8s_env(container, settings)
    args = tuple(expand(str(arg), env) for arg in container.get("args", []))
    expanded = {m[1] for arg in container.get("args", []) for m in _EXPANSION.finditer(str(arg))}
    ports = frozenset(int(p["containerPort"]) for p in container.get("ports", []))
    return View(container["image"], args, ports, env, k8s_probe(container), frozenset(expanded))


def k8s_views(manifests: list[Manifest]) -> dict[str, View]:
    settings = config_map_data(manifests, SETTINGS)
    found = workloads(manifests)
    views = {}
    for service, (workload, container_name) in COUNTERPARTS.items():
        if workload not in found:
            continue
        (container,) = [c for c in containers(found[workload]) if c["name"] == container_name]
        views[service] = k8s_view(container, settings)
    return views


# ---------------------------------------------------------------- the comparison


def _env_differences(service: str, compose: View, k8s: View) -> list[str]:
    out = []
    k8s_env = k8s.env
    for name in sorted(set(compose.env) | set(k8s_env)):
        if name not in k8s_env:
            out.append(f"{service}: env {name}: compose {compose.env[name]!r}, Kubernetes has none")
        elif name not in compose.env:
            if name not in k8s.expanded:
                out.append(f"{service}: env {name}: Kubernetes {k8s_env[name]!r}, compose has none")
        elif compose.env[name] != k8s_env[name]:
            out.append(f"{service}: env {name}: compose {compose.env[name]!r}, Kubernetes {k8s_env[name]!r}")
    return out


def differences(compose: Mapping[str, View], k8s: Mapping[str, View]) -> list[str]:
    """Every field where a compose service and its Kubernetes container disagree."""
    out = [f"{name}: a compose service without a Kubernetes counterpart" for name in sorted(set(compose) - set(k8s))]
    for name in sorted(set(compose) & set(k8s)):
        left, right = compose[name], k8s[name]
        if left.image != right.image:
            out.append(f"{name}: image: compose {left.image}, Kubernetes {right.image}")
        if left.args != right.args:
            out.append(f"{name}: command: compose {list(left.args)}, Kubernetes {list(right.args)}")
        if left.ports != right.ports:
            out.append(f"{name}: ports: compose {sorted(left.ports)}, Kubernetes {sorted(right.ports)}")
        if left.probe != right.probe:
            out.append(f"{name}: health check: compose {left.probe}, Kubernetes {right.probe}")
        out += _env_differences(name, left, right)
    return out


def settings_differences(manifests: list[Manifest], env_example: Mapping[str, str]) -> list[str]:
    """settings.env against .env.example: the same value for every name both have (QL_RUN apart)."""
    settings = config_map_data(manifests, SETTINGS)
    return [
        f"settings.env {name}={value!r}, .env.example {env_example[name]!r}"
        for name, value in sorted(settings.items())
        if name != RUN_FOLDER_VARIABLE and env_example.get(name) != value
    ] + [f"settings.env {name} is not a .env.example variable" for name in sorted(set(settings) - set(env_example))]


def gpu_limits(manifests: list[Manifest]) -> dict[str, str | None]:
    """Each server's nvidia.com/gpu limit (None: none)."""
    found = workloads(manifests)
    limits: dict[str, str | None] = {}
    for name in SERVERS:
        (container,) = [c for c in containers(found[name]) if c["name"] == "llama-server"]
        value = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        limits[name] = None if value is None else str(value)
    return limits


def init_prepare(manifests: list[Manifest]) -> dict[str, View]:
    """Each server's init container, which stands in for compose's dependence on `prepare`."""
    settings = config_map_data(manifests, SETTINGS)
    found = workloads(manifests)
    return {name: k8s_view(containers(found[name], init=True)[0], settings) for name in SERVERS}


def waits_for(manifests: list[Manifest], job: str) -> list[str]:
    """The hosts a Job's init container waits for (compose: depends_on ... service_healthy)."""
    (init,) = containers(workloads(manifests)[job], init=True)
    return [re.sub(r"^http://([^:/]+).*$", r"\1", arg) for arg in init["args"] if str(arg).startswith("http://")]


def security_of(manifests: list[Manifest], workload: str) -> Manifest:
    return pod_spec(workloads(manifests)[workload]).get("securityContext", {})
