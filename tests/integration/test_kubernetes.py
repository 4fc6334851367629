"""deploy/kubernetes checked without a cluster (none can run here: no control plane, no images).

What is checked, and with what:
- rendered offline by the real `kubectl kustomize` (kube/render.py; kubectl missing is a skip with
  its reason, a failure under QUANTLOAD_REQUIRE_INTEGRATION=1), both overlays and the
  prometheus-operator component;
- every rendered object against Kubernetes' schemas in strict mode (PyPI kubernetes-validate) and
  the operator's objects against its CRDs' models (kube/schemas.py);
- against docker-compose.yml and docker-compose.gpu.yml field by field (kube/agreement.py: images
  and tags, commands and flags, ports, health checks, environment), and a drift made in a copy of
  either side is found and named;
- what a cluster would resolve: Service selectors, ports, ConfigMap, Secret and volume references,
  Prometheus's scrape addresses, the generated ConfigMaps' contents against the files they came from.

Not checked here: that any of it runs (no API server, kubelet, scheduler or image pull).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from compose.stack import env_example, example_env, read_yaml
from kube.agreement import (
    SECRET,
    SERVERS,
    compose_files,
    compose_views,
    differences,
    gpu_limits,
    init_prepare,
    k8s_views,
    security_of,
    settings_differences,
    waits_for,
)
from kube.render import (
    KUBERNETES,
    OVERLAYS,
    REPO,
    Manifest,
    all_containers,
    config_map_data,
    containers,
    copy_tree,
    of_kind,
    pod_spec,
    render,
    workloads,
)
from kube.schemas import schema_errors

pytestmark = pytest.mark.integration

Render = Callable[[str], list[Manifest]]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Manifest]]:
    """Both overlays of the repository rendered once."""
    return {overlay: render(overlay) for overlay in OVERLAYS}


def _k8s_run_env(manifests: list[Manifest]) -> dict[str, str]:
    """Compose's variables as .env.example sets them, with Kubernetes' run folder name."""
    return example_env(QL_RUN=config_map_data(manifests, "quantload-settings")["QL_RUN"])


def _differences(root: Path, manifests: list[Manifest], gpu: bool) -> list[str]:
    compose = compose_views(root, _k8s_run_env(manifests), gpu)
    return differences(compose, k8s_views(manifests))


def _edit(root: Path, relative: str, old: str, new: str) -> None:
    path = root / relative
    text = path.read_text(encoding="utf-8")
    assert text.count(old) >= 1, f"{old!r} not in {relative}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


# ---------------------------------------------------------------- schemas


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_validates_strictly(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    manifests = rendered[overlay]
    kinds = {m["kind"] for m in manifests}
    assert {"Namespace", "Deployment", "Service", "Job", "ConfigMap", "PersistentVolumeClaim"} <= kinds
    errors = [error for manifest in manifests for error in schema_errors(manifest)]
    assert not errors, "\n".join(errors)
    assert {m["metadata"].get("namespace") for m in manifests if m["kind"] != "Namespace"} == {"quantload"}


def test_the_prometheus_operator_objects_validate_against_its_crds(tmp_path: Path) -> None:
    manifests = render("gpu", copy_tree(tmp_path), operator=True)
    monitors = [m for m in manifests if m["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {m["kind"] for m in monitors} == {"ServiceMonitor", "PodMonitor"}
    errors = [error for manifest in manifests for error in schema_errors(manifest)]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize(
    ("relative", "old", "new", "said"),
    [
        (f"{KUBERNETES}/base/exporter.yaml", "readinessProbe:", "readinesProbe:", "readinesProbe"),
        (f"{KUBERNETES}/base/prometheus.yaml", "periodSeconds: 10", "periodSeconds: ten", "periodSeconds"),
        (f"{KUBERNETES}/components/prometheus-operator/servicemonitor.yaml", "scrapeTimeout:", "scrapeTimout:", "scrapeTimout"),
        (f"{KUBERNETES}/components/prometheus-operator/podmonitor.yaml", "podMetricsEndpoints:", "podMetricEndpoints:", "podMetricEndpoints"),
    ],
    ids=["misspelt-field", "wrong-type", "misspelt-monitor-field", "misspelt-monitor-list"],
)
def test_a_mistake_in_a_copy_fails_validation(tmp_path: Path, relative: str, old: str, new: str, said: str) -> None:
    root = copy_tree(tmp_path)
    _edit(root, relative, old, new)
    errors = [error for manifest in render("cpu", root, operator=True) for error in schema_errors(manifest)]
    assert errors and any(said in error for error in errors), errors


# ---------------------------------------------------------------- agreement with compose


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_manifests_agree_with_compose(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    found = _differences(REPO, rendered[overlay], gpu=overlay == "gpu")
    assert not found, "compose and Kubernetes disagree:\n" + "\n".join(found)
    services = read_yaml(REPO / "docker-compose.yml")["services"]
    compose = {name for name, service in services.items() if "build" not in service.get("profiles", [])}
    assert compose == set(k8s_views(rendered[overlay])), "every compose service that runs has its container"
    # A server compose reserves a GPU for (compute) limits one on Kubernetes (whole GPUs only).
    reserving = {
        name for name, service in compose_files(REPO, gpu=overlay == "gpu")["services"].items()
        if any("gpu" in d["capabilities"] for d in service.get("deploy", {}).get("resources", {})
               .get("reservations", {}).get("devices", []))
    }  # fmt: skip
    limited = {name for name, limit in gpu_limits(rendered[overlay]).items() if limit is not None}
    assert reserving == limited


def test_settings_agree_with_env_example(rendered: dict[str, list[Manifest]]) -> None:
    assert not settings_differences(rendered["cpu"], env_example())
    assert config_map_data(rendered["cpu"], "quantload-settings")["QL_RUN"] == "kubernetes"


DRIFTS = [
    # (file in the copy, text, replacement, what the difference names)
    (f"{KUBERNETES}/base/llama-server/deployment.yaml", '"-lv", "4"', '"-lv", "3"', "llama-f16: command"),
    (f"{KUBERNETES}/base/llama-server/deployment.yaml", "server-b11434", "server-b11433", "llama-q8-0: image"),
    (f"{KUBERNETES}/base/llama-server/deployment.yaml", "failureThreshold: 6", "failureThreshold: 5", "llama-q4-k-m: health check"),
    (f"{KUBERNETES}/base/exporter.yaml", "containerPort: 9646", "containerPort: 9656", "exporter: ports"),
    (f"{KUBERNETES}/base/grafana.yaml", "value: Viewer", "value: Editor", "grafana: env GF_AUTH_ANONYMOUS_ORG_ROLE"),
    (f"{KUBERNETES}/base/locust.yaml", "- name: QL_TARGET_API_KEY", "- name: QL_TARGET_KEY", "locust-worker: env QL_TARGET_API_KEY"),
    (f"{KUBERNETES}/base/grafana.yaml", "key: grafana-admin-password}", "key: grafana-admin-password, optional: true}", "grafana: env GF_SECURITY_ADMIN_PASSWORD"),
    (f"{KUBERNETES}/base/settings.env", "QL_SLOTS=8", "QL_SLOTS=4", "llama-f16: command"),
    (f"{KUBERNETES}/base/report-job.yaml", '"--prometheus", "http://prometheus:9090"', '"--prometheus", "http://prometheus:9091"', "report: command"),
    ("docker-compose.yml", "prom/prometheus:v3.7.3", "prom/prometheus:v3.7.4", "prometheus: image"),
    ("docker-compose.yml", '"--metrics", "--no-webui"', '"--metrics", "--no-webui", "--no-warmup"', "llama-f16: command"),
    ("docker-compose.yml", "QUANTLOAD_LOAD__METRICS_HOST: 0.0.0.0", "QUANTLOAD_LOAD__METRICS_HOST: 127.0.0.1", "load: env QUANTLOAD_LOAD__METRICS_HOST"),
    ("docker-compose.yml", "retries: 6", "retries: 7", "llama-f16: health check"),
]


@pytest.mark.parametrize(("relative", "old", "new", "said"), DRIFTS, ids=[f"{d[0].split('/')[-1]}:{d[3]}" for d in DRIFTS])
def test_a_drift_in_a_copy_is_found(tmp_path: Path, relative: str, old: str, new: str, said: str) -> None:
    root = copy_tree(tmp_path)
    assert not _differences(root, render("cpu", root), gpu=False), "the copy agrees before the edit"
    _edit(root, relative, old, new)
    found = _differences(root, render("cpu", root), gpu=False)
    assert any(line.startswith(said) for line in found), found


@pytest.mark.parametrize(
    ("relative", "old", "new", "said"),
    [
        ("docker-compose.gpu.yml", 'LLAMA_ARG_N_GPU_LAYERS: "${QL_GPU_LAYERS:-all}"', 'LLAMA_ARG_N_GPU_LAYERS: "80"', "llama-f16: env LLAMA_ARG_N_GPU_LAYERS"),
        (f"{KUBERNETES}/overlays/gpu/kustomization.yaml", "newTag: server-cuda-b11434", "newTag: server-cuda13-b11434", "llama-f16: image"),
        (f"{KUBERNETES}/overlays/gpu/exporter-gpu.yaml", "value: utility", "value: compute,utility", "exporter: env NVIDIA_DRIVER_CAPABILITIES"),
    ],
    ids=["layers", "cuda-image", "exporter-capabilities"],
)
def test_a_drift_of_the_gpu_overlay_is_found(tmp_path: Path, relative: str, old: str, new: str, said: str) -> None:
    root = copy_tree(tmp_path)
    _edit(root, relative, old, new)
    found = _differences(root, render("gpu", root), gpu=True)
    assert any(line.startswith(said) for line in found), found


def test_servers_prepare_their_files_as_the_prepare_job_does(rendered: dict[str, list[Manifest]]) -> None:
    compose = compose_views(REPO, _k8s_run_env(rendered["cpu"]), gpu=False)
    for name, init in init_prepare(rendered["cpu"]).items():
        assert init.image == compose["prepare"].image and init.args == compose["prepare"].args, name
        assert init.env == {"QL_MEASURE": "0", "QL_MODEL": compose["prepare"].env["QL_MODEL"]}, name
        (server,) = containers(workloads(rendered["cpu"])[name])
        model = {e["name"]: e.get("value") for e in server["env"]}["LLAMA_ARG_MODEL"]
        assert model == f"/models/{SERVERS[name]}.gguf", name


def test_jobs_start_as_compose_runs_them_and_wait_for_what_it_waits_for(
    rendered: dict[str, list[Manifest]],
) -> None:
    compose = read_yaml(REPO / "docker-compose.yml")["services"]
    jobs = of_kind(rendered["cpu"], "Job")
    assert set(jobs) == {"prepare", "load", "report"}
    for name, job in jobs.items():
        on_demand = "profiles" in compose[name]  # compose starts these only when asked
        assert job["spec"].get("suspend", False) == on_demand, name
        assert job["spec"]["backoffLimit"] == 0 and pod_spec(job)["restartPolicy"] == "Never", name
    for name in ("load", "report"):
        healthy = {s for s, c in compose[name]["depends_on"].items() if c["condition"] == "service_healthy"}
        assert set(waits_for(rendered["cpu"], name)) == healthy, name
    for name in ("prepare", "load", "report", "exporter", "locust-master", "locust-worker"):
        assert security_of(rendered["cpu"], name).get("runAsUser") == 10001, name  # the image's uid


# ---------------------------------------------------------------- what a cluster would resolve


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def _pods(manifests: list[Manifest]) -> dict[str, tuple[dict[str, str], list[Manifest]]]:
    """Workload name -> (pod labels, containers)."""
    return {
        name: (w["spec"]["template"]["metadata"]["labels"], containers(w)) for name, w in workloads(manifests).items()
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_select_their_pods_and_every_reference_resolves(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    manifests = rendered[overlay]
    pods = _pods(manifests)
    for name, service in of_kind(manifests, "Service").items():
        chosen = [w for w, (labels, _) in pods.items() if _matches(service["spec"]["selector"], labels)]
        expected = ["locust-worker", "load"] if name == "locust-worker" else [name]
        assert sorted(chosen) == sorted(expected), (name, chosen)
        for port in service["spec"]["ports"]:
            served = {int(p["containerPort"]) for w in chosen for c in pods[w][1] for p in c.get("ports", [])}
            assert port["targetPort"] in served, (name, port)
    assert of_kind(manifests, "Service")["locust-worker"]["spec"]["clusterIP"] == "None"  # DNS per pod
    maps = {name: m.get("data", {}) for name, m in of_kind(manifests, "ConfigMap").items()}
    claims = set(of_kind(manifests, "PersistentVolumeClaim"))
    for workload, container in all_containers(manifests):
        for entry in container.get("env", []):
            source = entry.get("valueFrom", {})
            if "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                assert ref["key"] in maps[ref["name"]], (workload, entry)
            if "secretKeyRef" in source:
                assert source["secretKeyRef"]["name"] == SECRET, (workload, entry)
    for name, workload in workloads(manifests).items():
        for volume in pod_spec(workload).get("volumes", []):
            if "configMap" in volume:
                data = maps[volume["configMap"]["name"]]
                assert all(item["key"] in data for item in volume["configMap"].get("items", [])), name
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, name


def test_prometheus_scrapes_services_of_the_namespace(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["cpu"]
    config = yaml.safe_load(config_map_data(manifests, "prometheus-config")["prometheus.yml"])
    services = of_kind(manifests, "Service")
    ports = {name: {p["port"] for p in s["spec"]["ports"]} for name, s in services.items()}
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                if host == "localhost":
                    continue  # Prometheus itself
                assert int(port) in ports.get(host, set()), (job["job_name"], target)
        for dns in job.get("dns_sd_configs", []):
            for name in dns["names"]:
                assert services[name]["spec"]["clusterIP"] == "None" and dns["port"] in ports[name]


def test_generated_configmaps_hold_the_files_themselves(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["cpu"]
    listed = yaml.safe_load((REPO / "grafana" / "kustomization.yaml").read_text())
    (dashboards,) = [g for g in listed["configMapGenerator"] if g["name"] == "grafana-dashboards"]
    on_disk = sorted(f"dashboards/{p.name}" for p in (REPO / "grafana" / "dashboards").glob("*.json"))
    assert sorted(dashboards["files"]) == on_disk, "list every grafana/dashboards/*.json in grafana/kustomization.yaml"
    data = config_map_data(manifests, "grafana-dashboards")
    for path in on_disk:
        assert data[Path(path).name] == (REPO / "grafana" / path).read_text(encoding="utf-8"), path
    (generated,) = [m for m in of_kind(manifests, "ConfigMap").values() if m["metadata"]["name"].startswith("grafana-dashboards-")]
    assert generated["metadata"]["labels"]["grafana_dashboard"] == "1"  # what Grafana's sidecar looks for
    prometheus = config_map_data(manifests, "prometheus-config")
    for relative in ("prometheus.yml", "rules/quantload.rules.yml", "rules/quantload.alerts.yml"):
        assert prometheus[Path(relative).name] == (REPO / "prometheus" / relative).read_text(encoding="utf-8")
    provider = yaml.safe_load(config_map_data(manifests, "grafana-dashboard-provider")["quantload.yml"])
    (grafana,) = containers(workloads(manifests)["grafana"])
    mounts = {m["mountPath"] for m in grafana["volumeMounts"]}
    assert provider["providers"][0]["options"]["path"] in mounts


def test_the_gpu_overlay_puts_every_server_on_a_gpu_and_the_cpu_one_none(
    rendered: dict[str, list[Manifest]],
) -> None:
    assert set(gpu_limits(rendered["cpu"]).values()) == {None}
    assert set(gpu_limits(rendered["gpu"]).values()) == {"1"}
    cpu_names = {m["metadata"]["name"] for m in rendered["cpu"]}
    assert cpu_names == {m["metadata"]["name"] for m in rendered["gpu"]}, "the overlay only changes objects"


def test_the_worker_count_is_one_setting(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    _edit(root, f"{KUBERNETES}/overlays/cpu/kustomization.yaml", "count: 1", "count: 5")
    assert workloads(render("cpu", root))["locust-worker"]["spec"]["replicas"] == 5


def test_the_monitors_select_the_exporter_and_every_load_generator(tmp_path: Path) -> None:
    manifests = render("cpu", copy_tree(tmp_path), operator=True)
    config = yaml.safe_load(config_map_data(manifests, "prometheus-config")["prometheus.yml"])
    interval = config["global"]["scrape_interval"]
    (service_monitor,) = of_kind(manifests, "ServiceMonitor").values()
    chosen = [
        name for name, s in of_kind(manifests, "Service").items()
        if _matches(service_monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]  # fmt: skip
    assert chosen == ["exporter"]
    port_names = {p["name"] for p in of_kind(manifests, "Service")["exporter"]["spec"]["ports"]}
    assert {e["port"] for e in service_monitor["spec"]["endpoints"]} <= port_names
    (pod_monitor,) = of_kind(manifests, "PodMonitor").values()
    (expression,) = pod_monitor["spec"]["selector"]["matchExpressions"]
    pods = {
        name for name, (labels, _) in _pods(manifests).items()
        if labels.get(expression["key"]) in expression["values"]
    }  # fmt: skip
    assert pods == {"locust-master", "locust-worker", "load"}
    for name in pods:
        names = {p.get("name") for c in _pods(manifests)[name][1] for p in c.get("ports", [])}
        assert "metrics" in names, name
    for endpoint in [*service_monitor["spec"]["endpoints"], *pod_monitor["spec"]["podMetricsEndpoints"]]:
        assert endpoint["interval"] == interval
    assert {m["metadata"]["namespace"] for m in (service_monitor, pod_monitor)} == {"quantload"}


def test_every_image_has_a_version_tag(rendered: dict[str, list[Manifest]]) -> None:
    for overlay, manifests in rendered.items():
        for workload, container in all_containers(manifests):
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", container["image"]), (overlay, workload, container["image"])
            assert not container["image"].endswith(":latest"), (overlay, workload)
