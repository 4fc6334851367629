"""The answer the report leads with: which quantization to serve, with which server flags and how
many servers for the target; the evidence in three lines (latency, quality, speed and size); and
what limits the choice (latency, quality, memory), or "undecided" and why.

It restates what the chapters decide, never decides anew: the choice is the quality verdict's
(quantload.analysis.quality_verdict: within the quality limit, the most users within the SLO,
decided comparisons), the capacity is the SLO verdict's (quantload.analysis.capacity), the server
count is the capacity plan's, and the machine's interference is quantload.analysis.interference's.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.capacity import CapacityVerdict
from quantload.analysis.capacity_plan import QuantPlan
from quantload.analysis.interference import BusyMachine, busy_machine
from quantload.analysis.quality_loss import nats_shown
from quantload.load.limit_search import level_text


@dataclass(frozen=True)
class Decision:
    """The report's first box: (label, text) lines and the machine's interference, if any."""

    decided: bool
    lines: tuple[tuple[str, str], ...]
    busy: BusyMachine
    quant: str | None = None

    @property
    def heading(self) -> str:
        """The answer in its fewest words."""
        return f"Serve {self.quant}" if self.decided and self.quant else "Undecided"


def _users(count: float | int) -> str:
    count = int(count)
    return f"{count} concurrent user{'s' if count != 1 else ''}"


def _flags(analysis: Analysis, quant: str) -> str:
    """The server flags the choice was measured with: the tune's winner where the run tuned."""
    tuned = analysis.tune.outcomes.get(quant) or {}
    if tuned.get("winner"):
        return f"the tuned flags {tuned['winner']}"
    settings = analysis.run.settings
    if settings is None:
        return "the run's server flags (config.json is missing)"
    server = settings.server
    flags = f"-np {server.slots} -c {server.slots * server.ctx_per_slot} -ctk {server.cache_type_k}"
    flags += f" -ctv {server.cache_type_v}" + (f" -t {server.threads}" if server.threads else "")
    return (
        f"`{flags}` ({server.slots} slots of {server.ctx_per_slot:,} tokens, {server.cache_type_k} KV"
        " cache)"
    )


def _plan_of(analysis: Analysis, quant: str) -> QuantPlan | None:
    return next((item for item in analysis.plan.quants if item.quant == quant), None)


def _servers(analysis: Analysis, quant: str) -> str:
    item = _plan_of(analysis, quant)
    count = None if item is None else (item.by_rate or item.by_users)
    if count is not None:
        unit = "requests/s" if count.kind == "requests/s" else "concurrent users"
        headroom = fmt.percent(analysis.plan.inputs.headroom_frac, 0)
        servers = fmt.counted(count.servers, "server")
        return f"{servers} for {fmt.number(count.target, 0)} {unit} ({headroom} headroom)"
    if analysis.plan.inputs.target_rps is None and analysis.plan.inputs.target_users is None:
        return "servers: set a target (`--target-rps` or plan.target_rps) for a count"
    return "servers: none can be counted without a decided capacity"


def _latency(verdict: CapacityVerdict, analysis: Analysis) -> str:
    held = verdict.held_users
    if held is None:
        return _short(verdict)
    text = f"meets the SLO up to {_users(held)}"
    miss = verdict.limit_range().missed
    if miss is not None:
        text += f"; misses from {level_text(miss, 'users')}"
    elif verdict.undecided_users:
        text += f"; undecided at {', '.join(str(u) for u in verdict.undecided_users)} users"
    else:
        text += "; the highest level tried, so its limit may lie higher"
    return text


def _quality(analysis: Analysis, quant: str) -> str:
    verdict = analysis.quality_verdict
    limit = f"at most {verdict.max_kld_mean_nats:g} allowed, report.max_kld_mean_nats"
    table = analysis.quant_table
    row = table[table["quant"] == quant].to_dict("records") if not table.empty else []
    found = row[0] if row else {}
    kld = fmt.cell_float(found.get("kld_mean_nats"))
    ppl = fmt.cell_float(found.get("perplexity"))
    said = []
    if kld is not None:
        said.append(f"mean KLD from F16 {nats_shown(kld)} nats ({limit})")
    if ppl is not None:
        error = fmt.cell_float(found.get("perplexity_error"))
        said.append(f"perplexity {fmt.number(ppl, 3)}" + (f" ± {fmt.number(error, 3)}" if error else ""))
    if not said:
        return "not measured (quality.json has no result for it)"
    return "; ".join(said)


def _qualities(analysis: Analysis) -> str:
    """Every quantization's mean KLD from F16, against the limit."""
    table = analysis.quant_table
    said = [
        f"{row['quant']} {nats_shown(fmt.cell_float(row.get('kld_mean_nats')))}"
        for row in (table.to_dict("records") if not table.empty else [])
        if fmt.cell_float(row.get("kld_mean_nats")) is not None
    ]
    if not said:
        return "mean KLD from F16 not measured"
    limit = analysis.quality_verdict.max_kld_mean_nats
    return f"mean KLD from F16: {', '.join(said)} nats ({limit:g} allowed)"


def _speed(analysis: Analysis, quant: str) -> str:
    table = analysis.quant_table
    rows = table[table["quant"] == quant].to_dict("records") if not table.empty else []
    row = rows[0] if rows else {}
    parts = []
    decode, prefill = fmt.cell_float(row.get("decode_tok_s")), fmt.cell_float(row.get("prefill_tok_s"))
    if decode is not None:
        parts.append(
            f"decode {fmt.number(decode)} tok/s and prefill {fmt.number(prefill)} tok/s (llama-bench, one"
            " stream)"
        )
    size = fmt.cell_float(row.get("file_size_bytes"))
    if size is not None:
        parts.append(f"file {fmt.mib(size)}")
    kv = next((k for k in analysis.kv if k.quant == quant), None)
    mib = None if kv is None else (kv.reported_mib if kv.reported_mib is not None else kv.predicted_mib)
    if mib is not None:
        parts.append(f"KV cache {fmt.number(mib, 0)} MiB")
    return "; ".join(parts) or "not measured"


