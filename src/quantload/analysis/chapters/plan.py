"""The capacity plan: servers for the target load, memory per server, cost, per-request limits;
the context a slot needs; then the signal that tells when to add a server."""

from __future__ import annotations

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.capacity_plan import CapacityPlan, LengthLimit, QuantPlan, ServerCount, ServerMemory
from quantload.analysis.chapters.parts import Chapter, Plots, not_run_section
from quantload.analysis.document import Block, Bullets, Paragraph, Section, Table

DASH = fmt.DASH


def _money(amount: float | None, currency: str) -> str:
    if amount is None:
        return DASH
    digits = 2 if amount >= 1 else 4 if amount >= 0.001 else 7
    text = f"{amount:,.{digits}f}".rstrip("0").rstrip(".") if digits > 2 else f"{amount:,.2f}"
    return f"{text} {currency}".strip()


def _count(count: ServerCount | None) -> str:
    if count is None:
        return DASH
    return f"{count.servers} at {fmt.percent(count.utilisation, 0)}"


def _length(limit: LengthLimit | None) -> str:
    if limit is None or limit.tokens is None:
        return DASH
    return f"{limit.tokens:,}" + ("*" if "extrapolated" in limit.why else "")


def _inputs_line(plan: CapacityPlan) -> str:
    inputs = plan.inputs
    parts = []
    if inputs.target_rps is not None:
        parts.append(f"{fmt.number(inputs.target_rps, 2)} requests/s")
    if inputs.target_users is not None:
        parts.append(f"{inputs.target_users} concurrent users")
    target = " and ".join(parts) if parts else "none set"
    price = DASH
    if inputs.price_per_hour is not None:
        price = _money(inputs.price_per_hour, inputs.currency) + " per server-hour"
    budget = fmt.mib(inputs.memory_budget_bytes) if inputs.memory_budget_bytes else DASH
    return (
        f"Target: {target}. Headroom: {fmt.percent(inputs.headroom_frac, 0)} (each server runs at most"
        f" {fmt.percent(1 - inputs.headroom_frac, 0)} of its measured limit). Price: {price}."
        f" Memory budget per server: {budget}."
    )


def _quant_sentence(plan: CapacityPlan, item: QuantPlan) -> str:
    limit = item.limit
    if limit.users is None:
        return f"{item.quant}: no load level was shown to meet the SLO, so no server can be sized for it."
    rate = f", {fmt.number(limit.rps, 2)} good requests/s" if limit.rps else ""
    text = (
        f"{item.quant}: one server holds {fmt.counted(limit.users, 'concurrent user')}{rate} within the SLO"
        f" ({limit.source})"
    )
    for count in (item.by_rate, item.by_users):
        if count is not None:
            target = fmt.number(count.target, 2) if count.kind == "requests/s" else f"{int(count.target)}"
            text += (
                f"; {target} {count.kind} need {fmt.counted(count.servers, 'server')}, each at"
                f" {fmt.percent(count.utilisation, 0)} of its limit"
            )
    memory = item.memory
    if memory is not None:
        text += (
            f"; {fmt.mib(memory.total_bytes)} per server ({fmt.mib(memory.weights_bytes)} weights,"
            f" {fmt.mib(memory.kv_bytes)} KV cache for {memory.slots} × {memory.ctx_per_slot:,} tokens,"
            f" {fmt.mib(memory.buffers_bytes)} buffers)"
        )
        if memory.fits is False:
            text += (
                f", over the budget: at most {fmt.counted(memory.max_slots_at_ctx or 0, 'slot')} of"
                f" {memory.ctx_per_slot:,}"
                f" tokens fit (or {memory.slots} slots of {memory.max_ctx_at_slots:,} tokens)"
            )
            hosts = memory.hosts_per_model
            if hosts is not None and hosts > 1:
                text += (
                    f", or split the model over {hosts} hosts (server.rpc: `quantload rpc-server` on"
                    f" each; every server then takes {hosts} hosts, and the link costs time per token)"
                )
        elif memory.fits:
            text += (
                f", within the budget, which would hold up to {memory.max_slots_at_ctx} slots of"
                f" {memory.ctx_per_slot:,} tokens"
            )
    costs = item.costs
    if costs is not None and costs.per_request_planned is not None:
        text += (
            f"; {_money(costs.per_request_planned, plan.inputs.currency)} per request and"
            f" {_money(costs.per_million_output_planned, plan.inputs.currency)} per million output"
            f" tokens at the plan ({_money(costs.per_hour_planned, plan.inputs.currency)} an hour)"
        )
    elif costs is not None and costs.per_request_at_limit is not None:
        text += f"; {_money(costs.per_request_at_limit, plan.inputs.currency)} per request at its limit"
    prompt, context = item.prompt_limit, item.context_limit
    if prompt is not None and prompt.tokens is not None:
        text += f"; prompts up to {prompt.tokens:,} tokens keep TTFT p99 within the SLO ({prompt.why})"
    elif prompt is not None:
        text += f"; no prompt-length limit could be fitted ({prompt.why})"
    if context is not None and context.tokens is not None:
        text += f", contexts up to {context.tokens:,} tokens keep TPOT within it ({context.why})"
    return text + "."


