"""A stage's summary, computed in one place from its measured records and written with its end.

`StageFigures` takes a stage's measured (non-warm-up) requests one at a time as they are recorded
and keeps only the numbers the summary needs; `summarize` turns them and the stage's lines into a
`StageSummary`: counts, errors by class, the SLO counts and goodput (quantload.slo), exact
percentiles with their distribution-free confidence intervals (quantload.stats), throughput and
the delivered concurrency. The load supervisor
appends one summary per stage to `summaries.jsonl` as soon as the stage's end line appears; the
report reads them (and computes the same summary from records.jsonl, with the same code, for a
stage that has none: a run from before summaries, Locust's web UI, or a report judged against
another SLO).
"""

from __future__ import annotations

__all__ = [
    "StageFigures",
    "StageSummary",
    "delivered_concurrency",
    "new_figures",
    "summarize",
    "summarize_stage",
]

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from quantload.load.level_judgement import level_block_requests
from quantload.load.records import RequestRecord, StageEvent, TenantLoad
from quantload.slo import PERCENTILES, Slo, SloCounter, SloCounts, arrival_of, is_open_loop
from quantload.stats import percentile, percentile_interval

SUMMARY_SCHEMA = "quantload.stage_summary/1"
Interval = tuple[float | None, float | None]  # a percentile's confidence interval; None: unbounded


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


