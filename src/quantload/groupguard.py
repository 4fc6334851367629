"""Run a command whose whole process tree ends with quantload: `python -m quantload.groupguard -- CMD`.

The parent-death signal (`quantload.childproc.die_with_parent`) reaches one child only. A build
(`cmake --build` -> ninja -> a compiler per job) has grandchildren that outlive a quantload killed
outright. This guard runs in a process group of its own (its parent starts it with
`start_new_session=True` and the parent-death signal); it runs the command in that group and
relays its exit code. When the guard is told to stop (SIGTERM or SIGHUP: the parent died, or asked)
it signals the whole group, SIGTERM then SIGKILL after a grace, so no compiler is left behind.
The group holds the guard, the command and everything the command starts (unless one of them
starts a session of its own, which build tools do not).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from types import FrameType

GRACE_S = 3.0


def _end_group(signum: int, frame: FrameType | None) -> None:
    """Stop every process of this group: SIGTERM, a grace, then SIGKILL; then exit."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the group's SIGTERM reaches the guard too
    group = os.getpgrp()
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        os._exit(128 + signum)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break  # no child left
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)  # the guard itself goes with it
    os._exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run the command after `--` in this process group; its exit code, or 128 + a signal."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.stderr.write("usage: python -m quantload.groupguard -- COMMAND [ARG...]\n")
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _end_group)
    try:
        process = subprocess.Popen(args)
    except OSError as error:
        sys.stderr.write(f"cannot run {args[0]}: {error}\n")
        return 127
    while True:
        try:
            code = process.wait()
        except KeyboardInterrupt:  # Ctrl-C reaches the parent's group, not this one; be safe
            continue
        return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