def _recommendation(plan: CapacityPlan) -> str | None:
    best = plan.cheapest()
    if best is None:
        return None
    return (
        f"Fewest servers: {best.quant}, {fmt.counted(best.servers or 0, 'server')}"
        + (
            f" ({_money(best.costs.per_hour_planned, plan.inputs.currency)} an hour)"
            if best.costs is not None and best.costs.per_hour_planned
            else ""
        )
        + "."
    )


def _fits(memory: ServerMemory | None) -> str:
    """yes, no, or no with the hosts a split model needs."""
    if memory is None or memory.fits is None:
        return DASH
    if memory.fits:
        return "yes"
    hosts = memory.hosts_per_model
    return f"no ({hosts} hosts per model)" if hosts and hosts > 1 else "no"


def plan_section(analysis: Analysis) -> Section:
    """The plan table, one sentence per quantization, and what unset inputs left out."""
    plan = analysis.plan
    currency = plan.inputs.currency
    rows = []
    for item in plan.quants:
        limit, memory, costs = item.limit, item.memory, item.costs
        rows.append(
            (
                item.quant,
                DASH if limit.users is None else str(limit.users),
                fmt.number(limit.rps, 2),
                _count(item.by_rate or item.by_users),
                fmt.mib(memory.total_bytes) if memory else DASH,
                _fits(memory),
                _money(costs.per_request_at_limit, currency) if costs else DASH,
                _money(costs.per_request_planned, currency) if costs else DASH,
                _money(costs.per_million_output_planned, currency) if costs else DASH,
                _length(item.prompt_limit),
                _length(item.context_limit),
            )
        )
    columns = (
        "quant", "users / server", "good req/s / server", "servers (utilisation)", "memory / server",
        "fits budget", "cost / request at limit", "cost / request planned", "cost / M output tokens planned",
        "longest prompt (TTFT)", "longest context (TPOT)",
    )  # fmt: skip
    caption = (
        "Limits per server are the highest load level shown to meet the SLO in the run (never an"
        " undecided one); servers ="
        " ceil(target / (limit × (1 − headroom))). Memory = weights (file) + KV cache (exact, kv.json)"
        " + output and compute buffers (llama-server's log). Per-request limits: a straight line"
        " through latency against length at the busiest level within the SLO, plus the p99 of its"
        " misses; * = beyond the longest length measured. – = not measured or not set."
    )
    blocks: list[Block] = [Paragraph(_inputs_line(plan))]
    if plan.missing:
        blocks.append(Bullets(plan.missing, "muted"))
    blocks.append(Table(columns, tuple(rows), (False, *([True] * (len(columns) - 1))), caption, "plan-table"))
    blocks.append(Bullets(tuple(_quant_sentence(plan, item) for item in plan.quants), "verdict"))
    best = _recommendation(plan)
    if best:
        blocks.append(Paragraph(best))
    return Section("plan", "Capacity plan", tuple(blocks))


