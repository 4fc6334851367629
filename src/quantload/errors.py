"""Errors that carry a message meant for the user.

Library code raises these; only the CLI edge turns them into a one-line message and an exit code.
"""

from __future__ import annotations


class QuantloadError(Exception):
    """A problem the user can act on: `str(error)` names it, `hint` says how to fix it."""

    def __init__(self, problem: str, hint: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.hint = hint

    def one_line(self) -> str:
        """The problem and the fix on one line."""
        return f"{self.problem} ({self.hint})" if self.hint else self.problem


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
