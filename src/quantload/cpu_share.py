"""How much of the machine *other* work used while we measured.

A load average cannot tell: llama-bench's own threads raise it, and it decays over a minute, so
the run after a busy one looks busy too. Instead we take the machine's busy CPU time from
`/proc/stat` over the measured interval and subtract what this process and its children used
(`getrusage`); what is left, as a fraction of the interval's CPU capacity, is other work.
Linux only; elsewhere the fraction is unknown (None) and no judgement is made.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
# Other work above this fraction of all CPUs during a measurement makes its figures suspect.
BUSY_OTHER_CPU_FRAC = 0.25


def machine_busy_s() -> float | None:
    """The machine's busy CPU seconds so far (all CPUs), from /proc/stat; None where unknown."""
    try:
        first = PROC_STAT.read_text(encoding="ascii").splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not first or first[0] != "cpu" or len(first) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def cores_busy_s(cpus: frozenset[int]) -> float | None:
    """The busy CPU seconds so far of the cores `cpus` alone (their `cpuN` lines of /proc/stat);
    None where unknown or where one of them is not listed."""
    try:
        lines = PROC_STAT.read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    found: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for line in lines:
        fields = line.split()
        if len(fields) < 9 or not fields[0].startswith("cpu") or fields[0] == "cpu":
            continue
        core = int(fields[0][3:])
        if core in cpus:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
            found[core] = (user + nice + system + irq + softirq + steal) / tick
    return sum(found.values()) if set(found) == set(cpus) else None


def _own_cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass(frozen=True)
class CpuMark:
    """A point in time to measure other work from."""

    wall_s: float
    machine_busy_s: float | None
    own_cpu_s: float


def mark() -> CpuMark:
    """Remember the machine's and our own CPU time now."""
    return CpuMark(time.monotonic(), machine_busy_s(), _own_cpu_s())


def other_cpu_frac(since: CpuMark) -> float | None:
    """Fraction of all CPUs used by other processes since `since` (0..1), None where unknown.

    Children count as ours once reaped, so call this after waiting for the measured child.
    """
    now = mark()
    if since.machine_busy_s is None or now.machine_busy_s is None:
        return None
    capacity_s = (now.wall_s - since.wall_s) * (os.cpu_count() or 1)
    if capacity_s <= 0:
        return None
    others_s = (now.machine_busy_s - since.machine_busy_s) - (now.own_cpu_s - since.own_cpu_s)
    return round(min(1.0, max(0.0, others_s / capacity_s)), 3)


def busy(other_frac: float | None, threshold: float = BUSY_OTHER_CPU_FRAC) -> bool:
    """True when other work took enough of the machine to distort a measurement (more than
    `threshold` of its CPUs: load.interference_cpu_frac, the same rule as the load's stages)."""
    return other_frac is not None and other_frac > threshold
