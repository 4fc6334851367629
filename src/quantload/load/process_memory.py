"""How much memory a process holds resident, from Linux's /proc (None where there is no /proc).

Read from `/proc/<pid>/statm` (its second field: resident pages), which the kernel fills without
walking the process's mappings, so it costs a few microseconds: cheap enough for a Locust process
to read its own four times a second. Resident memory counts the pages the process has in RAM now
(shared libraries included, swapped-out pages not), as `ps -o rss` and `top` show it.
"""

from __future__ import annotations

__all__ = ["resident_bytes"]

import functools
import os
from pathlib import Path

PROC = Path("/proc")


@functools.cache
def page_bytes() -> int:
    """The size of a memory page on this machine."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return 4096


def resident_bytes(pid: int | None = None) -> int | None:
    """The resident memory of process `pid` (this process when None), in bytes; None when it
    cannot be read (no such process, not Linux, no permission)."""
    path = PROC / (str(pid) if pid is not None else "self") / "statm"
    try:
        fields = path.read_text(encoding="ascii").split()
        return int(fields[1]) * page_bytes()
    except (OSError, IndexError, ValueError):
        return None