def _mean(values: array[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass
class StageFigures:
    """The numbers of one stage's measured requests, added as they are recorded."""

    slo: Slo
    open_loop: bool
    block_requests: int = 2  # the design effect's blocks (quantload.load.level_judgement)
    margin_s: float = 0.0  # the client's stated timing error (TTFTs this close under the limit are near it)
    counter: SloCounter = field(init=False)
    errors: dict[str, int] = field(default_factory=dict)
    ttft_s: array[float] = field(default_factory=lambda: array("d"))
    ttft_from_intended_s: array[float] = field(default_factory=lambda: array("d"))
    tpot_s: array[float] = field(default_factory=lambda: array("d"))
    e2e_s: array[float] = field(default_factory=lambda: array("d"))
    itl_s: array[float] = field(default_factory=lambda: array("d"))
    lag_s: array[float] = field(default_factory=lambda: array("d"))
    sent_unix_s: array[float] = field(default_factory=lambda: array("d"))
    end_unix_s: array[float] = field(default_factory=lambda: array("d"))
    cache_n: array[float] = field(default_factory=lambda: array("d"))
    prompt_tokens: array[float] = field(default_factory=lambda: array("d"))
    output_tokens: int = 0
    itl_known: bool = True  # every ok request brought its gaps (records.jsonl does; a table may not)

    def __post_init__(self) -> None:
        self.counter = SloCounter(self.slo, self.open_loop, self.block_requests, self.margin_s)

    def add(
        self,
        *,
        ok: bool,
        within_deadline: bool,
        error_class: str | None,
        lag_s: float | None,
        sent_unix_s: float | None,
        ttft_s: float | None = None,
        ttft_from_intended_s: float | None = None,
        tpot_s: float | None = None,
        e2e_s: float | None = None,
        completion_tokens: int | None = None,
        prompt_tokens: int | None = None,
        cache_n: float | None = None,
        itl_s: Sequence[float] | None = None,
    ) -> None:
        """One measured request."""
        self.counter.add(ok, within_deadline, ttft_s, ttft_from_intended_s, tpot_s)
        if lag_s is not None:
            self.lag_s.append(lag_s)
        if not ok:
            key = error_class or "client_error"
            self.errors[key] = self.errors.get(key, 0) + 1
            return
        for values, value in (
            (self.ttft_s, ttft_s),
            (self.ttft_from_intended_s, ttft_from_intended_s),
            (self.tpot_s, tpot_s),
            (self.cache_n, cache_n),
            (self.prompt_tokens, prompt_tokens),
        ):
            if value is not None:
                values.append(value)
        if e2e_s is not None and sent_unix_s is not None:
            self.e2e_s.append(e2e_s)
            self.sent_unix_s.append(sent_unix_s)
            self.end_unix_s.append(sent_unix_s + e2e_s)
        self.output_tokens += completion_tokens or 0
        if itl_s is None:
            self.itl_known = False
        else:
            self.itl_s.extend(itl_s)

    def add_record(self, record: RequestRecord) -> None:
        """One measured request, as records.jsonl holds it."""
        self.add(
            ok=record.ok,
            within_deadline=record.within_deadline,
            error_class=record.error_class,
            lag_s=record.lag_s,
            sent_unix_s=record.sent_unix_s,
            ttft_s=record.ttft_s,
            ttft_from_intended_s=record.ttft_from_intended_s,
            tpot_s=record.tpot_s,
            e2e_s=record.e2e_s,
            completion_tokens=record.completion_tokens,
            prompt_tokens=record.prompt_tokens,
            cache_n=(record.timings or {}).get("cache_n"),
            itl_s=record.itl_s if record.itl_s is not None else [],
        )


class StageSummary(BaseModel):
    """One stage of one target: what was asked, what happened, every figure the report shows.

    One line of `summaries.jsonl`. Figures are exact, from the stage's measured records; the SLO
    counts (`slo_counts`) and `good` were judged against `slo_ttft_p99_s` / `slo_tpot_s`.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    schema_: str = Field(default=SUMMARY_SCHEMA, alias="schema")
    run_id: str
    server: str
    quant: str
    model: str = ""
    experiment: str
    stage_id: str
    stage_index: int
    users: int | None
    rate_rps: float | None
    arrival: str
    repeat: int
    cache_prompt: bool
    kv_cache_type: str | None = None
    status: str
    reason: str | None
    started_unix_s: float | None
    ended_unix_s: float | None
    requests_planned: int
    requests: int  # measured requests recorded (a conversation's turns each count)
    ok: int
    failed: int
    good: int  # goodput: met the SLO on their own (quantload.slo)
    errors: dict[str, int]
    slo_ttft_s: float = Field(validation_alias=AliasChoices("slo_ttft_s", "slo_ttft_p99_s"))
    slo_tpot_s: float
    slo_ttft_percentile: str = "p99"
    slo_tpot_percentile: str = "p99"
    slo_max_failed_frac: float = 0.01
    slo_counts: dict[str, int]  # quantload.slo.SloCounts
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    ttft_from_intended_p50_s: float | None
    ttft_from_intended_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    itl_p99_s: float | None
    e2e_p50_s: float | None
    e2e_mean_s: float | None
    first_sent_unix_s: float | None
    last_end_unix_s: float | None
    span_s: float | None
    output_tokens: float
    output_tok_s: float | None
    requests_per_s: float | None
    goodput_rps: float | None
    delivered_concurrency: float | None
    lag_p50_s: float | None
    lag_p99_s: float | None
    lag_max_s: float | None
    cache_n_mean: float | None
    prompt_tokens_mean: float | None
    prefix_tokens: int | None = None
    server_state: str | None = None
    workload: str | None = None
    phase: str | None = None
    server_args: str | None = None
    warning: str | None = None
    template_overhead_tokens: int | None = None
    tenants: list[TenantLoad] | None = None
    context_policy: str | None = None
    slot_context_tokens: int | None = None
    client_cpu_frac: float | None = None
    client_cpu_total_frac: float | None = None
    loop_lag_p99_s: float | None = None
    client_saturated: bool | None = None
    client_trust: str | None = None
    client_trust_why: str | None = None
    client_rss_bytes: int | None = None
    client_error_s: float | None = None  # the timing error the client is stated within
    # the judged TTFT and the TPOT at the SLO's own percentiles
    ttft_at_slo_s: float | None = None
    tpot_at_slo_s: float | None = None
    # each percentile's distribution-free confidence interval at the SLO's confidence, by its
    # figure's name ("ttft_p99_s": [low, high]); None on a side the requests cannot bound
    intervals: dict[str, Interval] = Field(default_factory=dict)
    level_outcome: str | None = None  # a decided stage: its level's verdict at its end
    level_requests: int | None = None
    # other processes' share of the machine's CPUs during the stage (quantload.machine_share), and
    # why the stage measured the machine rather than the server when it did
    other_cpu_frac: float | None = None
    machine_busy: str | None = None

    @property
    def open_loop(self) -> bool:
        return is_open_loop(self.arrival, self.rate_rps)

    @property
    def counts(self) -> SloCounts:
        """The SLO counts as the judge takes them."""
        return SloCounts.from_dict(self.slo_counts)

    @property
    def client_untrusted(self) -> str | None:
        """Why the client's timing may be worse than its stated error (None: trusted)."""
        if self.client_trust in ("degraded", "saturated"):
            return self.client_trust_why or f"the client was {self.client_trust}"
        return None

    @property
    def failed_frac(self) -> float | None:
        return self.failed / self.requests if self.requests else None

    @property
    def good_frac(self) -> float | None:
        return self.good / self.requests if self.requests else None

    @property
    def slo_key(self) -> tuple[float, float, str, str, float]:
        """What its SLO counts were counted against (quantload.slo.Slo.key)."""
        return (
            self.slo_ttft_s, self.slo_tpot_s, self.slo_ttft_percentile, self.slo_tpot_percentile,
            self.slo_max_failed_frac,
        )  # fmt: skip

    def judged_with(self, slo: Slo) -> bool:
        """Whether its SLO counts were counted against `slo` (with the design effect's blocks)."""
        return self.slo_key == slo.key() and "block_requests" in self.slo_counts

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)

    def to_json_line(self) -> str:
        return self.model_dump_json(by_alias=True)

    @classmethod
    def from_json_line(cls, line: str) -> StageSummary:
        return cls.model_validate_json(line)


def new_figures(stage: StageEvent, slo: Slo) -> StageFigures:
    """Empty figures for the stage a line names (its arrival process decides how TTFT is judged,
    its users the design effect's blocks)."""
    open_loop = is_open_loop(stage.arrival, stage.stage_rate_rps)
    blocks = level_block_requests(slo, stage.stage_users or 1, open_loop)
    return StageFigures(slo, open_loop, blocks, stage.client_error_s or 0.0)


_INTERVALS: tuple[tuple[str, str, float], ...] = (
    ("ttft_p50_s", "ttft_s", 50), ("ttft_p99_s", "ttft_s", 99),
    ("ttft_from_intended_p50_s", "ttft_from_intended_s", 50),
    ("ttft_from_intended_p99_s", "ttft_from_intended_s", 99),
    ("tpot_p50_s", "tpot_s", 50), ("tpot_p99_s", "tpot_s", 99),
    ("e2e_p50_s", "e2e_s", 50),
)  # fmt: skip


def _intervals(figures: StageFigures, itl: Sequence[float] | None) -> dict[str, Interval]:
    confidence = figures.slo.confidence
    out: dict[str, Interval] = {}
    for name, values, q in _INTERVALS:
        data = getattr(figures, values)
        if data:
            out[name] = percentile_interval(data, q, confidence)
    if itl:  # gaps of one stream are not independent: the interval is the gaps' own
        for q in (50, 95, 99):
            out[f"itl_p{q}_s"] = percentile_interval(itl, q, confidence)
    ttft = _judged_ttft(figures)
    slo = figures.slo
    if ttft:
        out["ttft_at_slo_s"] = percentile_interval(ttft, PERCENTILES[slo.ttft_percentile] * 100, confidence)
    if figures.tpot_s:
        out["tpot_at_slo_s"] = percentile_interval(
            figures.tpot_s, PERCENTILES[slo.tpot_percentile] * 100, confidence
        )
    return out


def _judged_ttft(figures: StageFigures) -> Sequence[float]:
    """The TTFTs the SLO judges: from the intended send time in open loop."""
    if figures.open_loop and figures.ttft_from_intended_s:
        return figures.ttft_from_intended_s
    return figures.ttft_s


def summarize(
    end: StageEvent,
    figures: StageFigures,
    start: StageEvent | None = None,
) -> StageSummary:
    """The summary of the stage `end` closed, from its figures (and its start line, when it has one)."""
    counts = figures.counter.counts()
    sent, ended = list(figures.sent_unix_s), list(figures.end_unix_s)
    first, last = (min(sent), max(ended)) if sent else (None, None)
    span = (last - first) if first is not None and last is not None else 0.0
    per_s = (lambda n: n / span) if span > 0 else (lambda n: None)
    users = end.stage_users if end.stage_rate_rps is None else None
    itl = figures.itl_s if figures.itl_known else None
    return StageSummary(
        run_id=end.run_id,
        server=end.server,
        quant=end.quant,
        model=end.model,
        experiment=end.experiment,
        stage_id=end.stage_id,
        stage_index=end.stage_index,
        users=end.stage_users,
        rate_rps=end.stage_rate_rps,
        arrival=arrival_of(end.arrival, end.stage_rate_rps),
        repeat=end.repeat,
        cache_prompt=end.cache_prompt,
        kv_cache_type=end.kv_cache_type,
        status=end.status,
        reason=end.reason,
        started_unix_s=start.unix_s if start is not None else None,
        ended_unix_s=end.unix_s if end.event == "stage_end" else None,
        requests_planned=end.requests_planned,
        requests=counts.requests,
        ok=counts.ok,
        failed=counts.failed,
        good=counts.good,
        errors=dict(figures.errors),
        slo_ttft_s=figures.slo.ttft_s,
        slo_tpot_s=figures.slo.tpot_s,
        slo_ttft_percentile=figures.slo.ttft_percentile,
        slo_tpot_percentile=figures.slo.tpot_percentile,
        slo_max_failed_frac=figures.slo.max_failed_frac,
        slo_counts=counts.to_dict(),
        ttft_p50_s=percentile(figures.ttft_s, 50),
        ttft_p99_s=percentile(figures.ttft_s, 99),
        ttft_from_intended_p50_s=percentile(figures.ttft_from_intended_s, 50),
        ttft_from_intended_p99_s=percentile(figures.ttft_from_intended_s, 99),
        tpot_p50_s=percentile(figures.tpot_s, 50),
        tpot_p99_s=percentile(figures.tpot_s, 99),
        itl_p50_s=percentile(itl, 50) if itl is not None else None,
        itl_p95_s=percentile(itl, 95) if itl is not None else None,
        itl_p99_s=percentile(itl, 99) if itl is not None else None,
        e2e_p50_s=percentile(figures.e2e_s, 50),
        e2e_mean_s=_mean(figures.e2e_s),
        first_sent_unix_s=first,
        last_end_unix_s=last,
        span_s=span if span > 0 else None,
        output_tokens=float(figures.output_tokens),
        output_tok_s=per_s(figures.output_tokens),
        requests_per_s=per_s(counts.ok),
        goodput_rps=per_s(counts.good),
        delivered_concurrency=delivered_concurrency(list(zip(sent, ended, strict=True)), users),
        lag_p50_s=percentile(figures.lag_s, 50),
        lag_p99_s=percentile(figures.lag_s, 99),
        lag_max_s=max(figures.lag_s) if figures.lag_s else None,
        cache_n_mean=_mean(figures.cache_n),
        prompt_tokens_mean=_mean(figures.prompt_tokens),
        prefix_tokens=end.prefix_tokens,
        server_state=end.server_state,
        workload=end.workload,
        phase=end.phase,
        server_args=end.server_args,
        warning=end.warning,
        template_overhead_tokens=end.template_overhead_tokens,
        tenants=end.tenants,
        context_policy=end.context_policy,
        slot_context_tokens=end.slot_context_tokens,
        client_cpu_frac=end.client_cpu_frac,
        client_cpu_total_frac=end.client_cpu_total_frac,
        loop_lag_p99_s=end.loop_lag_p99_s,
        client_saturated=end.client_saturated,
        client_trust=end.client_trust,
        client_trust_why=end.client_trust_why,
        client_rss_bytes=end.client_rss_bytes,
        client_error_s=end.client_error_s,
        ttft_at_slo_s=percentile(_judged_ttft(figures), PERCENTILES[figures.slo.ttft_percentile] * 100),
        tpot_at_slo_s=percentile(figures.tpot_s, PERCENTILES[figures.slo.tpot_percentile] * 100),
        intervals=_intervals(figures, itl),
        level_outcome=end.level_outcome,
        level_requests=end.level_requests,
    )


def summarize_stage(
    end: StageEvent, records: Sequence[RequestRecord], slo: Slo, start: StageEvent | None = None
) -> StageSummary:
    """The summary of the stage `end` closed, from records (those of other stages and warm-ups
    are left out)."""
    figures = new_figures(end, slo)
    for record in records:
        if record.stage_id == end.stage_id and not record.warmup:
            figures.add_record(record)
    return summarize(end, figures, start)
