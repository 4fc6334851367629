"""`docker compose up` for real: the stack of docker-compose.yml under a private Docker Engine.

What runs is the user's docker-compose.yml (commands, healthchecks, volumes, networks, ports,
profiles, the prepare, load and report jobs) plus tests/e2e/compose_e2e/docker-compose.standins.yml,
which swaps only `image:` and build arguments for images made here (no registry answers on this
machine): a Debian base from debootstrap, the llama.cpp server/full stand-ins carrying the pinned
native build, Prometheus from Debian's package, and our image built by docker-compose from
services/quantload/Dockerfile with wheels fetched on the host. Grafana has no image here: the test
starts every service but it (the services are named on `up`); its provisioning is checked by
tests/unit/test_compose.py and tests/integration/test_observability.py as before.

The containers cannot reach the internet; what a connected machine would download (the pinned
llama.cpp sources' vocabulary for the tiny model, WikiText-2) is put into the stack's `cache`
volume first, through the prepare service.

Proved here: images build from the Dockerfile; prepare completes; three llama-servers, the
exporter, Prometheus and the Locust master turn healthy, two workers join; the Locust web UI shows
TTFT and TPOT rows in headless Chromium while a load runs; the load and report jobs produce a report
with every quantization, the KV check (`quantload stack kv`, read through the Docker SDK) and the
servers' series from Prometheus, which holds the exporter's series of all three servers and the
loadgen series of both workers; a server killed mid-load costs its stages, not the run; `down -v`
leaves nothing behind. Not proved: the upstream images themselves, Grafana, a GPU.

Bounded: every step has a timeout inside BOUND_S; the engine, containerd, the containers and the
network switch are stopped or restored whatever happens. Wall times are printed at the end and
kept in ~/.cache/quantload/compose/last-run.json.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import secrets
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from compose_e2e import images
from compose_e2e.engine import Engine, EngineError, bridge_traffic_allowed, private_engine
from compose_e2e.project import REPO, Compose, StackFailure
from compose_e2e.timings import Timings

from quantload.cache_lock import cache_lock
from quantload.llamacpp.sdist import PINNED_SDIST, source_dir
from quantload.llamacpp.server import free_port
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.synthetic import VOCAB_FILE
from quantload.paths import cache_root
from support import clean_env, missing, require_binary, run_quantload

BOUND_S = 2400  # the whole module on a fresh machine; a cached run takes a fraction
# long: images built and a stack brought up (about 20 minutes here): `make test-long` runs it
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(BOUND_S)]

SERVERS = {"llama-f16": "F16", "llama-q8-0": "Q8_0", "llama-q4-k-m": "Q4_K_M"}
# Every long-running service but Grafana, which has no image on this machine.
STARTED = ("prepare", *SERVERS, "exporter", "prometheus", "locust-master", "locust-worker")
WORKERS = 2
RUN = "e2e"
FAULT_RUN = "fault"
KILLED = "llama-q8-0"
DATA_ROOT_CAP_BYTES = 40 * 10**9  # a kept data root above this is started afresh
PRUNE_ABOVE_BYTES = 15 * 10**9  # dangling images are removed once the data root is above this
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


class Deadline:
    """The module's time bound, shared by every step."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, cap_s: float) -> float:
        remaining = self.end - time.monotonic()
        if remaining <= 5:
            pytest.fail(f"the compose e2e ran out of its {BOUND_S} s bound")
        return min(cap_s, remaining)


@dataclass
class Stack:
    """The running stack and how to reach it."""

    compose: Compose
    engine: Engine
    client: Any
    ports: dict[str, int]
    workdir: Path
    timings: Timings
    deadline: Deadline
    down_done: bool = False
    notes: list[str] = field(default_factory=list)
    kept_logs: dict[str, str] = field(default_factory=dict)  # one-shot containers' logs before down

    def url(self, port_variable: str) -> str:
        return f"http://127.0.0.1:{self.ports[port_variable]}"

    def container(self, service: str) -> Any:
        (found,) = [c for s, c in _project_pairs(self) if s.service == service and not s.oneoff]
        return found


def _project_pairs(stack: Stack) -> list[tuple[Any, Any]]:
    from quantload.compose.containers import project_containers

    return project_containers(stack.client, stack.compose.project)


# ---------------------------------------------------------------- set-up


