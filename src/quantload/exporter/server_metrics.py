"""llama-server's `/metrics` text, parsed and renamed for re-export.

llama-server names its metrics `llamacpp:<name>`; colons are meant for recording rules, and a few
names state the wrong unit (`prompt_tokens_seconds` is tokens per second). Known metrics get the
names in RENAMES; any other becomes `llamacpp_<name>` with its declared type. The text itself is
read by prometheus_client's own parser of the exposition format (escapes, timestamps, comments).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

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


def _labels(labels: dict[str, str]) -> dict[str, str]:
    """The server's own labels; one named like a label the exporter sets becomes exported_<name>."""
    return {f"exported_{key}" if key in OWN_LABELS else key: value for key, value in labels.items()}


def _source_name(parsed: str) -> str:
    """The name llama-server gave: the parser adds `_total` to a counter sample that lacks it
    (`n_tokens_max`, declared a counter)."""
    if parsed not in RENAMES and parsed.endswith("_total") and parsed[: -len("_total")] in RENAMES:
        return parsed[: -len("_total")]
    return parsed


def parse_server_metrics(text: str) -> list[ServerSample]:
    """Every `llamacpp:` sample in a `/metrics` body; ServerDataError when it is not that format."""
    samples: list[ServerSample] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not sample.name.startswith(SOURCE_PREFIX):
                    continue
                source = _source_name(sample.name[len(SOURCE_PREFIX) :])
                name, kind = export_name(source, family.type)
                value = float(sample.value)
                if kind == "counter" and (math.isnan(value) or value < 0):
                    continue
                doc = family.documentation or f"llama-server {source}"
                samples.append(ServerSample(name, kind, doc, value, _labels(dict(sample.labels))))
    except (ValueError, TypeError, IndexError) as error:
        raise ServerDataError(f"not Prometheus text format: {str(error)[:120]}") from None
    if not samples:
        raise ServerDataError("no llama-server (llamacpp:) metrics in the answer")
    return samples