def _limits(analysis: Analysis, chosen: CapacityVerdict) -> str:
    """What keeps the choice from serving more: memory, quality, latency, or nothing found yet."""
    said = []
    item = _plan_of(analysis, chosen.quant)
    if item is not None and item.memory is not None and item.memory.fits is False:
        need, budget = item.memory.total_bytes, item.memory.budget_bytes or 0
        said.append(f"memory: one server needs {fmt.mib(need)}, over the budget of {fmt.mib(budget)}")
    verdict = analysis.quality_verdict
    held = chosen.held_users or 0
    for other in analysis.capacity:
        if other.quant in verdict.over_limit and (other.held_users or 0) > held:
            said.append(
                f"quality: {other.quant} serves {_users(other.held_users or 0)} but loses more than"
                f" {verdict.max_kld_mean_nats:g} nats mean KLD"
            )
            break
    miss = chosen.limit_range().missed
    above = [c for c in chosen.checks if c.outcome == "undecided" and c.users > held]
    if miss is not None:
        check = next((c for c in chosen.checks if c.users == int(miss) and c.outcome == "misses"), None)
        why = f": {check.why}" if check is not None else ""
        said.append(f"latency: at {_users(miss)} the SLO is missed{why}")
    elif above:
        first = above[0]
        more = f"; about {first.more_requests:,} more requests would decide it" if first.more_requests else ""
        said.append(f"undecided from {_users(first.users)}: {first.why}{more}")
    if not said:
        said.append(
            "nothing found yet: every level tried met the SLO, so the limit lies higher (raise"
            " limit.max_users)"
        )
    return "; ".join(said)


def _short(verdict: CapacityVerdict) -> str:
    """One quantization's capacity in a few words."""
    held, miss = verdict.held_users, verdict.limit_range().missed
    if held is not None:
        return f"{verdict.quant} meets up to {held}" + (f", misses at {miss:g}" if miss is not None else "")
    first = next((c for c in verdict.checks if c.outcome != "unjudged"), None)
    if first is None:
        return f"{verdict.quant} not measured"
    if first.outcome == "misses":
        return f"{verdict.quant} misses at {_users(first.users)}"
    more = f", about {first.more_requests:,} more would likely decide it" if first.more_requests else ""
    return f"{verdict.quant} undecided at {_users(first.users)} ({first.requests:,} requests{more})"


def _undecided_why(analysis: Analysis, busy: BusyMachine) -> tuple[str, str]:
    """Why no quantization can be chosen, and what to do about it."""
    verdicts = analysis.capacity
    judged = [
        v for v in verdicts if any(c.outcome != "unjudged" for c in v.checks) or v.held_users is not None
    ]
    if not judged:
        return (
            "no load was measured, so no capacity is known",
            "see Not run in this run and the run's notes for why the load did not run",
        )
    if any(v.held_users is not None for v in verdicts):
        return analysis.quality_verdict.sentence, "raise report.max_kld_mean_nats, or measure more files"
    firsts = [next(c for c in v.checks if c.outcome != "unjudged") for v in judged if v.checks]
    if busy.stages_busy:
        return (
            f"{busy.stages_busy} of {busy.stages_judged} load stages measured a busy machine, not the"
            " server, so no level was shown to meet or miss the SLO",
            "rerun on a quiet machine, or with `quantload run --exclusive`",
        )
    if firsts and all(c.outcome == "misses" for c in firsts):
        return (
            "no quantization meets the SLO even at its lowest level on this machine",
            "relax the SLO (`--slo-ttft`, `--slo-tpot`) or serve on a faster machine",
        )
    return (
        "no level was shown to meet the SLO: the levels stopped before their requests decided them",
        "give each level longer (slo.level_max_s) or a looser percentile (`--slo-ttft-percentile p90`)",
    )


def decision(analysis: Analysis) -> Decision:
    """The report's answer (see the module docstring)."""
    busy = busy_machine(analysis.run, analysis.stages)
    chosen_quant = analysis.quality_verdict.quant
    by_load_only = False
    if chosen_quant is None and analysis.run.quality is not None and analysis.run.quality.kld is None:
        serving = [v for v in analysis.capacity if v.held_users is not None]
        if serving:  # no KLD to judge quality by: the choice is by load alone, and says so
            chosen_quant = max(serving, key=lambda v: v.held_users or 0).quant
            by_load_only = True
    chosen = next((v for v in analysis.capacity if v.quant == chosen_quant), None)
    if chosen is None or chosen.held_users is None:
        why, what = _undecided_why(analysis, busy)
        undecided: tuple[tuple[str, str], ...] = (
            ("Choice", f"undecided: {why}"),
            ("Latency", "; ".join(_short(v) for v in analysis.capacity) or "not measured"),
            ("Quality", _qualities(analysis)),
            ("What to do", what),
        )
        return Decision(False, undecided, busy)
    quant = chosen.quant
    choice = f"{quant}, served with {_flags(analysis, quant)}; {_servers(analysis, quant)}"
    if by_load_only:
        choice += " (by load alone: quality loss was not measured, run with quality.kld on)"
    lines: tuple[tuple[str, str], ...] = (
        ("Choice", choice),
        ("Latency", _latency(chosen, analysis)),
        ("Quality", _quality(analysis, quant)),
        ("Speed and size", _speed(analysis, quant)),
        ("Limited by", _limits(analysis, chosen)),
    )
    return Decision(True, lines, busy, quant)

