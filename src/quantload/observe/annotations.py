"""Load stages as Grafana annotations, read from the run directory's `stages.jsonl`.

Pushed with grafana-client when Grafana answers; when no Grafana URL is configured or it does not
answer, nothing is pushed and one quiet log line says so. The overview dashboard also draws the
stages live from `quantload_stage_info`, so the push only adds durable, searchable marks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import niquests
from grafana_client.api import GrafanaApi
from grafana_client.client import GrafanaException

OVERVIEW_UID = "quantload-overview"
STAGE_TAGS = ("quantload", "stage")

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageSpan:
    """One load stage on one server, from its start to its end (unix seconds)."""

    start_s: float
    end_s: float
    server: str
    quant: str
    experiment: str
    users: int | None
    repeat: int | None
    rate_rps: float | None = None

    @property
    def text(self) -> str:
        if self.users is not None:
            users = f"{self.users} users"
        else:
            users = f"{self.rate_rps:g} req/s" if self.rate_rps is not None else "stage"
        repeat = f", repeat {self.repeat}" if self.repeat is not None else ""
        return f"{self.experiment}: {users} on {self.quant} ({self.server}){repeat}"


def _key(event: dict[str, Any]) -> tuple[Any, ...]:
    if event.get("stage_id"):
        return (event.get("server"), event["stage_id"])
    fields = ("server", "quant", "experiment", "stage_users", "stage_rate_rps", "repeat")
    return tuple(event.get(k) for k in fields)


def read_stage_spans(path: Path) -> list[StageSpan]:
    """Pair each stage_start with its stage_end; a stage still running ends at its last event."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    open_stages: dict[tuple[Any, ...], dict[str, Any]] = {}
    spans: list[StageSpan] = []
    last_s = 0.0
    for line in lines:
        try:
            event = json.loads(line)
            kind, unix_s = event["event"], float(event["unix_s"])
        except (ValueError, KeyError, TypeError):
            continue
        last_s = max(last_s, unix_s)
        if kind == "stage_start":
            open_stages[_key(event)] = event
        elif kind == "stage_end" and (start := open_stages.pop(_key(event), None)) is not None:
            spans.append(_span(start, unix_s))
    spans.extend(_span(start, last_s) for start in open_stages.values())
    return sorted(spans, key=lambda span: span.start_s)


def _span(start: dict[str, Any], end_s: float) -> StageSpan:
    users, repeat, rate = start.get("stage_users"), start.get("repeat"), start.get("stage_rate_rps")
    return StageSpan(
        start_s=float(start["unix_s"]),
        end_s=end_s,
        server=str(start.get("server", "")),
        quant=str(start.get("quant", "")),
        experiment=str(start.get("experiment", "")),
        users=users if isinstance(users, int) else None,
        repeat=repeat if isinstance(repeat, int) else None,
        rate_rps=float(rate) if isinstance(rate, int | float) else None,
    )


def push_stage_annotations(
    stages_path: Path,
    grafana_url: str | None,
    token: str | None = None,
    dashboard_uid: str = OVERVIEW_UID,
    timeout_s: float = 3.0,
    api_factory: Callable[..., Any] = GrafanaApi.from_url,
) -> int:
    """Add one region annotation per stage to the dashboard; return how many were added.

    Returns 0 without error when Grafana is not configured or not reachable.
    """
    spans = read_stage_spans(stages_path)
    if not grafana_url or not spans:
        return 0
    api = api_factory(grafana_url, credential=token, timeout=timeout_s)
    added = 0
    try:
        api.health.check()
        for span in spans:
            api.annotations.add_annotation(
                dashboard_uid=dashboard_uid,
                time_from=round(span.start_s * 1000),
                time_to=round(span.end_s * 1000),
                tags=[*STAGE_TAGS, span.quant, span.experiment],
                text=span.text,
            )
            added += 1
    except (GrafanaException, niquests.exceptions.RequestException) as error:
        _log.info(
            "Grafana at %s did not take stage annotations (%d of %d added): %s",
            grafana_url,
            added,
            len(spans),
            str(error).splitlines()[0] if str(error) else type(error).__name__,
        )
    return added