def _prerequisites() -> str:
    if os.geteuid() != 0:
        missing("a private Docker Engine needs root")
    dockerd = require_binary("dockerd", "apt-get install docker.io")
    require_binary("docker-compose", "apt-get install docker-compose")
    require_binary("debootstrap", "apt-get install debootstrap")
    require_binary("chromium", "apt-get install chromium")
    return dockerd


@contextlib.contextmanager
def _data_root(cache: Path, driver: str) -> Iterator[tuple[Path, str]]:
    """The kept data root when no other run holds it, else a temporary one: (path, note)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "engine.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with tempfile.TemporaryDirectory(dir=cache, prefix=".engine-root-") as tmp:
                yield Path(tmp), "another run holds the kept data root: a temporary one (cold)"
            return
        name = "engine-root" if driver == "vfs" else f"engine-root-{driver}"  # roots are per driver
        root = cache / name
        size_file = cache / f"{name}.size"
        with contextlib.suppress(OSError, ValueError):
            if int(size_file.read_text()) > DATA_ROOT_CAP_BYTES:
                shutil.rmtree(root, ignore_errors=True)
        yield root, f"kept data root {root}"


def _seed_archive(environ: dict[str, str], wikitext: Path) -> bytes:
    """What a connected machine downloads into the cache volume: the pinned llama.cpp tree's
    CMakeLists.txt and Qwen2 vocabulary (the tiny model's tokenizer), and WikiText-2's test text."""
    tree = source_dir(cache_root(None, environ))
    inside = f"quantload/llama.cpp/{PINNED_SDIST.label}/llama.cpp"
    members = {
        f"{inside}/CMakeLists.txt": tree / "CMakeLists.txt",
        f"{inside}/{VOCAB_FILE}": tree / VOCAB_FILE,
        "quantload/datasets/wikitext-2-raw/wiki.test.raw": wikitext,
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, path in members.items():
            info = tar.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 10001  # the image's quantload user
            info.uname = info.gname = ""
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    return buffer.getvalue()


def _env_file(path: Path, ports: dict[str, int]) -> None:
    """The test's settings, all variables a user could set in .env (docs: .env.example)."""
    values = {
        "GRAFANA_ADMIN_PASSWORD": secrets.token_urlsafe(18),
        "QL_MODEL": "tiny",
        "QL_PROFILE": "ci",
        "QL_RUN": RUN,
        "QL_SLOTS": "4",
        "QL_CTX_TOTAL": "8192",
        "QL_BIND_ADDRESS": "127.0.0.1",
        **{name: str(port) for name, port in ports.items()},
    }
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()), encoding="utf-8")


def _build_images(stack: Stack, toolchain: Toolchain, environ: dict[str, str]) -> None:
    """Every image, under the compose cache's lock: two runs on one machine never take each
    other's half-made rootfs, wheels or build contexts (quantload.cache_lock)."""
    with cache_lock(images.compose_cache(environ), "the compose images' cache", on_wait=print):
        _build_images_locked(stack, toolchain, environ)


def _build_images_locked(stack: Stack, toolchain: Toolchain, environ: dict[str, str]) -> None:
    timings, client, deadline = stack.timings, stack.client, stack.deadline
    cache = images.compose_cache(environ)
    with timings.measure("base rootfs (debootstrap)") as step:
        tarball, cached = images.base_rootfs_tarball(cache, os.environ)  # QUANTLOAD_TEST_DEBIAN_MIRROR
        step.note = "cached tarball" if cached else f"made {tarball.stat().st_size / 1e6:.0f} MB"
    with timings.measure("base image (docker import)") as step:
        step.note = "already in the engine" if images.ensure_base_image(client, tarball) else "imported"
    with timings.measure("wheels (pip download on the host)") as step:
        wheels, cached = images.ensure_wheels(cache)
        step.note = "cached" if cached else f"fetched {len(list(wheels.glob('*.whl')))} wheels"
    with timings.measure("image llama.cpp full stand-in"):
        images.build_image(
            client, images.llama_context(cache, toolchain, environ), images.LLAMA_FULL_IMAGE, "full"
        )
    with timings.measure("image llama.cpp server stand-in"):
        images.build_image(
            client, images.llama_context(cache, toolchain, environ), images.LLAMA_SERVER_IMAGE, "server"
        )
    with timings.measure("image prometheus stand-in"):
        images.build_image(client, images.prometheus_context(cache), images.PROMETHEUS_IMAGE)
    with timings.measure("image quantload (docker-compose build)"), images.wheels_in_context(wheels):
        stack.compose.run("build", "prepare", timeout_s=deadline.left(1500), services=["prepare"])


