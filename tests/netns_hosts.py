"""Hosts for tests: Linux network namespaces joined by veth links on a bridge, made and removed by name.

Layout: one namespace per host plus one for the switch. The bridge `br0` lives in the switch
namespace; every host has an `eth0` with its own address in `SUBNET`.0/24, whose veth peer
(`p-<host>`) is a port of the bridge. Nothing is made in the namespace the tests run in (no
address, link or route), so traffic goes only between the hosts a test made, and no firewall or
bridge setting of the machine sees it.

Names: `qlnet-<pid>-<token>-<host>` (`<host>` "switch" for the bridge), unique per run; at the
start, `sweep_stale()` removes the namespaces of this prefix whose creating process is gone (a
crashed or killed earlier run), never those of a run that is still going.

Processes: `spawn(host, argv)` starts a command in a host (`ip netns exec`), in a session of its
own and dying with the test process (PR_SET_PDEATHSIG); `run(host, argv)` runs one to its end.
`remove()` stops every spawned session by pid (SIGTERM, then SIGKILL), kills whatever still runs in
the namespaces (`ip netns pids`) and deletes them; `leftovers()` lists what would remain: a
namespace still named, a process still in one (found by the namespace's inode in every
`/proc/<pid>/ns/net`, which also proves its links are gone), a spawned pid still alive.

Faults of the network itself: `link_down(host)` / `link_up(host)` switch off the switch's port of
that host (a pulled cable, a partition), `limit_rate(host, kbit)` puts a `tbf` on the host's own
`eth0` (what it sends), `clear_limit(host)` removes it. (The kernel here has no `netem`: delay comes
from `netns_relay.py` run on the path.)

Needs root and `ip` (iproute2); `unavailable()` says why not when they are missing.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from quantload.childproc import die_with_parent

PREFIX = "qlnet-"
SUBNET = "10.213.77"  # a /24 that exists only inside these namespaces
FIRST_HOST = 10
SWITCH = "switch"
BRIDGE = "br0"
STOP_GRACE_S = 10.0
COMMAND_TIMEOUT_S = 30.0
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-[0-9a-f]+-[a-z0-9]+$")


def _ip(*args: str, check: bool = True, timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result


def _tc(namespace: str, *args: str) -> None:
    result = subprocess.run(
        ["ip", "netns", "exec", namespace, "tc", *args],
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)} in {namespace}: {result.stderr.strip()}")


def unavailable() -> str | None:
    """Why hosts cannot be made here (not root, no iproute2, no tc), or None when they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (Debian/Ubuntu: apt-get install iproute2)"
    return None


