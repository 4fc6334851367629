"""Rendering deploy/kubernetes with `kubectl kustomize` (offline), in the repository or in a copy.

A copy holds the folders the kustomizations read (deploy/, prometheus/, grafana/) and the compose
files, laid out as in the repository, so a test can change one file and render or compare again.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from support import missing

REPO = Path(__file__).resolve().parents[3]
KUBERNETES = Path("deploy") / "kubernetes"
OVERLAYS = ("cpu", "gpu")
OPERATOR_COMPONENT = KUBERNETES / "components" / "prometheus-operator"
COPIED = ("deploy", "prometheus", "grafana", "docker-compose.yml", "docker-compose.gpu.yml", ".env.example")
KUSTOMIZE_MAJOR = 5  # `labels:` and components need kustomize v4+; kubectl >= 1.27 bundles v5
RENDER_TIMEOUT_S = 120

Manifest = dict[str, Any]


def kubectl() -> str:
    """kubectl's path, or a skip (a failure under QUANTLOAD_REQUIRE_INTEGRATION=1) saying why."""
    path = shutil.which("kubectl")
    if path is None:
        missing(
            "kubectl is not installed: the Kubernetes manifests cannot be rendered (kubectl >= 1.27,"
            " which bundles kustomize v5; Debian's kubernetes-client 1.20 is too old)"
        )
    assert path is not None
    shown = subprocess.run(
        [path, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=60, check=False
    )
    try:
        version = json.loads(shown.stdout).get("kustomizeVersion", "")
    except ValueError:
        version = ""
    match = re.match(r"v(\d+)\.", version)
    if match is None or int(match[1]) < KUSTOMIZE_MAJOR:
        missing(f"{path} bundles kustomize {version or 'unknown'}; the manifests need v{KUSTOMIZE_MAJOR}")
    return path


def copy_tree(into: Path) -> Path:
    """The files the manifests and the comparison read, copied under `into`; returns `into`."""
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, into / name)
        else:
            shutil.copyfile(source, into / name)
    return into


def render_dir(folder: Path) -> list[Manifest]:
    """`kubectl kustomize FOLDER` as a list of objects; a failed render fails the test with its error."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=RENDER_TIMEOUT_S,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"kubectl kustomize {folder} failed:\n{result.stderr[-3000:]}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render(overlay: str, root: Path = REPO, *, operator: bool = False) -> list[Manifest]:
    """An overlay of the tree at `root` rendered; `operator` adds the prometheus-operator component
    (through a kustomization written beside the overlays in that tree, which must be a copy)."""
    if not operator:
        return render_dir(root / KUBERNETES / "overlays" / overlay)
    assert root != REPO, "render the operator component in a copy (it writes a kustomization)"
    folder = root / KUBERNETES / "overlays" / f"{overlay}-with-operator"
    folder.mkdir()
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [f"../{overlay}"],
                "components": ["../../components/prometheus-operator"],
            }
        )
    )
    return render_dir(folder)


def of_kind(manifests: list[Manifest], kind: str) -> dict[str, Manifest]:
    """The objects of one kind, by name."""
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


def workloads(manifests: list[Manifest]) -> dict[str, Manifest]:
    """Deployments and Jobs by name (their names do not collide)."""
    found = {**of_kind(manifests, "Deployment"), **of_kind(manifests, "Job")}
    assert len(found) == len(of_kind(manifests, "Deployment")) + len(of_kind(manifests, "Job"))
    return found


def pod_spec(workload: Manifest) -> Manifest:
    spec: Manifest = workload["spec"]["template"]["spec"]
    return spec


def containers(workload: Manifest, init: bool = False) -> list[Manifest]:
    found: list[Manifest] = pod_spec(workload).get("initContainers" if init else "containers", [])
    return found


def all_containers(manifests: list[Manifest]) -> Iterator[tuple[str, Manifest]]:
    """(workload name, container) for every container and init container."""
    for name, workload in workloads(manifests).items():
        for container in containers(workload) + containers(workload, init=True):
            yield name, container


def config_map_data(manifests: list[Manifest], base_name: str) -> dict[str, str]:
    """The data of the generated ConfigMap `base_name` (its name carries kustomize's hash suffix)."""
    (found,) = [
        m for m in manifests if m["kind"] == "ConfigMap" and re.fullmatch(rf"{base_name}-[a-z0-9]{{10}}", m["metadata"]["name"])
    ]
    data: dict[str, str] = found["data"]
    return data
