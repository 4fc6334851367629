"""A private Docker Engine for one test session, started and stopped by its pid.

    with bridge_traffic_allowed() as note, private_engine(data_root, workdir) as engine:
        client = engine.client()

The engine has its own data root (kept between runs as an image cache, or a temporary one), exec
root, socket and pid file, uses the vfs storage driver (another on request), and leaves the host's network rules alone
(`--iptables=false --ip-masq=false --ip-forward=false`). Stopping it: SIGTERM to the pid in its
pid file, SIGKILL after a grace period, then its managed containerd and any container shim it left,
each by the pid it wrote; mounts left under the exec root are undone and the default bridge it
created is removed.

Bridged traffic between containers crosses the host's FORWARD chain when
`net.bridge.bridge-nf-call-iptables` is 1; a FORWARD chain that drops (an engine once run with its
own iptables handling leaves `-P FORWARD DROP`) then makes every connection between containers
time out although names resolve. `bridge_traffic_allowed` sets that switch to 0 for the session
when the chain could drop, and restores it afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

DOCKER_API_VERSION = "1.41"  # Debian bookworm's engine 20.10; the SDK's default is newer
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 30.0
HTTP_TIMEOUT_S = 600
BRIDGE_NF_CALL = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
DEFAULT_BRIDGE = "docker0"


class EngineError(Exception):
    """The engine would not start; the message says why and shows the end of its log."""


@dataclass
class Engine:
    """A running private engine."""

    process: subprocess.Popen[bytes]
    data_root: Path
    exec_root: Path
    socket: Path
    pidfile: Path
    log: Path
    started_s: float  # seconds from launch to the first answered ping

    @property
    def host(self) -> str:
        """The DOCKER_HOST value that reaches this engine."""
        return f"unix://{self.socket}"

    def env(self) -> dict[str, str]:
        """The environment for docker / docker-compose commands aimed at this engine."""
        # Nothing of the developer's own stack settings: compose lets the shell override --env-file.
        ours = ("DOCKER_", "COMPOSE_", "QL_", "GRAFANA_", "LLAMA_")
        environ = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
        environ["DOCKER_HOST"] = self.host
        # With vfs, creating a container copies its whole image (~0.6 GB for ours): on a busy disk
        # that outlasts docker-compose's default 60 s per request.
        environ["COMPOSE_HTTP_TIMEOUT"] = str(HTTP_TIMEOUT_S)
        return environ

    def client(self) -> Any:
        """A Docker SDK client of this engine."""
        return docker.DockerClient(base_url=self.host, version=DOCKER_API_VERSION, timeout=HTTP_TIMEOUT_S)

    def log_tail(self, lines: int = 30) -> str:
        return tail(self.log, lines)


def tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a text file ('' if it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _ping(host: str) -> bool:
    try:
        client = docker.DockerClient(base_url=host, version=DOCKER_API_VERSION, timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure means "not ready yet"
        return False


def start_engine(
    dockerd: str, data_root: Path, workdir: Path, storage_driver: str = "vfs", extra_args: Sequence[str] = ()
) -> Engine:
    """Start dockerd with private folders under `workdir` and `data_root` (and `extra_args`, e.g.
    `--bridge=NAME`: never `--bridge=none`, with which dockerd deletes docker0 even when another
    engine uses it); EngineError if it fails."""
    exec_root = workdir / "exec"
    exec_root.mkdir(parents=True, exist_ok=True)
    data_root.mkdir(parents=True, exist_ok=True)
    socket, pidfile, log = workdir / "docker.sock", workdir / "docker.pid", workdir / "dockerd.log"
    command = [
        dockerd, "--data-root", str(data_root), "--exec-root", str(exec_root),
        "-H", f"unix://{socket}", "--pidfile", str(pidfile), "--storage-driver", storage_driver,
        "--iptables=false", "--ip-masq=false", "--ip-forward=false", *extra_args,
    ]  # fmt: skip
    started = time.monotonic()
    with log.open("ab") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    engine = Engine(process, data_root, exec_root, socket, pidfile, log, 0.0)
    deadline = started + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stop_engine(engine)
            raise EngineError(
                f"dockerd exited with code {process.returncode} before answering; its log ends:\n"
                f"{engine.log_tail()}"
            )
        if socket.exists() and _ping(engine.host):
            engine.started_s = time.monotonic() - started
            return engine
        time.sleep(0.1)
    stop_engine(engine)
    raise EngineError(
        f"dockerd did not answer within {READY_TIMEOUT_S:.0f} s; its log ends:\n{engine.log_tail()}"
    )


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return state.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _stop_pid(pid: int, grace_s: float) -> None:
    """SIGTERM, then SIGKILL after `grace_s`, of one process this module started (or its engine did)."""
    if not _alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _engine_child_pids(exec_root: Path) -> list[int]:
    """Pids the engine's containerd and container shims wrote under the exec root."""
    pids = []
    for path in exec_root.rglob("*.pid"):
        pid = _read_pid(path)
        if pid is not None and pid > 1:
            pids.append(pid)
    return pids


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (docker-proxy, containerd), read from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _mounts_under(root: Path) -> list[str]:
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            target = line.split()[4]
            if target == str(root) or target.startswith(f"{root}/"):
                found.append(target)
    return sorted(found, key=len, reverse=True)


