"""The capacity plan's arithmetic: servers for a target load, memory per server, cost, request limits.

Every input is a measured figure of the run or a [plan] setting; nothing is estimated that the
run did not measure. Per quantization:

- servers = ceil(target / (limit x (1 - headroom))), where the limit is what one server holds
  within the SLO (users, or good requests/s at that load); utilisation = target / (servers x limit);
- memory per server = the file's weights + the KV cache at the configured slots and context (the
  exact formula of kv.json) + the output and compute buffers llama-server reported; against a
  budget, the most KV cells that fit, as slots at the configured context or context per slot at
  the configured slots (the buffers are taken as fixed: they grow a little with -c and -ub);
- cost per request and per million output tokens, at the limit and at the planned utilisation;
- per-request limits at the measured load: the longest prompt whose TTFT stays within the SLO's
  p99 (a straight line through TTFT against prompt tokens plus the p99 of what the line misses),
  and the longest context whose TPOT does, from the requests of the busiest level within the SLO;
- the context a slot needs: from the conversations the run measured (multi-turn sessions and the
  context experiment's, whose every turn ran; a dataset's where they came from one), the context
  per slot that holds the p50, p95 and p99 conversation whole, the KV memory of one such slot per
  KV-cache type (exact, quantload.kvcache) and how many such slots a memory budget holds beside
  each file's weights and buffers: the slots-against-context trade-off of `-np` and `-c`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from quantload.analysis.capacity import CapacityVerdict
from quantload.analysis.run_data import RunData
from quantload.analysis.stage_tables import USABLE
from quantload.errors import ModelError
from quantload.kvcache import KvShape, pad_cells, predict_kv
from quantload.rundir.kv_file import KvResult
from quantload.stats import percentile

GIB = 1024**3
MIN_FIT_REQUESTS = 8
CELL_ROUNDING = 256  # llama.cpp pads a slot's context to a multiple of 256


@dataclass(frozen=True)
class MeasuredLimit:
    """What one server of a quantization holds within the SLO, and where that figure comes from."""

    quant: str
    users: int | None
    rps: float | None  # good requests/s one server completes at that load
    output_tok_s: float | None  # output tokens/s at that load
    source: str  # e.g. "the limit search" or "the 1, 2, 4, 8 sweep"


@dataclass(frozen=True)
class ServerCount:
    """Servers for a target, and how busy that leaves each one."""

    kind: str  # "requests/s" or "users"
    target: float
    per_server_limit: float
    servers: int
    utilisation: float


def servers_for(
    target: float, per_server_limit: float | None, headroom_frac: float, kind: str
) -> ServerCount | None:
    """Servers needed so each runs at most `1 - headroom_frac` of its measured limit."""
    if per_server_limit is None or per_server_limit <= 0 or target <= 0:
        return None
    usable = per_server_limit * (1.0 - headroom_frac)
    servers = max(1, math.ceil(target / usable - 1e-9))
    return ServerCount(kind, target, per_server_limit, servers, target / (servers * per_server_limit))


@dataclass(frozen=True)
class ServerMemory:
    """One server's memory: weights, KV cache and buffers, and what a budget allows."""

    weights_bytes: int
    kv_bytes: int | None
    buffers_bytes: int | None  # output + compute, as llama-server reported them
    slots: int
    ctx_per_slot: int
    kv_bytes_per_cell: float | None
    budget_bytes: int | None = None

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + (self.kv_bytes or 0) + (self.buffers_bytes or 0)

    @property
    def fits(self) -> bool | None:
        return None if self.budget_bytes is None else self.total_bytes <= self.budget_bytes

    @property
    def max_cells(self) -> int | None:
        """KV cells (tokens held over all slots) that fit beside the weights and buffers."""
        if self.budget_bytes is None or not self.kv_bytes_per_cell:
            return None
        free = self.budget_bytes - self.weights_bytes - (self.buffers_bytes or 0)
        return max(0, math.floor(free / self.kv_bytes_per_cell))

    @property
    def hosts_per_model(self) -> int | None:
        """Hosts one model needs when split over them (llama-server --rpc): the weights and KV
        cache shared out by layer, each host holding its own buffers; 1 when it fits one host,
        None without a budget or when a host's buffers alone fill the budget."""
        if self.budget_bytes is None:
            return None
        room = self.budget_bytes - (self.buffers_bytes or 0)
        if room <= 0:
            return None
        return max(1, math.ceil((self.weights_bytes + (self.kv_bytes or 0)) / room))

    @property
    def max_slots_at_ctx(self) -> int | None:
        """Concurrent requests (-np) at the configured context per slot."""
        cells = self.max_cells
        return None if cells is None else cells // self.ctx_per_slot

    @property
    def max_ctx_at_slots(self) -> int | None:
        """Context per slot at the configured number of slots (a multiple of 256)."""
        cells = self.max_cells
        if cells is None:
            return None
        return (cells // self.slots) // CELL_ROUNDING * CELL_ROUNDING


@dataclass(frozen=True)
class Costs:
    """Cost per request and per million output tokens (in the price's unit)."""

    per_request_at_limit: float | None
    per_million_output_at_limit: float | None
    per_request_planned: float | None
    per_million_output_planned: float | None
    per_hour_planned: float | None


def costs(
    price_per_hour: float, limit: MeasuredLimit, plan: ServerCount | None
) -> Costs:
    """Costs at the measured limit (a server run flat out within the SLO) and at the plan."""
    rps, tok_s = limit.rps, limit.output_tok_s
    at_limit = price_per_hour / (rps * 3600) if rps else None
    per_m_at_limit = price_per_hour / (tok_s * 3600) * 1e6 if tok_s else None
    if plan is None:
        return Costs(at_limit, per_m_at_limit, None, None, None)
    hourly = plan.servers * price_per_hour
    served_rps = None
    if plan.kind == "requests/s":
        served_rps = plan.target
    elif rps and limit.users:
        served_rps = plan.servers * plan.utilisation * rps  # each server at its planned share
    per_request = hourly / (served_rps * 3600) if served_rps else None
    tokens_per_request = tok_s / rps if tok_s and rps else None
    per_m = (
        per_request / tokens_per_request * 1e6 if per_request is not None and tokens_per_request else None
    )
    return Costs(at_limit, per_m_at_limit, per_request, per_m, hourly)


@dataclass(frozen=True)
class LengthLimit:
    """The longest input (prompt, or context) that keeps a latency within its SLO, and on what
    it rests."""

    tokens: int | None
    measured_up_to: int
    requests: int
    slope_s_per_1k_tokens: float | None
    why: str


def length_limit(
    lengths: Sequence[float], latencies_s: Sequence[float], slo_s: float, cap_tokens: int
) -> LengthLimit:
    """The longest length whose latency, by a straight-line fit plus the p99 of its misses, stays
    within `slo_s` (at most `cap_tokens`); `why` says what the figure rests on."""
    pairs = [
        (x, y) for x, y in zip(lengths, latencies_s, strict=True) if math.isfinite(x) and math.isfinite(y)
    ]
    longest = int(max((x for x, _ in pairs), default=0))
    if len(pairs) < MIN_FIT_REQUESTS:
        return LengthLimit(None, longest, len(pairs), None, f"only {len(pairs)} requests to fit")
    xs = np.array([x for x, _ in pairs])
    ys = np.array([y for _, y in pairs])
    if float(np.ptp(xs)) == 0.0:
        return LengthLimit(None, longest, len(pairs), None, "every request had the same length")
    slope, intercept = np.polyfit(xs, ys, 1)
    misses = ys - (slope * xs + intercept)
    margin = percentile(list(misses), 99) or 0.0
    per_1k = float(slope) * 1000
    if slope <= 0:
        ok = float(np.max(ys)) <= slo_s
        return LengthLimit(
            cap_tokens if ok else None, longest, len(pairs), per_1k,
            "latency did not grow with length here" + ("" if ok else ", yet it missed the SLO"),
        )  # fmt: skip
    tokens = math.floor((slo_s - intercept - margin) / slope)
    if tokens < 1:
        return LengthLimit(None, longest, len(pairs), per_1k, "even the shortest requests miss the SLO")
    capped = min(tokens, cap_tokens)
    why = "fitted" if capped <= longest else f"extrapolated beyond the longest measured ({longest:,} tokens)"
    return LengthLimit(capped, longest, len(pairs), per_1k, why)


@dataclass(frozen=True)
class QuantPlan:
    """The plan for one quantization: each part None when its inputs were not measured or set."""

    quant: str
    limit: MeasuredLimit
    by_rate: ServerCount | None
    by_users: ServerCount | None
    memory: ServerMemory | None
    costs: Costs | None
    prompt_limit: LengthLimit | None
    context_limit: LengthLimit | None

    @property
    def servers(self) -> int | None:
        """Servers for every target that was set (the larger count when both were)."""
        counts = [c.servers for c in (self.by_rate, self.by_users) if c is not None]
        return max(counts) if counts else None

    def to_dict(self) -> dict[str, Any]:
        """The plan of this quantization, derived figures included (summary.json)."""
        data = asdict(self)
        data["servers"] = self.servers
        if self.memory is not None:
            memory = self.memory
            data["memory"].update(
                total_bytes=memory.total_bytes, fits=memory.fits, max_cells=memory.max_cells,
                hosts_per_model=memory.hosts_per_model,
                max_slots_at_ctx=memory.max_slots_at_ctx, max_ctx_at_slots=memory.max_ctx_at_slots,
            )  # fmt: skip
        return data


@dataclass(frozen=True)
class PlanSettingsView:
    """The [plan] inputs as the plan used them."""

    target_rps: float | None
    target_users: int | None
    headroom_frac: float
    price_per_hour: float | None
    currency: str
    memory_budget_bytes: int | None


@dataclass(frozen=True)
class RequestSample:
    """The requests of the busiest level within the SLO, for the per-request limits."""

    prompt_tokens: tuple[float, ...]
    ttft_s: tuple[float, ...]
    context_tokens: tuple[float, ...]  # prompt + half the output: the mean context while decoding
    tpot_s: tuple[float, ...]


def plan_quant(
    limit: MeasuredLimit,
    inputs: PlanSettingsView,
    memory: ServerMemory | None,
    sample: RequestSample | None,
    slo_ttft_s: float,
    slo_tpot_s: float,
) -> QuantPlan:
    """Every part of one quantization's plan that its measured figures and the inputs allow."""
    by_rate = (
        servers_for(inputs.target_rps, limit.rps, inputs.headroom_frac, "requests/s")
        if inputs.target_rps is not None
        else None
    )
    by_users = (
        servers_for(float(inputs.target_users), float(limit.users) if limit.users else None,
                    inputs.headroom_frac, "users")
        if inputs.target_users is not None
        else None
    )  # fmt: skip
    planned = by_rate or by_users
    priced = costs(inputs.price_per_hour, limit, planned) if inputs.price_per_hour is not None else None
    prompt_limit = context_limit = None
    if sample is not None and memory is not None:
        cap = memory.ctx_per_slot - 1
        prompt_limit = length_limit(sample.prompt_tokens, sample.ttft_s, slo_ttft_s, cap)
        context_limit = length_limit(sample.context_tokens, sample.tpot_s, slo_tpot_s, memory.ctx_per_slot)
    return QuantPlan(limit.quant, limit, by_rate, by_users, memory, priced, prompt_limit, context_limit)


CONVERSATION_PERCENTILES = (50, 95, 99)
CONVERSATION_EXPERIMENTS = ("sessions", "context")


@dataclass(frozen=True)
class SlotContext:
    """The context per slot that holds one percentile's conversation, its KV memory for one
    KV-cache type, and the slots of that context a budget holds beside each file."""

    percentile: int
    conversation_tokens: int
    ctx_per_slot: int  # a multiple of 256, as llama.cpp pads a slot
    cache_type: str
    kv_bytes_per_slot: int
    slots_in_budget: dict[str, int | None]  # by quantization; None without a budget or its memory


@dataclass(frozen=True)
class ContextNeed:
    """The context a slot needs, from the conversations the run measured (see the module docstring)."""

    conversations: int
    source: str
    rows: tuple[SlotContext, ...]
    why_not: str | None = None  # why there are no rows


@dataclass(frozen=True)
class CapacityPlan:
    """The plan for every quantization, what the inputs left out, and which one to deploy."""

    inputs: PlanSettingsView
    quants: tuple[QuantPlan, ...]
    missing: tuple[str, ...]  # one sentence per unset input, naming the key that adds its lines
    context: ContextNeed | None = None

    def to_dict(self) -> dict[str, Any]:
        """The whole plan (summary.json's `plan`)."""
        best = self.cheapest()
        return {
            "inputs": asdict(self.inputs),
            "quants": [item.to_dict() for item in self.quants],
            "missing": list(self.missing),
            "fewest_servers": best.quant if best is not None else None,
            "context": asdict(self.context) if self.context is not None else None,
        }

    def cheapest(self) -> QuantPlan | None:
        """The quantization needing the fewest servers that fit the budget (ties: the smaller file)."""
        candidates = [
            q for q in self.quants
            if q.servers is not None and (q.memory is None or q.memory.fits is not False)
        ]  # fmt: skip
        if not candidates:
            return None
        return min(candidates, key=lambda q: (q.servers, q.memory.total_bytes if q.memory else 0))


def plan_view(
    target_rps: float | None,
    target_users: int | None,
    headroom_frac: float,
    price_per_hour: float | None,
    currency: str,
    memory_budget_gib: float | None,
) -> PlanSettingsView:
    """The inputs in the units the arithmetic uses."""
    budget = round(memory_budget_gib * GIB) if memory_budget_gib is not None else None
    return PlanSettingsView(target_rps, target_users, headroom_frac, price_per_hour, currency, budget)


def missing_inputs(inputs: PlanSettingsView) -> tuple[str, ...]:
    """What an unset input leaves out, and the key (or report flag) that adds it."""
    missing = []
    if inputs.target_rps is None and inputs.target_users is None:
        missing.append(
            "No target load is set, so no server count: set plan.target_rps or plan.target_users"
            " (quantload report --plan --target-rps N)."
        )
    if inputs.price_per_hour is None:
        missing.append("No price is set, so no costs: set plan.price_per_hour (--price-per-hour).")
    if inputs.memory_budget_bytes is None:
        missing.append(
            "No memory budget is set, so no fit check: set plan.memory_budget_gib (--memory-budget-gib)."
        )
    return tuple(missing)


def build_plan(
    limits: Sequence[MeasuredLimit],
    memories: dict[str, ServerMemory],
    samples: dict[str, RequestSample],
    inputs: PlanSettingsView,
    slo_ttft_s: float,
    slo_tpot_s: float,
) -> CapacityPlan:
    """The whole plan from per-quantization measurements (see the module docstring)."""
    quants = tuple(
        plan_quant(
            limit, inputs, memories.get(limit.quant), samples.get(limit.quant), slo_ttft_s, slo_tpot_s
        )
        for limit in limits
    )
    return CapacityPlan(inputs, quants, missing_inputs(inputs))


def _buffers_bytes(result: KvResult) -> int | None:
    found = [b.mib for b in (result.buffers or []) if b.kind in ("output", "compute")]
    return round(sum(found) * 2**20) if found else None


def server_memory(run: RunData, quant: str, budget_bytes: int | None) -> ServerMemory | None:
    """One server's memory from the run's files: the manifest's file size and kv.json's check."""
    entry = run.manifest.files.get(quant) if run.manifest is not None else None
    result = run.kv_results.get(quant)
    if entry is None or result is None or result.error is not None or result.slots is None:
        return None
    cells = (result.n_stream or 0) * (result.cells_per_stream or 0)
    per_cell = result.predicted_bytes / cells if result.predicted_bytes and cells else None
    return ServerMemory(
        weights_bytes=entry.size_bytes,
        kv_bytes=result.predicted_bytes,
        buffers_bytes=_buffers_bytes(result),
        slots=result.slots,
        ctx_per_slot=result.ctx_per_slot or 0,
        kv_bytes_per_cell=per_cell,
        budget_bytes=budget_bytes,
    )


def request_sample(records: pd.DataFrame, quant: str, users: int) -> RequestSample | None:
    """The successful measured sweep requests of `quant` at `users`."""
    if records.empty:
        return None
    chosen = records[
        (records["quant"] == quant) & (records["experiment"] == "sweep") & records["ok"]
        & ~records["warmup"] & (records["stage_users"] == users)
    ]  # fmt: skip
    if chosen.empty:
        return None
    prompt = chosen["prompt_tokens"].astype(float)
    context = prompt + chosen["completion_tokens"].astype(float) / 2
    return RequestSample(
        tuple(prompt), tuple(chosen["ttft_s"].astype(float)),
        tuple(context), tuple(chosen["tpot_s"].astype(float)),
    )  # fmt: skip


def limits_from_capacity(verdicts: Sequence[CapacityVerdict]) -> list[MeasuredLimit]:
    """Each quantization's limit as the capacity verdict found it: the limit search's where the
    run searched (users; requests/s from the rate search, else the goodput of the users search's
    held trials at its limit), else the sweep's highest level within the SLO and its goodput."""
    limits = []
    for verdict in verdicts:
        searched_users = verdict.searched_users is not None
        searched_rate = verdict.searched_rate_rps is not None
        rps, tok_s = verdict.goodput_rps, verdict.output_tok_s
        trials_goodput = searched_users and verdict.searched_goodput_rps is not None
        if trials_goodput:
            rps, tok_s = verdict.searched_goodput_rps, verdict.searched_output_tok_s
        if verdict.searched_rate_rps is not None:
            rps = verdict.searched_rate_rps
        if searched_users and searched_rate:
            source = "the limit search, users and rate"
        elif trials_goodput:
            source = "the limit search for users, requests/s from its trials at the limit"
        elif searched_users:
            source = "the limit search for users; requests/s from the sweep"
        elif searched_rate:
            source = "the limit search for rate; users from the sweep"
        else:
            source = "the concurrency sweep"
        limits.append(MeasuredLimit(verdict.quant, verdict.held_users, rps, tok_s, source))
    return limits


def conversation_lengths(records: pd.DataFrame, stages: pd.DataFrame) -> list[int]:
    """The tokens each complete measured conversation held at its longest: its last turn's prompt
    and reply, plus whatever a trim had left out of that prompt (as the client counted it)."""
    if records.empty or stages.empty:
        return []
    usable = stages[stages["experiment"].isin(CONVERSATION_EXPERIMENTS) & stages["status"].isin(USABLE)]
    chosen = records[
        records["stage_id"].isin(usable["stage_id"]) & ~records["warmup"] & records["session_id"].notna()
    ]
    lengths = []
    for _, group in chosen.groupby("session_id", sort=False):
        if not group["ok"].all():
            continue  # cut short: what it would have needed is unknown past its refusal
        held = (
            group["prompt_tokens"].astype(float)
            + group["completion_tokens"].astype(float)
            + pd.to_numeric(group["trimmed_tokens"], errors="coerce").fillna(0.0)
        )
        if held.notna().any():
            lengths.append(int(held.max()))
    return lengths


def _shape(result: KvResult) -> KvShape | None:
    if None in (result.n_layer, result.n_head_kv, result.head_dim_k, result.head_dim_v):
        return None
    assert result.n_layer is not None and result.n_head_kv is not None
    assert result.head_dim_k is not None and result.head_dim_v is not None
    return KvShape(
        result.n_layer, tuple(result.n_head_kv), result.head_dim_k, result.head_dim_v, 0, "kv.json"
    )


def _conversation_source(run: RunData) -> str:
    settings = run.settings
    datasets = []
    if settings is not None:
        datasets = [path for path in (settings.sessions.dataset, settings.context.dataset) if path]
    made = "from " + ", ".join(datasets) if datasets else "synthetic"
    return f"the run's multi-turn conversations ({made}) that ran every turn"


def context_need(run: RunData, stages: pd.DataFrame, budget_bytes: int | None) -> ContextNeed:
    """The context a slot needs, its KV memory per cache type and the slots a budget holds."""
    lengths = conversation_lengths(run.records, stages)
    source = _conversation_source(run)
    if not lengths:
        return ContextNeed(0, source, (), "no complete multi-turn conversation was measured")
    shape = next((s for r in run.kv_results.values() if r.error is None and (s := _shape(r))), None)
    if shape is None:
        return ContextNeed(len(lengths), source, (), "kv.json has no model shape to size the KV cache by")
    memories = {
        quant: memory
        for quant in run.kv_results
        if (memory := server_memory(run, quant, budget_bytes)) is not None
    }
    types: list[str] = []
    if run.settings is not None:
        types = [run.settings.server.cache_type_k, *run.settings.quality.kld_cache_types]
    rows = []
    for pct in CONVERSATION_PERCENTILES:
        tokens = math.ceil(percentile(lengths, pct) or 0)
        ctx = pad_cells(max(tokens, 1))
        for cache_type in dict.fromkeys(types or ["f16"]):
            try:
                per_slot = predict_kv(shape, 1, ctx, cache_type, cache_type).total_bytes
            except ModelError:
                continue  # a cache type this model's rows do not divide into
            slots: dict[str, int | None] = {}
            for quant, memory in memories.items():
                free = (
                    None
                    if budget_bytes is None
                    else budget_bytes - memory.weights_bytes - (memory.buffers_bytes or 0)
                )
                slots[quant] = None if free is None else max(0, free // per_slot)
            rows.append(SlotContext(pct, tokens, ctx, cache_type, per_slot, slots))
    return ContextNeed(len(lengths), source, tuple(rows))


def plan_from_run(
    run: RunData,
    verdicts: Sequence[CapacityVerdict],
    inputs: PlanSettingsView,
    slo_ttft_s: float,
    slo_tpot_s: float,
    stages: pd.DataFrame | None = None,
) -> CapacityPlan:
    """The plan of a run: its measured limits, memory and requests against the plan's inputs."""
    limits = limits_from_capacity(verdicts)
    memories = {
        limit.quant: memory
        for limit in limits
        if (memory := server_memory(run, limit.quant, inputs.memory_budget_bytes)) is not None
    }
    samples = {  # the requests of the sweep's highest level within the SLO
        verdict.quant: sample
        for verdict in verdicts
        if verdict.max_users is not None
        and (sample := request_sample(run.records, verdict.quant, verdict.max_users)) is not None
    }
    plan = build_plan(limits, memories, samples, inputs, slo_ttft_s, slo_tpot_s)
    if stages is None:
        return plan
    return dataclasses.replace(plan, context=context_need(run, stages, inputs.memory_budget_bytes))