def namespaces() -> list[str]:
    """Every named network namespace on the machine."""
    listed = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def _pids_in(namespace: str) -> list[int]:
    out = _ip("netns", "pids", namespace, check=False).stdout
    return [int(word) for word in out.split() if word.isdigit()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_all(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def sweep_stale() -> list[str]:
    """Remove namespaces of our prefix whose creating process has ended; the names removed."""
    removed = []
    for name in namespaces():
        match = _NAME.match(name)
        if match is None or _alive(int(match.group(1))):
            continue
        _kill_all(_pids_in(name))
        _ip("netns", "del", name, check=False)
        removed.append(name)
    return removed


def _inode(namespace: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{namespace}").st_ino
    except OSError:
        return None


def processes_in_namespace(inode: int) -> list[int]:
    """Every process whose network namespace has this inode."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            link = os.readlink(entry / "ns" / "net")
        except OSError:
            continue
        if link == f"net:[{inode}]":
            found.append(int(entry.name))
    return found


@dataclass(frozen=True)
class Host:
    """One host: its role name, its namespace and its address."""

    name: str
    namespace: str
    address: str

    @property
    def switch_port(self) -> str:
        return f"p-{self.name}"[:15]

    def url(self, port: int, path: str = "") -> str:
        return f"http://{self.address}:{port}{path}"


class HostNetwork:
    """Hosts named `names` on one switch (see the module docstring)."""

    def __init__(self, names: Sequence[str]) -> None:
        if len(set(names)) != len(names) or SWITCH in names:
            raise ValueError(f"host names must differ and not be {SWITCH!r}: {names}")
        self.tag = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{self.tag}-{SWITCH}"
        self.hosts = {
            name: Host(name, f"{self.tag}-{name}", f"{SUBNET}.{FIRST_HOST + index}")
            for index, name in enumerate(names)
        }
        self.inodes: dict[str, int] = {}
        self.spawned: list[subprocess.Popen[bytes]] = []

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def build(self) -> HostNetwork:
        """Make the switch and every host; on any failure, remove what was made and raise."""
        try:
            self._add_namespace(self.switch)
            _ip("-n", self.switch, "link", "add", BRIDGE, "type", "bridge")
            _ip("-n", self.switch, "link", "set", BRIDGE, "up")
            for host in self.hosts.values():
                self._add_namespace(host.namespace)
                _ip(
                    "link", "add", "eth0", "netns", host.namespace, "type", "veth",
                    "peer", "name", host.switch_port, "netns", self.switch,
                )  # fmt: skip
                _ip("-n", self.switch, "link", "set", host.switch_port, "master", BRIDGE)
                _ip("-n", self.switch, "link", "set", host.switch_port, "up")
                _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
                _ip("-n", host.namespace, "link", "set", "eth0", "up")
                _ip("-n", host.namespace, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise
        return self

    def _add_namespace(self, namespace: str) -> None:
        _ip("netns", "add", namespace)
        inode = _inode(namespace)
        if inode is not None:
            self.inodes[namespace] = inode

    # ------------------------------------------------------------------ processes

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` as run inside `host`."""
        return ["ip", "netns", "exec", self.hosts[host].namespace, *argv]

    def spawn(
        self,
        host: str,
        argv: Sequence[str],
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start `argv` in `host`, its output appended to `log`; stopped by `stop` or `remove`."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as handle:
            handle.write(f"$ [{host}] {' '.join(argv)}\n".encode())
            handle.flush()
            process = subprocess.Popen(
                self.command(host, argv), stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
                preexec_fn=die_with_parent(),
            )  # fmt: skip
        self.spawned.append(process)
        return process

    def run(
        self,
        host: str,
        argv: Sequence[str],
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` in `host` to its end (its whole session killed if it overruns)."""
        process = subprocess.Popen(
            self.command(host, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None, cwd=cwd, text=True, start_new_session=True,
            preexec_fn=die_with_parent(),
        )  # fmt: skip
        try:
            out, err = process.communicate(timeout=timeout_s)
        except BaseException:
            _stop_session(process)
            process.communicate()
            raise
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def python(self, host: str, code: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        """Run a Python snippet in `host` with this interpreter; its stdout (AssertionError if it fails)."""
        result = self.run(host, [sys.executable, "-c", code], timeout_s)
        if result.returncode != 0:
            raise AssertionError(f"python in {host} failed: {result.stderr[-2000:]}")
        return result.stdout

    def get(self, host: str, url: str, timeout_s: float = 10.0) -> str:
        """The body of a GET of `url`, sent from `host`."""
        code = (
            "import sys, urllib.request\n"
            f"sys.stdout.write(urllib.request.urlopen({url!r}, timeout={timeout_s!r}).read().decode())"
        )
        return self.python(host, code, timeout_s + 5)

    def wait_listening(self, host: str, address: str, port: int, timeout_s: float) -> None:
        """Until a TCP connection from `host` to address:port succeeds (AssertionError on timeout)."""
        code = (
            "import socket, sys, time\n"
            f"deadline = time.monotonic() + {timeout_s!r}\n"
            "while time.monotonic() < deadline:\n"
            "    try:\n"
            f"        socket.create_connection(({address!r}, {port}), 1).close(); sys.exit(0)\n"
            "    except OSError:\n"
            "        time.sleep(0.2)\n"
            "sys.exit(1)\n"
        )
        result = self.run(host, [sys.executable, "-c", code], timeout_s + 10)
        if result.returncode != 0:
            raise AssertionError(f"nothing listens on {address}:{port} as seen from {host} after {timeout_s:g} s")

    def stop(self, process: subprocess.Popen[bytes]) -> int:
        """Stop one spawned process and everything it started; its exit code."""
        _stop_session(process)
        return process.returncode

    # ------------------------------------------------------------------ faults

    def link_down(self, host: str) -> None:
        """Switch off the switch's port of `host`: it is cut off from every other host."""
        _ip("-n", self.switch, "link", "set", self.hosts[host].switch_port, "down")

    def link_up(self, host: str) -> None:
        _ip("-n", self.switch, "link", "set", self.hosts[host].switch_port, "up")

    def limit_rate(self, host: str, kbit: int, burst_bytes: int = 1600, latency_ms: int = 10000) -> None:
        """A token-bucket filter on `host`'s eth0: what it sends goes at most `kbit` kbit/s, with a
        bucket of one full frame (so no idle moment lets kilobytes through at once) and a queue of
        `latency_ms` (so packets wait instead of being dropped)."""
        _tc(self.hosts[host].namespace, "qdisc", "replace", "dev", "eth0", "root", "tbf",
            "rate", f"{kbit}kbit", "burst", str(burst_bytes), "latency", f"{latency_ms}ms")  # fmt: skip

    def clear_limit(self, host: str) -> None:
        _tc(self.hosts[host].namespace, "qdisc", "del", "dev", "eth0", "root")

    # ------------------------------------------------------------------ the end

    def remove(self) -> None:
        """Stop every process, then delete every namespace of this network (safe to call twice)."""
        for process in reversed(self.spawned):
            _stop_session(process)
        mine = [host.namespace for host in self.hosts.values()] + [self.switch]
        for namespace in mine:
            if namespace in namespaces():
                _kill_all(_pids_in(namespace))
        deadline = time.monotonic() + STOP_GRACE_S
        while any(_pids_in(ns) for ns in mine if ns in namespaces()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for namespace in mine:
            _ip("netns", "del", namespace, check=False)

    def leftovers(self) -> list[str]:
        """What of this network is still there (empty after `remove`)."""
        left = [f"namespace {name}" for name in namespaces() if name.startswith(self.tag)]
        for namespace, inode in self.inodes.items():
            left += [f"pid {pid} in {namespace}" for pid in processes_in_namespace(inode)]
        left += [f"spawned pid {p.pid} still running" for p in self.spawned if p.poll() is None]
        return left


def _stop_session(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """SIGTERM to the process's session (its process group), SIGKILL after the grace; reaped."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever of the session is left
    if process.poll() is None:
        process.wait(STOP_GRACE_S)


def interrupt_on_sigterm() -> None:
    """SIGTERM raises KeyboardInterrupt, so a script stopped with it still removes its hosts (a
    process killed outright leaves them to the next run's `sweep_stale`)."""
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def host_network(names: Sequence[str]) -> Iterator[HostNetwork]:
    """A built network of `names` (stale ones of earlier runs swept first), removed on the way out
    whatever happens, SIGTERM included (it is made an interruption meanwhile); AssertionError on
    the way out if anything of it was left behind."""
    sweep_stale()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    network = HostNetwork(names)
    try:
        network.build()
        yield network
    finally:
        network.remove()
        signal.signal(signal.SIGTERM, previous)
        left = network.leftovers()
        assert not left, f"left behind: {left}"
