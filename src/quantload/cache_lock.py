"""One lock per shared cache folder, so two quantload processes on one machine never see each
other's half-made files.

Every cache more than one run reads (the prepared models and their manifest, the llama.cpp source
and build, the calibration, the compose images' contexts) is written under the folder's exclusive
lock and read under its shared one: `cache_lock(folder)` around the whole of a write (a prepare of
every file, a build), `cache_lock(folder, shared=True)` around a read that must see it whole. The
lock is `flock` on `<folder>/.quantload.lock`: the kernel lets it go when its holder ends, however
it ends, so a killed run leaves no stale lock. A process that waits says so once (`on_wait`), and
waits at most `wait_s` before a one-line error naming the holder. flock locks belong to an open
file, so a process must not take a folder's lock again while it holds it (readers inside a write
read without it). A reader of a folder it cannot make a lock file in reads without one; where
there is no flock (not POSIX), the lock is a no-op.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from quantload.errors import QuantloadError

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".quantload.lock"
POLL_S = 0.05
WAIT_S = 6 * 3600.0  # the longest a cache is written (a big model's files, a cold build), and some


class CacheBusy(QuantloadError):
    """Another process held a cache's lock for longer than the wait allows."""


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return "another process"
    return f"process {text}" if text.isdigit() else "another process"


@contextlib.contextmanager
def cache_lock(
    folder: Path,
    what: str,
    shared: bool = False,
    wait_s: float = WAIT_S,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold `folder`'s lock (exclusive to write, `shared` to read) for the `with` block; `what`
    names the cache in what is said while waiting and in the error after `wait_s`."""
    if fcntl is None:
        yield
        return
    path = folder / LOCK_NAME
    try:
        if not shared:
            folder.mkdir(parents=True, exist_ok=True)
        handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        if not shared:
            raise
        yield  # a folder this process cannot write to: nobody writes it through quantload either
        return
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        deadline = time.monotonic() + wait_s
        said = False
        while True:
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise CacheBusy(
                        f"{_holder(path)} has held {what} ({folder}) for more than {wait_s:g} s",
                        "wait for it to end, or give this run another toolchain.cache_dir",
                    ) from None
                if not said and on_wait is not None:
                    on_wait(f"waiting for {_holder(path)}, which is writing {what} ({folder})")
                    said = True
                time.sleep(POLL_S)
        if not shared:
            os.ftruncate(handle, 0)
            os.write(handle, str(os.getpid()).encode())
        yield
    finally:
        os.close(handle)  # closing the file lets the lock go
