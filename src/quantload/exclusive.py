"""`--exclusive` (load.exclusive): measure the server, not the machine.

Two things, both bounded:

- Wait for a quiet machine: before a server's load (and before llama-bench and the roofline
  probe), sample what other processes take of the CPUs over a short window, again and again,
  until it is at most `load.interference_cpu_frac` or `load.quiet_wait_s` has passed. What
  quantload itself runs (its process tree, the servers it started) is not "other".
- Separate cores where there are enough: with at least MIN_CORES_TO_PIN usable cores, the servers
  quantload starts run on the first cores and its load client (the Locust processes) on the last
  quarter, so neither takes the other's CPU. With fewer there is nothing to spare, and only the
  wait applies.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from quantload import machine_share
from quantload.text_format import percent

MIN_CORES_TO_PIN = 4
QUIET_WINDOW_S = 2.0


@dataclass(frozen=True)
class CorePlan:
    """Which cores the servers and the load client run on (None: any)."""

    server_cpus: frozenset[int] | None
    client_cpus: frozenset[int] | None
    why: str


def usable_cpus() -> frozenset[int]:
    """The cores this process may run on."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def core_plan(exclusive: bool, cpus: frozenset[int] | None = None) -> CorePlan:
    """The servers' and the client's cores (see the module docstring)."""
    usable = sorted(cpus if cpus is not None else usable_cpus())
    if not exclusive:
        return CorePlan(None, None, "not pinned (load.exclusive is off)")
    if len(usable) < MIN_CORES_TO_PIN:
        return CorePlan(
            None, None,
            f"not pinned: {len(usable)} usable cores leave none to spare (pinning takes at least"
            f" {MIN_CORES_TO_PIN}); the run waited for a quiet machine instead",
        )  # fmt: skip
    client = max(1, len(usable) // 4)
    server_cpus, client_cpus = frozenset(usable[:-client]), frozenset(usable[-client:])
    return CorePlan(
        server_cpus, client_cpus,
        f"servers pinned to cores {cores_text(server_cpus)}, the load client to {cores_text(client_cpus)}",
    )  # fmt: skip


def cores_text(cpus: Iterable[int]) -> str:
    """'0-5' or '0,2,4'."""
    ordered = sorted(cpus)
    if ordered and ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 2:
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(str(core) for core in ordered)


@dataclass(frozen=True)
class QuietWait:
    """How a wait for a quiet machine went."""

    waited_s: float
    other_cpu_frac: float | None  # the last window's
    quiet: bool

    def sentence(self, before: str, threshold: float, bound_s: float) -> str:
        """One line for the run's notes."""
        share = "an unknown share" if self.other_cpu_frac is None else percent(self.other_cpu_frac, 0)
        if self.quiet:
            return (
                f"waited {self.waited_s:.0f} s for a quiet machine before {before} (other processes"
                f" then took {share} of the CPUs, at most {percent(threshold, 0)} allowed)"
            )
        return (
            f"the machine stayed busy for {bound_s:.0f} s before {before} (other processes took"
            f" {share} of the CPUs, more than {percent(threshold, 0)}): it went ahead, and stages the other"
            " work disturbed are undecided, not misses"
        )


Say = Callable[[str], None]


def wait_for_quiet(
    threshold: float,
    bound_s: float,
    server_pids: Iterable[int] = (),
    say: Say | None = None,
    window_s: float = QUIET_WINDOW_S,
    server_cpus: frozenset[int] | None = None,
) -> QuietWait:
    """Wait until other processes take at most `threshold` of the CPUs (of `server_cpus` alone,
    when given: as a stage on those cores is judged) over one `window_s`, or until `bound_s` has
    passed; `say` hears each busy window."""
    started = time.monotonic()
    pids = list(server_pids)
    last: float | None = None
    while True:
        first = machine_share.sample(pids, server_cpus)
        time.sleep(window_s)
        found = machine_share.between(first, machine_share.sample(pids, server_cpus))
        if found is None:  # not Linux: nothing to wait for
            return QuietWait(time.monotonic() - started, None, True)
        last = found.other_cpu_frac
        waited = time.monotonic() - started
        if last <= threshold:
            return QuietWait(waited, last, True)
        if waited >= bound_s:
            return QuietWait(waited, last, False)
        if say is not None:
            say(
                f"waiting for a quiet machine: other processes take {percent(last, 0)} of the CPUs"
                f" (at most {percent(threshold, 0)}; {bound_s - waited:.0f} s left)"
            )


def pin_process(pid: int, cpus: frozenset[int]) -> frozenset[int] | None:
    """Run every thread of process `pid` (and the threads and children it starts from now on) on
    `cpus`; returns the cores it ran on before (None where affinity cannot be set)."""
    try:
        before = frozenset(os.sched_getaffinity(pid))
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(task), cpus)
            except OSError:
                continue  # a thread that ended meanwhile
    except (AttributeError, OSError):
        return None
    return before


def pin_this_process(cpus: frozenset[int]) -> frozenset[int] | None:
    """`pin_process` of this process: the load client it starts runs on `cpus` too."""
    return pin_process(os.getpid(), cpus)
