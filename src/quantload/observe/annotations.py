"""Load stages as Grafana annotations, read from the run directory's `stages.jsonl`.

`quantload.load.supervisor.run_plan` calls `push_invocation_annotations` when a load invocation has
ended: one region annotation per stage of that invocation (its stage ids start with the
invocation's unique name, so no stage is pushed twice), to `observe.grafana_url`, authenticated
with `observe.grafana_token`, else `observe.grafana_user` and `observe.grafana_password`, else
the user:password in the URL. Pushed with grafana-client when Grafana answers; when no Grafana
URL is configured nothing happens; when Grafana does not answer or refuses, one warning line (no
traceback) says so and the load carries on. The overview dashboard also draws the stages live
from `quantload_stage_info`, so the push only adds durable, searchable marks.

The annotations are organization-wide (no dashboard uid): the overview dashboard draws them
through its "Stages (pushed)" tag query alone. Tied to the dashboard, its built-in annotation
query would draw every stage a second time.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from grafana_client.api import GrafanaApi

from quantload.config import ObserveSettings

OVERVIEW_UID = "quantload-overview"
STAGE_TAGS = ("quantload", "stage")

_log = logging.getLogger(__name__)

Credential = str | tuple[str, str]


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
    stage_id: str = ""

    @property
    def text(self) -> str:
        # An open-loop stage also names its user pool; its load is the arrival rate.
        if self.rate_rps is not None:
            users = f"{self.rate_rps:g} req/s"
        else:
            users = f"{self.users} users" if self.users is not None else "stage"
        repeat = f", repeat {self.repeat}" if self.repeat is not None else ""
        return f"{self.experiment}: {users} on {self.quant} ({self.server}){repeat}"


def _key(event: dict[str, Any]) -> tuple[Any, ...]:
    if event.get("stage_id"):
        return (event.get("server"), event["stage_id"])
    fields = ("server", "quant", "experiment", "stage_users", "stage_rate_rps", "repeat")
    return tuple(event.get(k) for k in fields)


def read_stage_spans(path: Path, stage_id_prefix: str | None = None) -> list[StageSpan]:
    """Pair each stage_start with its stage_end; a stage still running ends at its last event.

    With `stage_id_prefix`, only the stages whose stage_id starts with it (one invocation's).
    """
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
        if stage_id_prefix is not None and not str(event.get("stage_id", "")).startswith(stage_id_prefix):
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
        stage_id=str(start.get("stage_id", "")),
    )


def grafana_credential(observe: ObserveSettings) -> Credential | None:
    """The token when set, else (user, password) when both are set, else None."""
    if observe.grafana_token is not None and observe.grafana_token.get_secret_value():
        return observe.grafana_token.get_secret_value()
    if observe.grafana_user and observe.grafana_password is not None:
        return (observe.grafana_user, observe.grafana_password.get_secret_value())
    return None


def push_invocation_annotations(stages_path: Path, observe: ObserveSettings, invocation: str) -> int:
    """Push the stages of one load invocation (stage ids `<invocation>-N`) where observe says."""
    if not observe.grafana_url:
        return 0
    return push_stage_annotations(
        stages_path,
        observe.grafana_url,
        grafana_credential(observe),
        stage_id_prefix=f"{invocation}-",
    )


def _without_userinfo(url: str) -> str:
    """The URL with any user:password@ removed, for log lines."""
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=host))
    except ValueError:
        return "<unparsable URL>"


def push_stage_annotations(
    stages_path: Path,
    grafana_url: str | None,
    credential: Credential | None = None,
    dashboard_uid: str | None = None,
    timeout_s: float = 3.0,
    api_factory: Callable[..., Any] = GrafanaApi.from_url,
    stage_id_prefix: str | None = None,
) -> int:
    """Add one region annotation per stage; return how many were added.

    Organization-wide unless `dashboard_uid` is given (see the module note).

    `credential` is a token or (user, password). Returns 0 without raising when Grafana is not
    configured, not reachable or refuses; one warning line then says why.
    """
    spans = read_stage_spans(stages_path, stage_id_prefix)
    if not grafana_url or not spans:
        return 0
    added = 0
    try:
        api = api_factory(grafana_url, credential=credential, timeout=timeout_s)
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
    except Exception as error:  # best effort: no answer, a refusal or a non-Grafana reply never fails a load
        text = str(error).strip().splitlines()
        reason = f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
        _log.warning(
            "Grafana at %s did not take stage annotations (%d of %d added): %s",
            _without_userinfo(grafana_url),
            added,
            len(spans),
            reason,
        )
    return added
