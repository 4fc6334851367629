"""What a report could not show, and why: plain "not measured" notes instead of errors."""

from __future__ import annotations

from dataclasses import dataclass

PROMETHEUS_HOW = (
    "install Prometheus (Debian/Ubuntu: apt-get install prometheus; macOS: brew install prometheus) "
    "so the next run records server metrics, or pass --prometheus URL of a Prometheus holding this run"
)


@dataclass(frozen=True)
class Gap:
    """One missing measurement: which section, what is missing, why, and how to get it."""

    section: str
    what: str
    why: str
    how: str = ""

    def text(self) -> str:
        """One line for the report: 'not measured: WHAT: WHY (HOW)'."""
        line = f"not measured: {self.what}: {self.why}"
        return f"{line} ({self.how})" if self.how else line

    def to_dict(self) -> dict[str, str]:
        return {"section": self.section, "what": self.what, "why": self.why, "how": self.how}
