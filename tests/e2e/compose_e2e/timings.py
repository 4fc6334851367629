"""Wall times of the compose e2e steps, printed at the end and kept as JSON beside the engine cache."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Step:
    """One timed step."""

    name: str
    seconds: float
    note: str = ""


@dataclass
class Timings:
    """Steps in the order they ran, plus sizes (bytes) worth reporting."""

    steps: list[Step] = field(default_factory=list)
    sizes_bytes: dict[str, int] = field(default_factory=dict)

    @contextlib.contextmanager
    def measure(self, name: str, note: str = "") -> Iterator[Step]:
        """Time the block; the yielded step's note may be changed inside it (e.g. 'cached')."""
        step = Step(name, 0.0, note)
        started = time.monotonic()
        try:
            yield step
        finally:
            step.seconds = time.monotonic() - started
            self.steps.append(step)

    def add(self, name: str, seconds: float, note: str = "") -> None:
        self.steps.append(Step(name, seconds, note))

    def render(self) -> str:
        width = max((len(s.name) for s in self.steps), default=10)
        lines = [f"{s.name:<{width}}  {s.seconds:8.1f} s  {s.note}".rstrip() for s in self.steps]
        for name, size in self.sizes_bytes.items():
            lines.append(f"{name:<{width}}  {size / 1e6:8.0f} MB")
        return "\n".join(lines)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"steps": [asdict(s) for s in self.steps], "sizes_bytes": self.sizes_bytes}
        path.write_text(json.dumps(data, indent=2), encoding="utf-8")
