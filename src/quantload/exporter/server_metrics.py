"""llama-server's `/metrics` text, parsed and renamed for re-export.

llama-server names its metrics `llamacpp:<name>`; colons are meant for recording rules, and a few
names state the wrong unit (`prompt_tokens_seconds` is tokens per second). Known metrics get the
names in RENAMES; any other becomes `llamacpp_<name>` with its declared type.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from quantload.errors import QuantloadError

Kind = Literal["counter", "gauge"]
SOURCE_PREFIX = "llamacpp:"
EXPORT_PREFIX = "llamacpp_"
# Labels the exporter sets itself; a server label of the same name becomes exported_<name>.
OWN_LABELS = frozenset({"server", "quant", "model"})

# source name -> (exported name, type). n_tokens_max is a maximum, so it becomes a gauge.
RENAMES: dict[str, tuple[str, Kind]] = {
    "prompt_tokens_total": ("llamacpp_prompt_tokens_total", "counter"),
    "prompt_tokens_cached_total": ("llamacpp_prompt_tokens_cached_total", "counter"),
    "prompt_seconds_total": ("llamacpp_prompt_seconds_total", "counter"),
    "tokens_predicted_total": ("llamacpp_tokens_predicted_total", "counter"),
    "tokens_predicted_seconds_total": ("llamacpp_tokens_predicted_seconds_total", "counter"),
    "n_decode_total": ("llamacpp_decode_calls_total", "counter"),
    "n_tokens_max": ("llamacpp_sequence_tokens_max", "gauge"),
    "prompt_tokens_seconds": ("llamacpp_prompt_tokens_per_second", "gauge"),
    "predicted_tokens_seconds": ("llamacpp_predicted_tokens_per_second", "gauge"),
    "requests_processing": ("llamacpp_requests_processing", "gauge"),
    "requests_deferred": ("llamacpp_requests_deferred", "gauge"),
    "n_busy_slots_per_decode": ("llamacpp_busy_slots_per_decode", "gauge"),
}

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


class ServerDataError(QuantloadError):
    """A server answered, but not with what llama-server sends."""


@dataclass(frozen=True)
class ServerSample:
    """One sample of a llama-server metric, already renamed."""

    name: str
    kind: Kind
    doc: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)


def export_name(source: str, declared: str) -> tuple[str, Kind]:
    """The exported name and type of the llama-server metric `llamacpp:<source>`."""
    if source in RENAMES:
        return RENAMES[source]
    kind: Kind = "counter" if declared == "counter" else "gauge"
    name = EXPORT_PREFIX + _INVALID.sub("_", source)
    if kind == "counter" and not name.endswith("_total"):
        name += "_total"
    return name, kind


def _labels(text: str | None) -> dict[str, str]:
    if not text or not text.strip():
        return {}
    labels: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _LABEL.match(text, position)
        if match is None:
            raise ServerDataError(f"unreadable labels {{{text[:80]}}}")
        key = match[1]
        labels[f"exported_{key}" if key in OWN_LABELS else key] = (
            match[2].replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        )
        position = match.end()
    return labels


def _value(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ServerDataError(f"{text[:40]!r} is not a number") from None


def parse_server_metrics(text: str) -> list[ServerSample]:
    """Every `llamacpp:` sample in a `/metrics` body; ServerDataError when it is not that format."""
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    samples: list[ServerSample] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                (helps if parts[1] == "HELP" else types)[parts[2]] = parts[3] if len(parts) > 3 else ""
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ServerDataError(f"line {number} is not a metric sample: {line[:80]!r}")
        full, label_text, value_text = match[1], match[2], match[3]
        if not full.startswith(SOURCE_PREFIX):
            continue
        source = full[len(SOURCE_PREFIX) :]
        name, kind = export_name(source, types.get(full, "gauge"))
        value = _value(value_text)
        if kind == "counter" and (math.isnan(value) or value < 0):
            continue
        doc = helps.get(full, "") or f"llama-server {source}"
        samples.append(ServerSample(name, kind, doc, value, _labels(label_text)))
    if not samples:
        raise ServerDataError("no llama-server (llamacpp:) metrics in the answer")
    return samples