def _clear_leftovers(client: Any) -> str:
    """Containers, networks and volumes an interrupted run left in the kept data root (everything in
    it belongs to this test); without this, the engine would restart old servers on start."""
    removed = []
    for container in client.containers.list(all=True):
        container.remove(force=True, v=True)
        removed.append(container.name)
    networks = client.networks.prune().get("NetworksDeleted") or []
    volumes = client.volumes.prune().get("VolumesDeleted") or []
    return ", ".join([*removed, *networks, *volumes])


def _probe_bridge(stack: Stack, note: str) -> None:
    """One container reaching another over the project network (the FORWARD-chain pitfall)."""
    probe = "import socket; socket.create_connection(('llama-f16', 8080), 5).close()"
    code, output = stack.container("exporter").exec_run(["python", "-c", probe])
    if code != 0:
        forward = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True, check=False)
        pytest.fail(
            "containers resolve each other but cannot connect (exporter -> llama-f16:8080):"
            f" {output.decode(errors='replace').strip().splitlines()[-1:]}. The host's FORWARD chain"
            f" probably drops bridged traffic. {note}. iptables -S FORWARD: {forward.stdout.strip()!r}"
        )


@pytest.fixture(scope="module")
def stack(
    toolchain: Toolchain, wikitext_test_raw: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:  # fmt: skip
    """The stack, up and healthy; afterwards `down -v`, the engine stopped, the switch restored."""
    dockerd = _prerequisites()
    environ = clean_env()
    cache = images.compose_cache(environ)
    deadline = Deadline(BOUND_S - 60)
    timings = Timings()
    workdir = tmp_path_factory.mktemp("compose-e2e")
    with contextlib.ExitStack() as exits:
        bridge_note = exits.enter_context(bridge_traffic_allowed())
        driver = os.environ.get("QUANTLOAD_TEST_DOCKER_STORAGE", "vfs")
        data_root, root_note = exits.enter_context(_data_root(cache, driver))
        try:
            engine = exits.enter_context(private_engine(dockerd, data_root, driver))
        except EngineError as error:
            missing(f"the Docker engine would not start: {error}")
        timings.add("engine start (until it answers)", engine.started_s, f"{driver}, {root_note}")
        client = engine.client()
        exits.callback(client.close)
        left = _clear_leftovers(client)
        ports = {name: free_port() for name in (
            "QL_F16_PORT", "QL_Q8_0_PORT", "QL_Q4_K_M_PORT", "QL_PROMETHEUS_PORT", "QL_GRAFANA_PORT",
            "QL_LOCUST_PORT", "QL_LOCUST_MASTER_PORT",
        )}  # fmt: skip
        env_file = workdir / "test.env"
        _env_file(env_file, ports)
        project = f"qle2e{secrets.token_hex(3)}"
        compose = Compose(project, env_file, engine.env(), client)
        built = Stack(compose, engine, client, ports, workdir, timings, deadline, notes=[bridge_note])
        if left:
            built.notes.append(f"removed what an interrupted earlier run left in the data root: {left}")
        exits.callback(_finish, built, cache)
        try:
            _bring_up(built, toolchain, environ, wikitext_test_raw, bridge_note)
        except BaseException:
            with contextlib.suppress(Exception):
                for name, text in keep_job_logs(built, workdir / "jobs").items():
                    print(f"---- compose job log: {name}\n{text}")
            raise
        yield built


def _bring_up(stack: Stack, toolchain: Toolchain, environ: dict[str, str], wikitext: Path, bridge_note: str) -> None:
    """Images, the seeded cache volume, `up -d` (compose waits for prepare and the servers), and
    every container ready."""
    compose, timings, deadline = stack.compose, stack.timings, stack.deadline
    _build_images(stack, toolchain, environ)
    with timings.measure("seed the cache volume (vocabulary, WikiText-2)"):
        compose.run(
            "run", "--rm", "--no-deps", "-T", "prepare", "tar", "-x", "-C", "/home/quantload/.cache",
            timeout_s=deadline.left(300), input_bytes=_seed_archive(environ, wikitext),
        )  # fmt: skip
    with timings.measure("up -d (prepare done, servers healthy: compose waits)"):
        compose.run(
            "up", "-d", "--scale", f"locust-worker={WORKERS}", *STARTED,
            timeout_s=deadline.left(900), services=STARTED,
        )  # fmt: skip
    with timings.measure("after up: every container ready"):
        compose.wait_ready([s for s in STARTED if s != "prepare"], deadline.left(300))
    _probe_bridge(stack, bridge_note)


ONE_SHOT_JOBS = ("prepare",)  # one-shot services whose containers stay: their logs come from compose


def job_logs(stack: Stack) -> dict[str, str]:
    """Every one-shot job's whole log: the prepare job's (its container stays after it exits) and
    the output of every `run` the tests made (load, report, the fault run's load)."""
    logs = {service: stack.kept_logs.get(service) or stack.compose.all_logs(service) for service in ONE_SHOT_JOBS}
    logs.update(stack.compose.job_outputs)
    return logs


def keep_job_logs(stack: Stack, folder: Path) -> dict[str, str]:
    """The job logs written to `folder` (one file per job), and returned."""
    logs = job_logs(stack)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in logs.items():
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")
        (folder / f"{safe}.log").write_text(text + "\n", encoding="utf-8")
    return logs


def failure_sections(item: pytest.Item) -> list[tuple[str, str]]:
    """Report sections for a failed test of this module: every one-shot job's log (conftest)."""
    stack = getattr(item, "funcargs", {}).get("stack")
    if not isinstance(stack, Stack):
        return []
    try:
        logs = keep_job_logs(stack, stack.workdir / "jobs")
    except Exception as error:  # the engine itself may be what failed
        return [("compose job logs", f"could not be read: {error!r}")]
    return [(f"compose job log: {name}", text) for name, text in logs.items()]


def _disk_used(folder: Path) -> int | None:
    du = subprocess.run(["du", "-sb", str(folder)], capture_output=True, text=True, timeout=600, check=False)
    return int(du.stdout.split()[0]) if du.returncode == 0 else None


def _finish(stack: Stack, cache: Path) -> None:
    """Tear down whatever the tests left: down -v, prune, sizes, timings (engine stops after)."""
    with contextlib.suppress(Exception):  # before down -v removes the prepare job's container
        kept = cache / "last-run-jobs"
        shutil.rmtree(kept, ignore_errors=True)
        keep_job_logs(stack, kept)  # the last e2e's job logs, whatever its outcome
    if not stack.down_done:
        with contextlib.suppress(StackFailure):
            stack.compose.run("down", "-v", "--remove-orphans", timeout_s=300, check=False)
    for name in (*images.STANDIN_IMAGES, "quantload:0.1.0"):
        with contextlib.suppress(Exception):
            stack.timings.sizes_bytes[f"image {name}"] = int(stack.client.images.get(name).attrs["Size"])
    with stack.timings.measure("du of the data root"):
        used = _disk_used(stack.engine.data_root)
    if used is not None and used > PRUNE_ABOVE_BYTES:
        # Every rebuild leaves the old image's layers, each a full copy under vfs; deleting them
        # takes minutes, so it is done only once they add up.
        with stack.timings.measure("prune dangling images (data root above the threshold)"):
            with contextlib.suppress(Exception):
                stack.client.images.prune(filters={"dangling": True})
            used = _disk_used(stack.engine.data_root)
    if used is not None:
        stack.timings.sizes_bytes["engine data root"] = used
        (stack.engine.data_root.parent / f"{stack.engine.data_root.name}.size").write_text(str(used))
    stack.timings.write(cache / "last-run.json")
    print("\ncompose e2e wall times (uptime load:", os.getloadavg()[0], ")\n" + stack.timings.render())
    for note in stack.notes:
        print("note:", note)


# ---------------------------------------------------------------- the stack up


def test_up_brings_every_service_to_health(stack: Stack) -> None:
    states = stack.compose.states()
    by_service: dict[str, list[Any]] = {}
    for state in states:
        by_service.setdefault(state.service, []).append(state)
    assert set(by_service) == set(STARTED), "grafana is left out; nothing else"
    (prepare,) = by_service["prepare"]
    assert prepare.state == "exited" and prepare.exit_code == 0
    for name in (*SERVERS, "exporter", "prometheus", "locust-master"):
        (state,) = by_service[name]
        assert (state.state, state.health) == ("running", "healthy"), (name, state)
    assert [w.state for w in by_service["locust-worker"]] == ["running"] * WORKERS
    for name, variable in (("llama-f16", "QL_F16_PORT"), ("prometheus", "QL_PROMETHEUS_PORT")):
        (state,) = by_service[name]
        assert all(p.startswith("127.0.0.1:") for p in state.ports), state.ports  # loopback only
        assert any(p.startswith(f"127.0.0.1:{stack.ports[variable]}->") for p in state.ports)
    # The same view from quantload, through the Docker SDK.
    env = {**clean_env(), "DOCKER_HOST": stack.engine.host}
    shown = run_quantload(["stack", "ps", "--project", stack.compose.project, "--json"], cwd=REPO, env=env)
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert {row["service"] for row in rows} == set(STARTED) and not any(row["problem"] for row in rows)
    health = httpx.get(f"{stack.url('QL_F16_PORT')}/health", timeout=5)  # a server from the host
    assert health.status_code == 200


def _ui_rows(html: str) -> dict[str, list[str]]:
    """{row name: cell texts} of the Locust statistics table in the rendered page."""
    rows: dict[str, list[str]] = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", html, flags=re.S):
        cells = [
            re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)
        ]
        if len(cells) >= 3:
            rows[cells[1]] = cells[2:]
    return rows


