"""From what the client saw (a `StreamResult`) to a `RequestRecord`: TTFT, TPOT, ITL, goodput.

TTFT = send to the first chunk with generated text of any kind (a reasoning model's
`reasoning_content` counts); `ttft_content_s` = send to the first chunk of answer content.
TPOT = (e2e - TTFT) / (completion tokens - 1), tokens from the server's `usage`. ITL = every gap
between consecutive chunks of generated text as they arrived. e2e = send to the last byte of the
stream. A request counts for goodput (`within_deadline`) when it succeeded and its latency from the
*intended* send time is within the per-request deadline.

A reply is `truncated` when it ended with finish_reason "length" before the asked max_tokens (the
slot's context was full: llama-server stops there unless it may shift); `context_shifted` when it
came whole although prompt + reply went past the slot's context (only a server shifting its
context gets there).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from quantload.load.records import RequestRecord
from quantload.load.stream_result import StreamResult
from quantload.load.tickets import Ticket
from quantload.stats import percentile


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _timings(raw: dict[str, Any] | None) -> dict[str, float] | None:
    if raw is None:
        return None
    return {k: float(v) for k, v in raw.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def build_record(
    ticket: Ticket,
    result: StreamResult,
    lag_s: float,
    worker: str,
) -> RequestRecord:
    """The record of one finished (or failed) request."""
    stage = ticket.stage
    ttft = result.ttft_s
    e2e = result.end_s if result.ok else None
    usage = result.usage or {}
    completion = _int(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    times = result.content_times_s
    gaps = [round(b - a, 6) for a, b in pairwise(times)]
    tpot = None
    if e2e is not None and ttft is not None and completion is not None and completion >= 2:
        tpot = (e2e - ttft) / (completion - 1)
    sent_unix = result.sent_unix_s or 0.0
    prompt_tokens = _int(usage.get("prompt_tokens"))
    truncated = shifted = None
    if result.ok:
        short = completion is not None and completion < ticket.asked_max_tokens
        truncated = bool(result.finish_reason == "length" and short)
        if stage.slot_context_tokens is not None and prompt_tokens is not None and completion is not None:
            shifted = prompt_tokens + completion > stage.slot_context_tokens
    within = bool(result.ok and e2e is not None and e2e + lag_s <= stage.request_timeout_s)
    return RequestRecord(
        run_id=stage.run_id,
        server=stage.server,
        quant=stage.quant,
        model=stage.model,
        url=stage.url,
        experiment=stage.experiment,
        stage_id=stage.stage_id,
        stage_users=stage.users,
        stage_rate_rps=stage.rate_rps,
        repeat=stage.repeat,
        warmup=ticket.warmup,
        cache_prompt=stage.cache_prompt,
        prompt_id=ticket.prompt_id,
        max_tokens=ticket.asked_max_tokens,
        ignore_eos=ticket.sends_ignore_eos,
        prompt_tokens_asked=ticket.prompt_tokens_asked,
        workload=stage.workload,
        request_class=ticket.request_class,
        session_id=ticket.session_id,
        turn=ticket.turn,
        id_slot=ticket.id_slot,
        tenant=ticket.tenant,
        trimmed_turns=ticket.trimmed_turns,
        trimmed_tokens=ticket.trimmed_tokens,
        worker=worker,
        intended_unix_s=sent_unix - lag_s,
        sent_unix_s=sent_unix,
        lag_s=lag_s,
        connect_s=result.connect_s,
        connection_reused=result.connection_reused,
        arrival_clock=result.arrival_clock,
        ttfb_s=result.ttfb_s,
        ttft_s=ttft,
        ttft_content_s=result.answer_s,
        reasoning_chunks=result.reasoning_chunks,
        ttft_from_intended_s=None if ttft is None else ttft + lag_s,
        e2e_s=e2e,
        e2e_from_intended_s=None if e2e is None else e2e + lag_s,
        tpot_s=tpot,
        itl_s=gaps or None,
        itl_count=len(gaps),
        itl_mean_s=sum(gaps) / len(gaps) if gaps else None,
        itl_p50_s=percentile(gaps, 50),
        itl_p99_s=percentile(gaps, 99),
        itl_max_s=max(gaps) if gaps else None,
        content_chunks=len(times),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        cached_tokens=cached,
        timings=_timings(result.timings),
        finish_reason=result.finish_reason,
        truncated=truncated,
        context_shifted=shifted,
        n_prompt_tokens=result.n_prompt_tokens,
        n_ctx=result.n_ctx,
        ok=result.ok,
        within_deadline=within,
        http_status=result.status,
        error_class=result.error_class,
        error=result.error,
    )


def aborted_record(ticket: Ticket, lag_s: float, worker: str, sent_unix_s: float) -> RequestRecord:
    """The record of a request cut short because the load process was stopping."""
    result = StreamResult(sent_unix_s=sent_unix_s, error_class="aborted", error="load stopped")
    return build_record(ticket, result, lag_s, worker)


def cut_turn_records(ticket: Ticket, worker: str, unix_s: float, why: str) -> list[RequestRecord]:
    """Records of the turns after `ticket` that were never sent because `ticket`'s turn failed."""
    records = []
    current = ticket
    while current.later_turns:
        current = current.next_turn("")
        result = StreamResult(sent_unix_s=unix_s, error_class="session_cut", error=why)
        records.append(build_record(current, result, 0.0, worker))
    return records
