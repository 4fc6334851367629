"""Errors that carry a message meant for the user.

Library code raises these; only the CLI edge turns them into a one-line message and an exit code.
"""

from __future__ import annotations

import errno


class QuantloadError(Exception):
    """A problem the user can act on: `str(error)` names it, `hint` says how to fix it."""

    def __init__(self, problem: str, hint: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.hint = hint

    def one_line(self) -> str:
        """The problem and the fix on one line."""
        return f"{self.problem} ({self.hint})" if self.hint else self.problem


# What only writing finds: a full disk or quota, a read-only or refusing file system, an I/O error.
WRITE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG}
)


class WriteError(QuantloadError):
    """A file quantload could not write: the disk is full, or the kernel refused it."""


def write_failure(error: OSError) -> WriteError | None:
    """`error` as one line naming the file and the fix, when it is a failure only writing finds
    (WRITE_ERRNOS); None for any other OSError (a bug, or one its caller handles)."""
    if error.errno not in WRITE_ERRNOS:
        return None
    where = f" {error.filename}" if error.filename else ""
    full = error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    hint = "free space there, or give another --out" if full else "give a folder you can write to (--out)"
    return WriteError(f"cannot write{where}: {error.strerror or error}", hint)


class ConfigError(QuantloadError):
    """A configuration key that is unknown, mistyped or out of range."""


class ToolchainError(QuantloadError):
    """llama.cpp binaries missing, not runnable, or failing to build."""


class ModelError(QuantloadError):
    """A model source or file that cannot be used."""


class OfflineError(QuantloadError):
    """Something needed the network and the network is not there."""


class ServerError(QuantloadError):
    """A llama-server that would not start, died, or answered wrongly."""


class MeasurementError(QuantloadError):
    """A measuring tool ran but its output cannot be trusted as a result."""