def stop_engine(engine: Engine) -> list[str]:
    """Stop the engine and what it started, by pid; returns notes on anything that needed force."""
    notes: list[str] = []
    pid = _read_pid(engine.pidfile) or engine.process.pid
    # Read before dockerd removes its files: containerd, shims, docker-proxy.
    children = sorted({*_engine_child_pids(engine.exec_root), *_children(pid)})
    _stop_pid(pid, STOP_GRACE_S)
    if engine.process.poll() is None:
        try:
            engine.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            engine.process.kill()
            engine.process.wait(timeout=10)
            notes.append("dockerd needed SIGKILL")
    for child in children:
        if _alive(child):
            notes.append(f"stopped leftover engine process {child}")
            _stop_pid(child, 5.0)
    for target in _mounts_under(engine.exec_root):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)
        notes.append(f"unmounted {target}")
    return notes


def _forward_chain_may_drop() -> bool | None:
    """Whether the filter table's FORWARD chain could drop a packet (None: cannot tell)."""
    iptables = shutil.which("iptables")
    if iptables is None:
        return None
    listed = subprocess.run([iptables, "-S", "FORWARD"], capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        return None
    lines = listed.stdout.split("\n")
    policy_accept = "-P FORWARD ACCEPT" in lines
    rules = [line for line in lines if line.startswith("-A FORWARD")]
    return not policy_accept or bool(rules)


@contextlib.contextmanager
def bridge_traffic_allowed() -> Iterator[str]:
    """Let bridged container traffic past the FORWARD chain for the duration; yields what was done."""
    if not BRIDGE_NF_CALL.exists():
        yield "bridged traffic is not filtered (br_netfilter not loaded)"
        return
    before = BRIDGE_NF_CALL.read_text().strip()
    may_drop = _forward_chain_may_drop()
    if before == "0" or may_drop is False:
        yield f"bridge-nf-call-iptables={before}, FORWARD chain accepts everything: left as it is"
        return
    BRIDGE_NF_CALL.write_text("0\n")
    try:
        yield (
            f"bridge-nf-call-iptables was {before} and the FORWARD chain may drop"
            f"{'' if may_drop else ' (iptables unreadable)'}: set to 0 for the test, restored after"
        )
    finally:
        BRIDGE_NF_CALL.write_text(f"{before}\n")


@contextlib.contextmanager
def private_engine(
    dockerd: str, data_root: Path, storage_driver: str = "vfs", extra_args: Sequence[str] = ()
) -> Iterator[Engine]:
    """An engine on `data_root` with its exec root and socket in a temporary folder, always stopped."""
    bridge_existed = Path(f"/sys/class/net/{DEFAULT_BRIDGE}").exists()
    # Short path: unix socket paths are limited to 107 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="ql-engine-", dir="/tmp"))
    try:
        engine = start_engine(dockerd, data_root, workdir, storage_driver, extra_args)
        try:
            yield engine
        finally:
            stopping = time.monotonic()
            for note in stop_engine(engine):
                print("engine stop:", note)
            print(f"engine stopped in {time.monotonic() - stopping:.1f} s")
    finally:
        # an engine given a bridge of its own (--bridge=NAME) made no docker0: one there now is
        # another engine's
        made_bridge = not any(arg.startswith("--bridge") for arg in extra_args)
        if made_bridge and not bridge_existed and Path(f"/sys/class/net/{DEFAULT_BRIDGE}").exists():
            subprocess.run(["ip", "link", "delete", DEFAULT_BRIDGE], capture_output=True, check=False)
        shutil.rmtree(workdir, ignore_errors=True)
