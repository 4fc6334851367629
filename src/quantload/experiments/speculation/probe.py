"""Is a llama-server speculating? Its startup log, its `/slots` and its own draft counters say.

- The log: a draft the server cannot use (another vocabulary, a context that cannot remove
  tokens) makes it log "failed to initialize speculative decoding context" (or "speculative
  decoding not supported by this context") and serve on without speculating.
- `/slots`: every slot's `speculative` flag (the server's `can_speculate()`).
- `/metrics` (with --metrics): `llamacpp:spec_decode_num_draft_tokens_total`,
  `..._accepted_tokens_total` and `..._drafts_total`, counted from the server's start. They are
  read once per variant, just before it stops: the one other reader of a server's `/metrics`
  besides the exporter (llama-server's two throughput gauges restart their average on each read,
  so the exporter's next sample of those two covers a shorter window; counters are not touched).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from quantload.experiments.variant_file import SpeculationCheck
from quantload.exporter.server_metrics import ServerDataError, parse_server_metrics
from quantload.served import ServedTarget

PROBE_TIMEOUT_S = 10.0
NOT_SPECULATING_LINES = (
    "failed to initialize speculative decoding context",
    "speculative decoding not supported by this context",
)
COUNTERS = {
    "llamacpp_spec_decode_num_draft_tokens_total": "draft_tokens",
    "llamacpp_spec_decode_num_accepted_tokens_total": "accepted_tokens",
    "llamacpp_spec_decode_num_drafts_total": "drafts",
}


def _get(target: ServedTarget, path: str) -> httpx.Response:
    key = target.api_key.get_secret_value() if target.api_key is not None else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(timeout=PROBE_TIMEOUT_S) as client:
        return client.get(f"{target.url}{path}", headers=headers)


def startup_problem(startup_log: str) -> str | None:
    """The log line that says the server will not speculate, if it printed one."""
    for line in startup_log.splitlines():
        for needle in NOT_SPECULATING_LINES:
            if needle in line:
                return line.strip()[-300:]
    return None


def slots_speculative(slots: Any) -> bool | None:
    """Whether every slot of a `/slots` answer says `speculative: true` (None: it does not say)."""
    if not isinstance(slots, list) or not slots:
        return None
    flags = [slot.get("speculative") for slot in slots if isinstance(slot, dict)]
    if not flags or any(not isinstance(flag, bool) for flag in flags):
        return None
    return all(flags)


def read_counters(metrics_text: str) -> dict[str, float]:
    """The speculative-decoding counters of a `/metrics` text, by SpeculationCheck field."""
    found: dict[str, float] = {}
    for sample in parse_server_metrics(metrics_text):
        field = COUNTERS.get(sample.name)
        if field is not None and not sample.labels:
            found[field] = sample.value
    return found


def check_before(target: ServedTarget, startup_log: str) -> SpeculationCheck:
    """Whether a variant that was asked to speculate will: its log, then its `/slots`."""
    problem = startup_problem(startup_log)
    if problem is not None:
        return SpeculationCheck(speculating=False, why=f"not speculating: the server logged {problem!r}")
    try:
        answer = _get(target, "/slots")
        speculative = slots_speculative(answer.json()) if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        speculative = None
    if speculative is False:
        return SpeculationCheck(
            speculating=False,
            why="not speculating: /slots says its slots are not speculative",
            slots_speculative=False,
        )
    said = "/slots says every slot speculates" if speculative else "/slots does not say"
    return SpeculationCheck(speculating=True, why=said, slots_speculative=speculative)


def check_after(
    target: ServedTarget, before: SpeculationCheck, request_drafts: Sequence[float], requests: int
) -> SpeculationCheck:
    """The check once the variant's stages ran: its `/metrics` counters (and the draft tokens its
    requests' timings reported); no draft counted anywhere means it did not speculate."""
    counters: dict[str, float] = {}
    unread = ""
    try:
        answer = _get(target, "/metrics")
        if answer.status_code == 200:
            counters = read_counters(answer.text)
        else:
            unread = f"/metrics answered {answer.status_code}"
    except (httpx.HTTPError, ServerDataError) as error:
        unread = f"/metrics could not be read ({type(error).__name__})"
    drafted = counters.get("draft_tokens", 0.0) + sum(request_drafts)
    if drafted <= 0:
        where = (
            "in /metrics or in any request's timings"
            if not unread
            else f"in any request's timings ({unread})"
        )
        why = f"not speculating: no draft token was counted over {requests} requests {where}"
        return before.model_copy(update={"speculating": False, "why": why, **counters})
    return before.model_copy(update=counters)
