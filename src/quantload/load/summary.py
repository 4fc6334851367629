"""Per-stage summaries computed exactly from the raw records (no histograms involved)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from quantload.load.records import RequestRecord, StageEvent
from quantload.stats import percentile


@dataclass(frozen=True)
class StageSummary:
    """One stage of one target: what was asked, what happened, the headline latencies."""

    run_id: str
    server: str
    quant: str
    experiment: str
    stage_id: str
    stage_index: int
    users: int | None
    rate_rps: float | None
    repeat: int
    cache_prompt: bool
    status: str
    reason: str | None
    requests_planned: int
    requests_done: int
    requests_ok: int
    goodput_requests: int
    errors: dict[str, int]
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    ttft_from_intended_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    itl_p99_s: float | None
    e2e_p50_s: float | None
    output_tokens_per_s: float | None
    delivered_concurrency: float | None
    lag_p99_s: float | None
    prefix_tokens: int | None
    client_cpu_frac: float | None
    loop_lag_p99_s: float | None
    client_saturated: bool | None
    workload: str | None = None
    phase: str | None = None
    server_args: str | None = None
    warning: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def delivered_concurrency(intervals: Sequence[tuple[float, float]], users: int | None = None) -> float | None:
    """Time-averaged requests in flight while new ones were still being sent.

    The window ends at the last send (after it, the tail drains) and starts at the first send,
    or, given the closed-loop `users`, at the users-th send (when every user has started), so the
    random offset before each user's first request does not count as missing concurrency.
    None for fewer than two requests.
    """
    if len(intervals) < 2:
        return None
    starts = sorted(s for s, _ in intervals)
    start = starts[users - 1] if users is not None and 1 <= users < len(starts) else starts[0]
    stop = starts[-1]
    if stop <= start:
        return None
    busy = sum(max(0.0, min(end, stop) - max(begin, start)) for begin, end in intervals)
    return busy / (stop - start)


def summarize_stage(end: StageEvent, records: Iterable[RequestRecord]) -> StageSummary:
    """The summary of the stage that `end` closed, from its (non-warm-up) records."""
    measured = [r for r in records if r.stage_id == end.stage_id and not r.warmup]
    ok = [r for r in measured if r.ok]
    errors: dict[str, int] = {}
    for record in measured:
        if not record.ok:
            key = record.error_class or "client_error"
            errors[key] = errors.get(key, 0) + 1
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    gaps = [gap for r in ok for gap in (r.itl_s or ())]
    intervals = [(r.sent_unix_s, r.sent_unix_s + r.e2e_s) for r in ok if r.e2e_s is not None]
    tokens = sum(r.completion_tokens or 0 for r in ok)
    span = (max(e for _, e in intervals) - min(s for s, _ in intervals)) if intervals else 0.0
    return StageSummary(
        run_id=end.run_id,
        server=end.server,
        quant=end.quant,
        experiment=end.experiment,
        stage_id=end.stage_id,
        stage_index=end.stage_index,
        users=end.stage_users,
        rate_rps=end.stage_rate_rps,
        repeat=end.repeat,
        cache_prompt=end.cache_prompt,
        status=end.status,
        reason=end.reason,
        requests_planned=end.requests_planned,
        requests_done=len(measured),
        requests_ok=len(ok),
        goodput_requests=sum(1 for r in ok if r.within_deadline),
        errors=errors,
        ttft_p50_s=percentile(ttft, 50),
        ttft_p99_s=percentile(ttft, 99),
        ttft_from_intended_p99_s=percentile(
            [r.ttft_from_intended_s for r in ok if r.ttft_from_intended_s is not None], 99
        ),
        tpot_p50_s=percentile([r.tpot_s for r in ok if r.tpot_s is not None], 50),
        tpot_p99_s=percentile([r.tpot_s for r in ok if r.tpot_s is not None], 99),
        itl_p50_s=percentile(gaps, 50),
        itl_p95_s=percentile(gaps, 95),
        itl_p99_s=percentile(gaps, 99),
        e2e_p50_s=percentile([r.e2e_s for r in ok if r.e2e_s is not None], 50),
        output_tokens_per_s=tokens / span if span > 0 else None,
        delivered_concurrency=delivered_concurrency(
            intervals, end.stage_users if end.stage_rate_rps is None else None
        ),
        lag_p99_s=percentile([r.lag_s for r in measured], 99),
        prefix_tokens=end.prefix_tokens,
        client_cpu_frac=end.client_cpu_frac,
        loop_lag_p99_s=end.loop_lag_p99_s,
        client_saturated=end.client_saturated,
        workload=end.workload,
        phase=end.phase,
        server_args=end.server_args,
        warning=end.warning,
    )
