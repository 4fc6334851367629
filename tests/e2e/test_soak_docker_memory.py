"""The soak's server memory through a real Docker Engine (the compose layout's source): a private
engine, containers of a one-binary image (Debian's static busybox, no network), and the Docker
SDK's stats read as `docker stats` shows them (quantload.experiments.soak.watch.DockerMemory).

Assertions compare two containers with each other and with what one of them holds, never a
figure of this machine's own.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compose_e2e.engine import DOCKER_API_VERSION, EngineError, private_engine

from quantload.experiments.soak.watch import DockerMemory, ProbeError
from quantload.paths import cache_root
from support import missing, require_binary

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]
HELD_MIB = 48  # what the busy container holds in its /dev/shm (64 MiB by default), as memory
REPOSITORY = "quantload-soak-busybox"
IMAGE = f"{REPOSITORY}:test"
BRIDGE = "qlsoak0"
BRIDGE_ADDRESS = "10.199.213.1/24"  # private, and no container of this test uses it


def _busybox(cache: Path) -> Path:
    """Debian's static busybox, fetched once with apt-get into the cache."""
    binary = cache / "busybox"
    if binary.is_file():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        fetched = subprocess.run(
            ["apt-get", "download", "busybox-static"], cwd=tmp, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        debs = list(Path(tmp).glob("busybox-static_*.deb"))
        if fetched.returncode != 0 or not debs:
            missing(f"Debian's busybox-static could not be fetched: {fetched.stderr.strip()[-200:]}")
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), tmp], check=True, timeout=60)
        shutil.copy2(Path(tmp) / "bin" / "busybox", binary)
    return binary


@contextlib.contextmanager
def _own_bridge() -> Iterator[None]:
    """A bridge for the engine alone, removed afterwards."""
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        missing(f"the bridge {BRIDGE} is in use (another run of this test?)")
    for command in (["ip", "link", "add", "name", BRIDGE, "type", "bridge"],
                    ["ip", "addr", "add", BRIDGE_ADDRESS, "dev", BRIDGE]):  # fmt: skip
        made = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        if made.returncode != 0:
            subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
            missing(f"could not make the bridge {BRIDGE}: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, timeout=30, check=False)


def _image_tar(busybox: Path) -> bytes:
    """A root filesystem of /bin/busybox alone, as `docker import` takes it."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        folder = tarfile.TarInfo("bin")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        tar.add(busybox, arcname="bin/busybox")
    return data.getvalue()


@pytest.fixture(scope="module")
def engine_env() -> Iterator[dict[str, str]]:
    """A private engine with the busybox image; DOCKER_HOST aimed at it. Stopped afterwards."""
    if os.geteuid() != 0:
        missing("a private Docker Engine needs root")
    dockerd = require_binary("dockerd", "apt-get install docker.io")
    require_binary("dpkg-deb", "apt-get install dpkg")
    cache = cache_root(None, os.environ) / "soak-docker"
    busybox = _busybox(cache)
    with tempfile.TemporaryDirectory(prefix="ql-soak-root-", dir="/tmp") as root, contextlib.ExitStack() as exits:
        try:
            # a bridge of its own, so another engine's docker0 is left alone (`--bridge=none` would
            # make dockerd delete it); the containers have no network anyway
            exits.enter_context(_own_bridge())
            running = exits.enter_context(
                private_engine(dockerd, Path(root) / "data", extra_args=(f"--bridge={BRIDGE}",))
            )
        except EngineError as error:
            missing(f"the Docker engine would not start: {error}")
        client = running.client()
        exits.callback(client.close)
        client.api.import_image_from_data(_image_tar(busybox), repository=REPOSITORY, tag="test")
        yield running.env()
        for container in client.containers.list(all=True):
            with contextlib.suppress(Exception):
                container.remove(force=True)


def _container(environ: dict[str, str], name: str, script: str) -> Any:
    import docker

    client = docker.DockerClient(base_url=environ["DOCKER_HOST"], version=DOCKER_API_VERSION)
    return client.containers.run(
        IMAGE, ["/bin/busybox", "sh", "-c", script], name=name, detach=True, network_mode="none",
    )  # fmt: skip (the caller closes container.client once it has removed the container)


def _settled_reading(probe: DockerMemory, at_least: int, within_s: float) -> int:
    """The probe's reading once it reaches `at_least` bytes (or the last one after `within_s`)."""
    deadline = time.monotonic() + within_s
    reading = probe.read()
    while reading < at_least and time.monotonic() < deadline:
        time.sleep(0.5)
        reading = probe.read()
    return reading


def test_a_containers_memory_is_read_as_docker_stats_shows_it(engine_env: dict[str, str]) -> None:
    idle = _container(engine_env, "soak-idle", "exec /bin/busybox sleep 300")
    busy = _container(
        engine_env, "soak-busy",
        f"/bin/busybox dd if=/dev/zero of=/dev/shm/held bs=1M count={HELD_MIB}; exec /bin/busybox sleep 300",
    )  # fmt: skip
    try:
        idle_probe = DockerMemory("soak-idle", engine_env)
        busy_probe = DockerMemory(busy.id, engine_env)  # by id as well as by name
        assert (idle_probe.source, busy_probe.source) == ("docker", "docker")
        held = _settled_reading(busy_probe, HELD_MIB * 2**20, within_s=120)
        quiet = idle_probe.read()
        assert held >= HELD_MIB * 2**20, f"{held / 2**20:.1f} MiB"
        assert 0 < quiet < held / 4, f"idle {quiet / 2**20:.1f} MiB, busy {held / 2**20:.1f} MiB"
        idle.stop(timeout=1)
        with pytest.raises(ProbeError, match="no memory usage"):
            idle_probe.read()  # a stopped container has nothing to read: a reason, not a crash
        idle_probe.close()
        busy_probe.close()
    finally:
        for container in (idle, busy):
            with contextlib.suppress(Exception):
                container.remove(force=True)
            container.client.close()


def test_an_unknown_container_is_one_line_naming_the_setting(engine_env: dict[str, str]) -> None:
    with pytest.raises(ProbeError) as caught:
        DockerMemory("no-such-server", engine_env)
    assert "no container 'no-such-server'" in caught.value.problem
    assert "soak.server_container" in (caught.value.hint or "")
