"""Whether a stage measured the server or the machine: the CPU other processes took while it ran.

At a stage's start and end, three CPU clocks are read from /proc: the whole machine's busy time
(`/proc/stat`), the time of quantload's own process tree (this process and every descendant: the
Locust processes, and the servers quantload started), and the time of the servers under test
(their process trees; a server quantload did not start is found by the loopback port it listens
on). What the machine spent beyond quantload's tree and the servers, as a share of all its CPUs,
is other work; above a threshold (`load.interference_cpu_frac`, 25 % by default, the same rule
llama-bench and the roofline probe are held to) the stage is interfered: its latencies may be the
machine's, and the SLO judge does not call it a miss. Where the servers run on cores of their own
and quantload on none of them (`--exclusive` on a machine with cores to spare, or a server pinned
by hand), the share is read on those cores alone: their busy time less the servers' own, which is
what the server lost. Linux only; elsewhere nothing is known (None) and nothing is judged.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from quantload import cpu_share
from quantload.text_format import percent

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (PROC / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    closing = text.rfind(")")
    return text[closing + 2 :].split() if closing >= 0 else None


def _processes() -> dict[int, tuple[int, float]]:
    """Every process: its parent and its CPU seconds (user + system, its reaped children's too, so a
    child that ends between two samples is not lost)."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[int, float]] = {}
    try:
        entries = list(PROC.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or len(fields) < 15:
            continue
        # after "pid (comm) ": state ppid ...; utime, stime, then the reaped children's cutime, cstime
        spent = sum(int(value) for value in fields[11:15])
        found[int(entry.name)] = (int(fields[1]), spent / tick)
    return found


def tree_cpu_s(roots: Iterable[int], processes: dict[int, tuple[int, float]] | None = None) -> float:
    """CPU seconds of the live processes under `roots` (themselves included)."""
    table = processes if processes is not None else _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    seen: set[int] = set()
    todo = [pid for pid in roots if pid in table]
    total = 0.0
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += table[pid][1]
        todo += children.get(pid, [])
    return total


def listening_pids(port: int) -> set[int]:
    """The processes holding a socket that listens on `port` (TCP, IPv4 or IPv6)."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    if not inodes:
        return set()
    owners: set[int] = set()
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            links = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if any(link.startswith("socket:[") and link[8:-1] in inodes for link in links):
            owners.add(int(entry.name))
    return owners


@dataclass(frozen=True)
class CpuSample:
    """The three CPU clocks at one moment (None where /proc cannot tell); with `server_cpus`, the
    busy time of the servers' own cores too."""

    wall_s: float
    machine_busy_s: float | None
    ours_s: float
    servers_s: float
    server_cpus: frozenset[int] | None = None
    server_cores_busy_s: float | None = None
    all_servers_s: float = 0.0  # every server's tree, quantload's own servers included


def _affinity(pid: int) -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return None


def server_cores(server_pids: Iterable[int]) -> frozenset[int] | None:
    """The cores the servers are pinned to, when they run on some of the machine's cores only and
    quantload's own process on none of those: then what other processes take from the servers
    is read on those cores alone. None: the whole machine is read."""
    pinned: set[int] = set()
    for pid in server_pids:
        cores = _affinity(pid)
        if cores is None:
            return None
        pinned |= cores
    ours = _affinity(os.getpid())
    every = frozenset(range(os.cpu_count() or 1))
    if not pinned or ours is None or pinned >= every or pinned & ours:
        return None
    return frozenset(pinned)


def sample(server_pids: Iterable[int] = (), server_cpus: frozenset[int] | None = None) -> CpuSample:
    """The machine's, quantload's and the servers' CPU time now (and the servers' cores' busy time
    when `server_cpus` is given)."""
    table = _processes()
    servers = [pid for pid in server_pids]
    ours = tree_cpu_s([os.getpid()], table)
    foreign = [pid for pid in servers if pid not in _descendants(os.getpid(), table)]
    cores = cpu_share.cores_busy_s(server_cpus) if server_cpus else None
    return CpuSample(
        time.monotonic(), cpu_share.machine_busy_s(), ours, tree_cpu_s(foreign, table),
        server_cpus, cores, tree_cpu_s(servers, table),
    )  # fmt: skip


def _descendants(root: int, table: dict[int, tuple[int, float]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    seen, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += children.get(pid, [])
    return seen


@dataclass(frozen=True)
class Interference:
    """What other processes took of the machine (or of the servers' own cores) between two
    samples."""

    other_cpu_frac: float  # of all CPUs, or of the servers' cores
    seconds: float
    scope: str = "the machine's CPUs"  # what the share is of

    def reason(self, threshold: float = cpu_share.BUSY_OTHER_CPU_FRAC) -> str | None:
        """Why the stage measured the machine (other work above `threshold` of its CPUs), or None."""
        if self.other_cpu_frac <= threshold:
            return None
        return (
            f"other processes took {percent(self.other_cpu_frac, 0)} of {self.scope} during the stage"
            f" (more than {percent(threshold, 0)}): the machine, not the server, was measured"
        )


def between(first: CpuSample, last: CpuSample) -> Interference | None:
    """The other processes' share of the machine between two samples (None: unknown): of the
    servers' own cores when both samples read them, else of all the machine's CPUs."""
    seconds = last.wall_s - first.wall_s
    cores = first.server_cpus
    if (
        cores
        and cores == last.server_cpus
        and first.server_cores_busy_s is not None
        and last.server_cores_busy_s is not None
        and seconds > 0
    ):
        spent = last.server_cores_busy_s - first.server_cores_busy_s
        servers = max(0.0, last.all_servers_s - first.all_servers_s)
        share = (spent - servers) / (seconds * len(cores))
        scope = f"the server's core{'s' if len(cores) > 1 else ''} {_cores(cores)}"
        return Interference(round(min(1.0, max(0.0, share)), 3), round(seconds, 3), scope)
    if first.machine_busy_s is None or last.machine_busy_s is None:
        return None
    capacity = seconds * (os.cpu_count() or 1)
    if capacity <= 0:
        return None
    ours = (last.ours_s - first.ours_s) + max(0.0, last.servers_s - first.servers_s)
    others = (last.machine_busy_s - first.machine_busy_s) - ours
    return Interference(round(min(1.0, max(0.0, others / capacity)), 3), round(seconds, 3))


def _cores(cpus: frozenset[int]) -> str:
    return ",".join(str(core) for core in sorted(cpus))