def slot_context_section(analysis: Analysis) -> Section:
    """The context per slot that holds the p50/p95/p99 conversation, its KV memory per cache type,
    and how many such slots a memory budget holds beside each file."""
    need = analysis.plan.context
    title = "The context a slot needs"
    if need is None or not need.rows:
        why = need.why_not if need is not None else "no conversations were read"
        return not_run_section("slot-context", title, why or "no conversations were read")
    quants = [q for q in analysis.quants if any(q in row.slots_in_budget for row in need.rows)]
    budget = analysis.plan.inputs.memory_budget_bytes
    rows = tuple(
        (
            f"p{row.percentile}",
            f"{row.conversation_tokens:,}",
            f"{row.ctx_per_slot:,}",
            row.cache_type,
            fmt.mib(row.kv_bytes_per_slot),
            *(DASH if row.slots_in_budget.get(q) is None else f"{row.slots_in_budget[q]:,}" for q in quants),
        )
        for row in need.rows
    )
    columns = (
        "conversation", "its tokens", "context per slot", "KV cache type", "KV per slot",
        *(f"slots in budget, {q}" for q in quants),
    )  # fmt: skip
    caption = (
        f"From {need.conversations} conversations: {need.source}. A conversation's tokens are its"
        " longest turn's prompt and reply (plus what a trim left out); the context per slot is that"
        " rounded up to llama.cpp's multiple of 256, so `-np N -c N × context` holds it whole. KV per"
        " slot is exact (quantload.kvcache, K and V of the type named); slots in budget ="
        " (budget − the file's weights − its buffers) / KV per slot"
        + ("." if budget else "; set plan.memory_budget_gib for them.")
    )
    smallest = min(need.rows, key=lambda row: (row.percentile != 99, row.kv_bytes_per_slot))
    blocks: list[Block] = [
        Table(columns, rows, (False, True, True, False, *[True] * (1 + len(quants))), caption, "slot-ctx"),
        Paragraph(
            f"Holding the p99 conversation whole takes {smallest.ctx_per_slot:,} tokens a slot"
            f" ({fmt.mib(smallest.kv_bytes_per_slot)} of {smallest.cache_type} KV cache each): fewer,"
            " longer slots serve fewer users at once, shorter ones cut long conversations (see the"
            " context policies)."
        ),
    ]
    return Section("slot-context", title, tuple(blocks))


def scale_out_section(analysis: Analysis) -> Section:
    """Which server signal showed the limit coming, and the alert rules that watch for it."""
    blocks: list[Block] = [
        Paragraph(
            "Alerts shipped in prometheus/rules/quantload.alerts.yml (and drawn in the Grafana"
            " dashboard's scale-out panel): LlamaServerQueueing (any request deferred for a minute),"
            " LlamaServerSlotsSaturated (90 % of the slots busy for two minutes) and"
            " LlamaServerTTFTOverSLO (TTFT p99 over the SLO for a minute)."
        )
    ]
    if analysis.scale_out:
        blocks.append(Bullets(tuple(v.sentence() for v in analysis.scale_out), "verdict"))
    else:
        blocks.append(Paragraph("No server series from Prometheus, so no signal can be judged.", "warning"))
    blocks.append(
        Paragraph(
            "Past one machine: run the plan's server count as one compose stack per host (or the same"
            " images on an orchestrator), spread Locust workers over hosts with its distributed mode,"
            " and carry metrics with Prometheus federation or remote-write (README: 'The capacity"
            " plan, and past one machine').",
            "muted",
        )
    )
    return Section("scale-out", "When to add a server", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return plan_section(analysis), slot_context_section(analysis), scale_out_section(analysis)


CHAPTER = Chapter(_sections)
