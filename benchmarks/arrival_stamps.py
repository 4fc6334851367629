"""When are the kernel's receive stamps missing, and does the load client notice? Measured.

Linux switches receive timestamping (SO_TIMESTAMPNS) on for the whole system lazily: the first
socket that asks only schedules the switch on a kernel work queue; until that has run no segment
is stamped, and the switch goes off again once the last socket that asked is closed. A read of
bytes that came in before the switch was on carries no stamp, and used to get the time the read
returned, silently (a late read then counts the client's own delay as the server's).

For each condition (quiet; `--busy N` CPU-bound processes started here, one per core, ended by
their pid afterwards) this prints:

1. how often the first segment sent right after a socket asked for stamps came unstamped (the
   switch was off system-wide, as when no other program holds it on), and the time from asking
   to the first stamped segment;
2. the late-read check of tests/unit/load/test_load_arrival.py (send, read 200 ms late, the stamp
   must be the arrival) run `--trials` times, as the client did before (no switch held) and as it
   does now (`StampSwitch` held on and waited for); and how many of the unstamped reads said so
   (`read_stamped`'s third value), which must be all of them.

    .venv/bin/python benchmarks/arrival_stamps.py --trials 100 --busy 1
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from quantload.load.arrival import StampSwitch, enable_kernel_stamps, read_stamped
from quantload.stats import percentile

LATE_READ_S = 0.2
GAP_S = 0.25  # between trials: long enough for the kernel to switch the stamping off again


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        sender = socket.create_connection(listener.getsockname())
        receiver, _ = listener.accept()
    return sender, receiver


def switch_on_delay() -> float | None:
    """None when the first segment after asking came stamped; else seconds until one did."""
    sender, receiver = _pair()
    view = memoryview(bytearray(4096))
    try:
        started = time.perf_counter()
        enable_kernel_stamps(receiver)
        sender.sendall(b"x")
        time.sleep(0.001)
        if read_stamped(receiver, view, True)[2]:
            return None
        while time.perf_counter() - started < 5.0:
            sender.sendall(b"y")
            time.sleep(0.0002)
            if read_stamped(receiver, view, True)[2]:
                return time.perf_counter() - started
        return float("inf")
    finally:
        sender.close()
        receiver.close()


def late_read(hold_switch: bool) -> tuple[bool, bool]:
    """(the stamp was the arrival, the read said truly whether it was the kernel's)."""
    switch = StampSwitch() if hold_switch else None
    if switch is not None:
        switch.wait_on(10.0)
    sender, receiver = _pair()
    view = memoryview(bytearray(1024))
    try:
        enable_kernel_stamps(receiver)
        sender.sendall(b"data: x\n\n")
        time.sleep(LATE_READ_S)
        reading = time.perf_counter()
        _, arrived, from_kernel = read_stamped(receiver, view, True)
        arrival = reading - arrived > LATE_READ_S / 2
        return arrival, from_kernel == arrival
    finally:
        sender.close()
        receiver.close()
        if switch is not None:
            switch.close()


@contextmanager
def busy(processes: int) -> Iterator[None]:
    """`processes` CPU-bound Python processes for the duration, ended by their pid."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def measure(trials: int) -> None:
    delays = []
    for _ in range(trials):
        delays.append(switch_on_delay())
        time.sleep(GAP_S)
    cold = [d for d in delays if d is not None]
    shown = ", ".join(f"{d * 1000:.1f}" for d in sorted(cold)[-5:])
    print(
        f"  first segment after asking came unstamped: {len(cold)} of {trials};"
        f" asking -> first stamped segment: p50 {1000 * (percentile(cold, 50) or 0):.1f} ms,"
        f" max {1000 * max(cold, default=0):.1f} ms (largest: {shown})"
    )
    for hold in (False, True):
        outcomes = []
        for _ in range(trials):
            outcomes.append(late_read(hold))
            time.sleep(GAP_S)
        missed = sum(not ok for ok, _ in outcomes)
        told = sum(honest for _, honest in outcomes)
        how = "switch held on and waited for (now)" if hold else "no switch held (before)"
        print(
            f"  late read, {how}: the stamp was a read time in {missed} of {trials};"
            f" the read said which clock truly in {told} of {trials}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--busy", type=int, default=1, help="CPU-bound processes for the busy run")
    args = parser.parse_args()
    print("quiet (only what else runs on the machine):")
    measure(args.trials)
    print(f"busy ({args.busy} CPU-bound process(es) beside it):")
    with busy(args.busy):
        measure(args.trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