def _numbers(cells: list[str]) -> list[float]:
    found = []
    for cell in cells:
        with contextlib.suppress(ValueError):
            found.append(float(cell))
    return found


def test_locust_web_ui_shows_ttft_and_tpot_while_two_workers_load(stack: Stack) -> None:
    web = stack.url("QL_LOCUST_PORT")
    chromium = shutil.which("chromium") or ""
    stats: dict[str, Any] = {}

    def poll() -> dict[str, Any]:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            return dict(httpx.get(f"{web}/stats/requests", timeout=3).json())
        return {}

    deadline = time.monotonic() + stack.deadline.left(90)
    while time.monotonic() < deadline and poll().get("worker_count") != WORKERS:
        time.sleep(1)
    assert poll().get("worker_count") == WORKERS, "both workers should be connected to the master"
    started = httpx.post(f"{web}/swarm", data={"user_count": 4, "spawn_rate": 4}, timeout=10)
    assert started.status_code == 200 and started.json().get("success"), started.text
    try:
        deadline = time.monotonic() + stack.deadline.left(120)
        while time.monotonic() < deadline:
            stats = poll()
            rows = {s["name"]: s["num_requests"] for s in stats.get("stats", [])}
            if rows.get("TTFT", 0) >= 4 and rows.get("TPOT", 0) >= 4:
                break
            time.sleep(1)
        common = [chromium, *CHROMIUM_FLAGS, "--window-size=1400,900", "--virtual-time-budget=10000"]
        dom = subprocess.run(
            [*common, f"--user-data-dir={stack.workdir / 'chrome-dom'}", "--dump-dom", f"{web}/"],
            capture_output=True, text=True, timeout=stack.deadline.left(120), check=False,
        )  # fmt: skip
        shot = stack.workdir / "locust-ui.png"
        subprocess.run(
            [*common, f"--user-data-dir={stack.workdir / 'chrome-shot'}", f"--screenshot={shot}", f"{web}/"],
            capture_output=True, timeout=stack.deadline.left(120), check=False,
        )  # fmt: skip
    finally:
        httpx.get(f"{web}/stop", timeout=10)
    cells = _ui_rows(dom.stdout)
    for name in ("TTFT", "TPOT"):
        assert name in cells, f"no {name} row in the rendered UI: {sorted(cells)}"
        numbers = _numbers(cells[name])
        assert len(numbers) >= 5 and numbers[0] >= 4, cells[name]  # requests, then timings
    from PIL import Image  # matplotlib's dependency

    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 900) and len(image.getcolors(1 << 24) or []) > 50, "blank screenshot"
    shutil.copy2(shot, images.compose_cache(clean_env()) / "last-locust-ui.png")
    workers = {w.get("id") for w in stats.get("workers", [])}
    assert len(workers) == WORKERS


