"""Timestamped request traces: when each request arrived, how long its prompt and its answer were.

A trace is JSONL, one request per line. Accepted field names (the first found wins):

  arrival:  arrival_s (seconds), timestamp_s (seconds), timestamp (milliseconds, as in the
            public Mooncake traces), time_ms (milliseconds)
  input:    input_tokens, input_length, prompt_tokens
  output:   output_tokens, output_length, completion_tokens

Other fields (Mooncake's `hash_ids`, a session id) are kept as they are. Arrivals are made
relative to the first one and sorted. Every problem is a one-line error naming the line.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from quantload import json_input
from quantload.errors import ConfigError

ARRIVAL_FIELDS: tuple[tuple[str, float], ...] = (
    ("arrival_s", 1.0),
    ("timestamp_s", 1.0),
    ("timestamp", 0.001),
    ("time_ms", 0.001),
)
INPUT_FIELDS = ("input_tokens", "input_length", "prompt_tokens")
OUTPUT_FIELDS = ("output_tokens", "output_length", "completion_tokens")
MAX_TOKENS_PER_REQUEST = 10_000_000


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: seconds after the first arrival, and its two lengths."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    line: int
    extra: dict[str, Any] = field(default_factory=dict)


def _pick(row: dict[str, Any], names: tuple[str, ...]) -> tuple[str, Any] | None:
    for name in names:
        if name in row:
            return name, row[name]
    return None


def _tokens(path: Path, number: int, row: dict[str, Any], names: tuple[str, ...], what: str) -> int:
    found = _pick(row, names)
    where = f"{path}:{number}"
    if found is None:
        raise ConfigError(f"{where} has no {what} length", f"give one of {', '.join(names)}")
    name, value = found
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}: {name} is {value!r}, not a number of tokens")
    if value != int(value) or value < 1 or value > MAX_TOKENS_PER_REQUEST:
        raise ConfigError(
            f"{where}: {name} {value!r} is not a possible length",
            f"a whole number from 1 to {MAX_TOKENS_PER_REQUEST:,}",
        )
    return int(value)


def _arrival(path: Path, number: int, row: dict[str, Any]) -> float:
    for name, scale in ARRIVAL_FIELDS:
        if name not in row:
            continue
        value = row[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{path}:{number}: {name} is {value!r}, not a time")
        if value < 0:
            raise ConfigError(f"{path}:{number}: {name} {value} is negative")
        return float(value) * scale
    raise ConfigError(
        f"{path}:{number} has no arrival time",
        f"give one of {', '.join(name for name, _ in ARRIVAL_FIELDS)}",
    )


def _rows(path: Path, handle: IO[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in json_input.iter_lines(handle):
        try:
            row = json_input.loads(line, number)
        except json_input.JsonInputError as error:
            raise ConfigError(f"{path}:{number} is not JSON ({error})", "one JSON object per line") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{number} is not a JSON object", "one JSON object per line")
        yield number, row


def read_trace(path: Path) -> list[TraceRequest]:
    """Every request of a trace file, sorted by arrival, arrivals relative to the first."""
    known = {name for name, _ in ARRIVAL_FIELDS} | set(INPUT_FIELDS) | set(OUTPUT_FIELDS)
    requests = []
    try:
        with path.open(encoding="utf-8") as handle:
            for number, row in _rows(path, handle):
                requests.append(
                    TraceRequest(
                        arrival_s=_arrival(path, number, row),
                        input_tokens=_tokens(path, number, row, INPUT_FIELDS, "input"),
                        output_tokens=_tokens(path, number, row, OUTPUT_FIELDS, "output"),
                        line=number,
                        extra={k: v for k, v in row.items() if k not in known},
                    )
                )
    except FileNotFoundError:
        raise ConfigError(f"trace file {path} does not exist", "check the trace path") from None
    except json_input.JsonInputError as error:
        raise ConfigError(f"{path}:{error.line}: {error}", "one JSON object per line") from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"trace file {path} is not UTF-8 text ({error.reason})", "one JSON object per line"
        ) from None
    except OSError as error:
        raise ConfigError(f"cannot read trace file {path}: {error}") from None
    if not requests:
        raise ConfigError(f"trace file {path} holds no request", "one JSON object per line")
    requests.sort(key=lambda request: request.arrival_s)
    first = requests[0].arrival_s
    return [
        TraceRequest(r.arrival_s - first, r.input_tokens, r.output_tokens, r.line, r.extra)
        for r in requests
    ]


def replay_offsets(requests: list[TraceRequest], speed: float) -> list[float]:
    """Send times (s from the stage start) at `speed` x the trace's pace (2 = twice as fast)."""
    if not speed > 0:
        raise ConfigError(f"trace speed {speed} must be positive", "e.g. 1 (as recorded) or 2")
    return [request.arrival_s / speed for request in requests]