# ---------------------------------------------------------------- load, KV check, report


def _query(stack: Stack, promql: str) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{stack.url('QL_PROMETHEUS_PORT')}/api/v1/query", params={"query": promql}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    result: list[dict[str, Any]] = answer.json()["data"]["result"]
    return result


def _run_folder(stack: Stack, run: str) -> Path:
    """The run folder copied out of the results volume with the SDK (any llama-server mounts it)."""
    chunks, _ = stack.container("llama-f16").get_archive(f"/results/{run}")
    target = stack.workdir / "results"
    target.mkdir(exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        tar.extractall(target, filter="data")
    return target / run


def test_load_kv_check_and_report_jobs(stack: Stack) -> None:
    with stack.timings.measure("load job (run --rm --use-aliases load)"):
        loaded = stack.compose.run(
            "run", "--rm", "-T", "--use-aliases", "load",
            timeout_s=stack.deadline.left(900), services=["load", *SERVERS],
        )  # fmt: skip
    (stack.workdir / "load-job.log").write_bytes(loaded.stdout + loaded.stderr)
    env = {**clean_env(), "DOCKER_HOST": stack.engine.host}
    with stack.timings.measure("KV check (quantload stack kv, Docker SDK)"):
        kv = run_quantload(["stack", "kv", "--project", stack.compose.project, "--json"], cwd=REPO, env=env)
    assert kv.returncode == 0, kv.stderr + kv.stdout
    with stack.timings.measure("report job (run --rm report)"):
        stack.compose.run("run", "--rm", "-T", "report", timeout_s=stack.deadline.left(600),
                          services=["report", "prometheus"])  # fmt: skip
    run_dir = _run_folder(stack, RUN)
    kept = images.compose_cache(clean_env()) / "last-run" / RUN  # the last e2e report, to look at
    shutil.rmtree(kept, ignore_errors=True)
    shutil.copytree(run_dir, kept)
    # The copy-out command docs/compose.md gives users: the same files come out.
    # The servers keep writing their logs, so tar may note a file changed while it read it: exit 1.
    copied = stack.compose.run(
        "run", "--rm", "--no-deps", "-T", "report",
        "tar", "-C", "/results", "--warning=no-file-changed", "-cf", "-", RUN,
        timeout_s=stack.deadline.left(120), check=False,
    )  # fmt: skip
    assert copied.returncode in (0, 1), copied.stderr[-2000:]
    with tarfile.open(fileobj=io.BytesIO(copied.stdout)) as tar:
        names = {name for name in tar.getnames() if not name.endswith("/")}
    assert {f"{RUN}/{p.relative_to(run_dir)}" for p in run_dir.rglob("*") if p.is_file()} <= names
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["quants"] == ["F16", "Q8_0", "Q4_K_M"], loaded.stdout[-2000:]
    assert {(level["quant"], level["users"]) for level in summary["sweep_levels"]} == {
        (q, u) for q in SERVERS.values() for u in (1, 2)
    }
    kv_rows = {row["quant"]: row for row in summary["kv"]}
    assert set(kv_rows) == set(SERVERS.values()) and all(row["diff_pct"] == 0.0 for row in kv_rows.values())
    kv_file = json.loads((run_dir / "kv.json").read_text())
    assert all(r["server_build"] for r in kv_file["results"].values())
    assert summary["prometheus"]["series_points"] > 0, "no server series from the stack's Prometheus"
    assert summary["prometheus"]["origin"], summary["prometheus"]
    for row in summary["table"]:
        assert isinstance(row["ttft_p50_s_at_1_users"], float), row
        assert isinstance(row["perplexity"], float), row  # quality ran in prepare, on the seeded text
    report = (run_dir / "report.md").read_text()
    assert all(q in report for q in SERVERS.values())


def test_prometheus_holds_every_server_and_both_workers(stack: Stack) -> None:
    servers = _query(stack, 'count by (server) (quantload_target_up{job="exporter"} == 1)')
    assert {r["metric"]["server"] for r in servers} == set(SERVERS)
    slots = _query(stack, "count by (server) (quantload_server_slots)")
    assert {r["metric"]["server"] for r in slots} == set(SERVERS)
    # Series of load generators that have gone (the load job) are stale now: look back over the run.
    seen = _query(
        stack, 'count by (instance) (count_over_time(quantload_ttft_seconds_count{job="loadgen"}[1h]))'
    )
    instances = {r["metric"]["instance"].split(":")[0] for r in seen}
    workers = set()
    for worker in [c for s, c in _project_pairs(stack) if s.service == "locust-worker"]:
        workers |= {net["IPAddress"] for net in worker.attrs["NetworkSettings"]["Networks"].values()}
    assert len(workers) == WORKERS and workers <= instances, (workers, instances)
    assert len(instances) >= WORKERS + 1, instances  # the load job too, found by its alias


# ---------------------------------------------------------------- fault, then down


def test_a_server_killed_mid_load_fails_its_stages_and_the_job_goes_on(stack: Stack) -> None:
    fault_env = {"QL_RUN": FAULT_RUN}
    smaller = [
        "-e",
        "QUANTLOAD_LOAD__REPEATS=1",
        "-e",
        "QUANTLOAD_LOAD__PROMPT_COUNT=3",
        "-e",
        "QUANTLOAD_LOAD__USERS=[1]",
    ]
    load = subprocess.Popen(
        stack.compose.argv("run", "--rm", "-T", "--no-deps", "--use-aliases", *smaller, "load"),
        cwd=REPO, env={**stack.compose.environ, **fault_env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    killed = False
    try:
        reader = stack.container("llama-f16")
        deadline = time.monotonic() + stack.deadline.left(600)
        while time.monotonic() < deadline and load.poll() is None:
            code, out = reader.exec_run(
                ["grep", "-c", f'"server":"{KILLED}"', f"/results/{FAULT_RUN}/records.jsonl"]
            )
            if code == 0 and int(out.strip() or 0) >= 1:
                stack.container(KILLED).kill()
                killed = True
                break
            time.sleep(0.5)
        output, _ = load.communicate(timeout=stack.deadline.left(600))
    finally:
        if load.poll() is None:
            load.kill()
            load.wait(30)
    text = output.decode("utf-8", "replace")
    (stack.workdir / "fault-load-job.log").write_text(text, encoding="utf-8")
    stack.compose.keep_job_output("load (fault run)", text + f"\n[exit {load.returncode}]")
    assert killed, f"{KILLED}'s load never started: {text[-2000:]}"
    assert load.returncode == 1, f"the job should finish and say some stages failed: {text[-3000:]}"
    env = {**clean_env(), "DOCKER_HOST": stack.engine.host}
    kv = run_quantload(
        ["stack", "kv", "--project", stack.compose.project, "--run-folder", f"/results/{FAULT_RUN}"],
        cwd=REPO, env=env,
    )  # fmt: skip
    assert kv.returncode == 1 and f"{KILLED} died" in kv.stdout, kv.stdout + kv.stderr
    stack.compose.run("run", "--rm", "-T", "--no-deps", "report", timeout_s=stack.deadline.left(600),
                      env=fault_env, services=["report"])  # fmt: skip
    run_dir = _run_folder(stack, FAULT_RUN)
    stages = [json.loads(line) for line in (run_dir / "stages.jsonl").read_text().splitlines()]
    ends = [e for e in stages if e["event"] == "stage_end"]
    by_server: dict[str, set[str]] = {}
    for end in ends:
        by_server.setdefault(end["server"], set()).add(end["status"])
    assert by_server["llama-q4-k-m"] == {"ok"}, "the server after the killed one must still be measured"
    skipped = f"{KILLED} (Q8_0) prefix_cache: cannot reach" in " ".join(text.split())  # killed between its experiments
    assert by_server[KILLED] - {"ok"} or skipped, f"{KILLED} lost nothing to the kill: {by_server}"
    assert "the server's remaining experiments were not run" in " ".join(text.split())  # lines wrap
    report = (run_dir / "report.md").read_text()
    assert f"{KILLED} died: its container exited with code 137 (killed by signal 9, SIGKILL)" in report
    assert "Q8_0" in report
    shown = run_quantload(["stack", "ps", "--project", stack.compose.project, "--json"], cwd=REPO, env=env)
    assert shown.returncode == 1, "a dead server is a problem quantload stack ps reports"
    dead = next(row for row in json.loads(shown.stdout) if row["service"] == KILLED)
    assert dead["problem"], dead


def test_down_leaves_no_container_network_or_volume(stack: Stack) -> None:
    stack.kept_logs.update({service: stack.compose.all_logs(service) for service in ONE_SHOT_JOBS})
    with stack.timings.measure("down -v"):
        stack.compose.run("down", "-v", "--remove-orphans", timeout_s=stack.deadline.left(300))
    stack.down_done = True
    label = {"label": f"com.docker.compose.project={stack.compose.project}"}
    assert stack.client.containers.list(all=True, filters=label) == []
    assert stack.client.networks.list(filters=label) == []
    assert stack.client.volumes.list(filters=label) == []
