"""Tenants sharing a server, from the records: per tenant and stage its TTFT/TPOT p50/p99, goodput
and failed share, judged against its own SLO (quantload.slo); for the noisy-neighbour experiment,
each step's figures, the fairness index, the neighbour load at which another tenant breaks its
SLO, and what a server per tenant would cost instead.

Per tenant: the stage's summary computed from that tenant's records alone (the same computation as
every stage summary: quantload.load.summary), judged against the tenant's SLO (its
`slo_ttft_p99_s`/`slo_tpot_s`, else the run's) and its own arrival (an open-loop tenant's TTFT
counts from the intended send time).

The noisy neighbour's steps pool a step's repeats. At a step where the neighbour sends, the others'
figures count only their requests sent while the neighbour was sending (from its first send to its
last), so a tail where they ran alone cannot flatter them. Fairness (Jain's index over the tenants
of a step): each tenant's share of the service the server gave (prompt tokens it processed plus
tokens it generated, for requests sent in the window every tenant was sending) against its share
of the demand (the streams it kept busy, closed-loop users or the mean requests in flight of an
open-loop tenant, times its weight); x = service share / demand share and J = (sum x)^2 /
(n sum x^2): 1 when every tenant got service in proportion to its streams, 1/n when one got all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from quantload.analysis.capacity_plan import CapacityPlan, servers_for
from quantload.analysis.stage_tables import USABLE, stage_line, summary_from_records
from quantload.config import Settings, TenantSettings
from quantload.experiments.noisy_neighbour.stages import NAME
from quantload.slo import Slo, judge
from quantload.stats import percentile


def tenant_slo(tenant: TenantSettings | None, base: Slo) -> Slo:
    """A tenant's own SLO: its latency limits where it sets them, the run's otherwise."""
    if tenant is None:
        return base
    return base.with_limits(tenant.slo_ttft_p99_s, tenant.slo_tpot_s)


def _tenants(settings: Settings | None) -> dict[str, TenantSettings]:
    return {tenant.name: tenant for tenant in settings.tenants} if settings is not None else {}


def tenant_records(records: pd.DataFrame, stages: pd.DataFrame) -> pd.DataFrame:
    """The measured records of complete stages that carry a tenant."""
    if records.empty or stages.empty or "tenant" not in records:
        return records.iloc[0:0]
    usable = stages[stages["status"].isin(USABLE)]
    return records[
        records["stage_id"].isin(usable["stage_id"]) & ~records["warmup"] & records["tenant"].notna()
    ]


def _figures(
    frame: pd.DataFrame, head: dict[str, Any], slo: Slo, own: TenantSettings | None
) -> dict[str, Any]:
    """One tenant's figures from its records, judged against `slo` (its closed-loop users, or its
    requests in flight in open loop, the prior of the design effect)."""
    open_loop = own.open_loop if own is not None else False
    line = stage_line({**head, "arrival": "poisson" if open_loop else "closed"}, "stage_end")
    summary = summary_from_records(frame, line, slo)
    in_flight = summary.delivered_concurrency if open_loop else (own.users if own is not None else None)
    verdict = judge(summary.counts, slo, in_flight)
    return {
        "requests": summary.requests,
        "ok": summary.ok,
        "failed_frac": summary.failed_frac,
        "ttft_p50_s": summary.ttft_from_intended_p50_s if open_loop else summary.ttft_p50_s,
        "ttft_p99_s": summary.ttft_from_intended_p99_s if open_loop else summary.ttft_p99_s,
        "tpot_p50_s": summary.tpot_p50_s,
        "tpot_p99_s": summary.tpot_p99_s,
        "good": summary.good,
        "goodput_rps": summary.goodput_rps,
        "good_frac": summary.good_frac,
        "outcome": verdict.outcome,
        "verdict": verdict.text(),
        "slo_ttft_s": slo.ttft_s,
        "slo_tpot_s": slo.tpot_s,
    }


def tenant_table(
    records: pd.DataFrame, stages: pd.DataFrame, settings: Settings | None, slo: Slo
) -> pd.DataFrame:
    """One row per (stage, tenant) of every complete stage shared by tenants."""
    chosen = tenant_records(records, stages)
    if chosen.empty:
        return pd.DataFrame()
    tenants = _tenants(settings)
    heads = {str(row["stage_id"]): row for row in stages.to_dict("records")}
    rows = []
    for (stage_id, tenant), group in chosen.groupby(["stage_id", "tenant"], sort=False):
        head = heads.get(str(stage_id), {})
        own = tenants.get(str(tenant))
        rows.append(
            {
                "quant": head.get("quant"),
                "experiment": head.get("experiment"),
                "stage_id": stage_id,
                "phase": head.get("phase"),
                "repeat": head.get("repeat"),
                "tenant": tenant,
                "open_loop": own.open_loop if own is not None else False,
                **_figures(group, head, tenant_slo(own, slo), own),
            }
        )
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- the noisy neighbour


def _service_tokens(frame: pd.DataFrame) -> float:
    ok = frame[frame["ok"]]
    processed = ok["prompt_n"].fillna(ok["prompt_tokens"]) if "prompt_n" in ok else ok["prompt_tokens"]
    return float(processed.fillna(0.0).sum() + ok["completion_tokens"].fillna(0.0).sum())


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index of `values` (None for fewer than two, or all zero)."""
    if len(values) < 2:
        return None
    square_sum = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * square_sum) if square_sum > 0 else None


def fairness(
    frame: pd.DataFrame, loads: dict[str, tuple[int, bool]], weights: dict[str, float]
) -> tuple[float | None, dict[str, float]]:
    """Jain's index of a step's tenants and each one's x = service share / demand share, over the
    window every tenant was sending (see the module docstring). `loads` is each tenant's users and
    whether it is open loop."""
    names = [name for name in loads if (frame["tenant"] == name).any()]
    if len(names) < 2:
        return None, {}
    sends = {name: frame.loc[frame["tenant"] == name, "sent_unix_s"] for name in names}
    start = max(float(s.min()) for s in sends.values())
    stop = min(float(s.max()) for s in sends.values())
    if stop <= start:
        return None, {}
    window = frame[(frame["sent_unix_s"] >= start) & (frame["sent_unix_s"] <= stop)]
    service, demand = {}, {}
    for name in names:
        mine = window[window["tenant"] == name]
        users, open_loop = loads[name]
        streams = float(users)
        if open_loop:  # the mean requests in flight it kept (Little's law over the window)
            streams = float(mine["e2e_s"].fillna(0.0).sum()) / (stop - start)
        service[name] = _service_tokens(mine)
        demand[name] = streams * weights.get(name, 1.0)
    total_service, total_demand = sum(service.values()), sum(demand.values())
    if total_service <= 0 or total_demand <= 0:
        return None, {}
    shares = {
        name: (service[name] / total_service) / (demand[name] / total_demand) if demand[name] > 0 else 0.0
        for name in names
    }
    return jain_index(list(shares.values())), shares


def _step_of(phase: Any) -> float | None:
    """The neighbour's load of a step, from its stage's phase ('b at 4 users', 'b at 2 req/s')."""
    if not isinstance(phase, str) or " at " not in phase:
        return None
    try:
        return float(phase.rsplit(" at ", 1)[1].split(" ")[0])
    except ValueError:
        return None


def noisy_table(
    records: pd.DataFrame, stages: pd.DataFrame, settings: Settings | None, slo: Slo,
    quant_order: Sequence[str],
) -> pd.DataFrame:  # fmt: skip
    """One row per (quant, step, tenant) of the noisy-neighbour experiment, repeats pooled: the
    tenant's figures against its SLO (the others' while the neighbour sent), and the step's
    fairness index with the tenant's service share against its demand share."""
    if settings is None or settings.neighbour_tenant is None or stages.empty:
        return pd.DataFrame()
    chosen = tenant_records(records, stages)
    noisy = stages[(stages["experiment"] == NAME) & stages["status"].isin(USABLE)]
    if chosen.empty or noisy.empty:
        return pd.DataFrame()
    neighbour = settings.neighbour_tenant.name
    tenants = _tenants(settings)
    weights = {name: tenant.weight for name, tenant in tenants.items()}
    steps = {str(row["stage_id"]): _step_of(row["phase"]) for row in noisy.to_dict("records")}
    heads = {str(row["stage_id"]): row for row in noisy.to_dict("records")}
    chosen = chosen[chosen["stage_id"].isin(list(steps))].assign(step=lambda f: f["stage_id"].map(steps))
    rows: list[dict[str, Any]] = []
    for (quant, step), group in chosen.groupby(["quant", "step"], sort=False):
        stage_ids = list(dict.fromkeys(group["stage_id"]))
        head = heads[str(stage_ids[0])]
        index, shares_by = _step_fairness(group, stage_ids, tenants, neighbour, float(step), weights)
        for name, mine in group.groupby("tenant", sort=False):
            own = tenants.get(str(name))
            counted = mine
            if name != neighbour and float(step) > 0:
                counted = _while_neighbour_sent(group, mine, neighbour)
            row = {
                "quant": quant,
                "step": float(step),
                "tenant": name,
                "neighbour": name == neighbour,
                "stages": len(stage_ids),
                "requests_all": len(mine),
                "fairness_index": index,
                "service_share_over_demand": shares_by.get(str(name)),
                **_figures(counted, head, tenant_slo(own, slo), own),
            }
            rows.append(row)
    table = pd.DataFrame(rows)
    rank = {quant: index for index, quant in enumerate(quant_order)}
    table = table.assign(_rank=table["quant"].map(lambda q: rank.get(q, len(rank))))
    return (
        table.sort_values(["_rank", "step", "neighbour"], kind="stable")
        .drop(columns="_rank")
        .reset_index(drop=True)
    )


def _while_neighbour_sent(step_frame: pd.DataFrame, mine: pd.DataFrame, neighbour: str) -> pd.DataFrame:
    """A tenant's requests of a step sent while the neighbour was sending, stage by stage."""
    kept = []
    for stage_id, stage in mine.groupby("stage_id", sort=False):
        theirs = step_frame[(step_frame["stage_id"] == stage_id) & (step_frame["tenant"] == neighbour)]
        if theirs.empty:
            kept.append(stage)
            continue
        start, stop = float(theirs["sent_unix_s"].min()), float(theirs["sent_unix_s"].max())
        kept.append(stage[(stage["sent_unix_s"] >= start) & (stage["sent_unix_s"] <= stop)])
    return pd.concat(kept) if kept else mine.iloc[0:0]


def _step_fairness(
    group: pd.DataFrame, stage_ids: list[str], tenants: dict[str, TenantSettings], neighbour: str,
    step: float, weights: dict[str, float],
) -> tuple[float | None, dict[str, float]]:  # fmt: skip
    """The step's fairness index (the median over its repeats) and each tenant's share ratio."""
    loads = {
        name: (int(step) if name == neighbour else (tenant.users or tenant.rate_users), tenant.open_loop)
        for name, tenant in tenants.items()
    }
    indexes: list[float] = []
    ratios: dict[str, float] = {}
    for stage_id in stage_ids:
        index, shares = fairness(group[group["stage_id"] == stage_id], loads, weights)
        if index is not None:
            indexes.append(index)
            ratios = ratios or shares
    return percentile(indexes, 50), ratios


@dataclass(frozen=True)
class IsolationCost:
    """A server per tenant against the shared server measured, at one neighbour load."""

    quant: str
    step: float
    shared_servers: int  # what the run measured: every tenant on one server
    shared_held: bool  # whether that one server kept every other tenant within its SLO at this step
    isolated_servers: int | None  # a server per tenant, each sized by the capacity plan
    per_tenant: dict[str, int | None]
    price_per_hour: float | None
    currency: str
    why: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NoisyVerdict:
    """At which neighbour load another tenant breaks its SLO, and what isolation would cost there
    (at the highest load measured where none broke)."""

    quant: str
    neighbour: str
    sentence: str
    breaking_step: float | None  # the lowest neighbour load at which another tenant missed its SLO
    held_step: float | None  # the highest step below it at which every other tenant met it
    isolation: IsolationCost | None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["isolation"] = self.isolation.to_dict() if self.isolation is not None else None
        return data


def _step_words(settings: Settings, step: float) -> str:
    neighbour = settings.neighbour_tenant
    if neighbour is not None and neighbour.open_loop:
        return f"{step:g} req/s"
    return f"{int(step)} user{'s' if int(step) != 1 else ''}"


def isolation_cost(
    plan: CapacityPlan, settings: Settings, quant: str, step: float, neighbour: str, shared_held: bool
) -> IsolationCost | None:
    """A server per tenant at `step` (each tenant's load against one server's limit in the
    capacity plan, with its headroom) beside the one shared server the run measured there."""
    item = next((q for q in plan.quants if q.quant == quant), None)
    if item is None:
        return None
    limit, headroom = item.limit, plan.inputs.headroom_frac
    per_tenant: dict[str, int | None] = {}
    for tenant in settings.tenants:
        load = step if tenant.name == neighbour else (tenant.rate_rps or tenant.users or 0)
        if load <= 0:
            continue
        per_server = limit.rps if tenant.open_loop else (float(limit.users) if limit.users else None)
        count = servers_for(float(load), per_server, headroom, "requests/s" if tenant.open_loop else "users")
        per_tenant[tenant.name] = count.servers if count is not None else None
    known = [count for count in per_tenant.values() if count is not None]
    isolated = sum(known) if len(known) == len(per_tenant) else None
    rps = f"{limit.rps:.2f}" if limit.rps else "–"
    why = (
        f"each tenant's load against one server's limit in the capacity plan ({limit.source}:"
        f" {limit.users or '–'} users, {rps} good req/s) with {round(headroom * 100)} % headroom"
    )
    if isolated is None:
        kinds = " and ".join(sorted({"requests/s" if t.open_loop else "users" for t in settings.tenants}))
        why = (
            f"the capacity plan has no per-server limit in {kinds} for {quant} (run the sweep or a limit"
            " search beside the tenants)"
        )
    price, currency = plan.inputs.price_per_hour, plan.inputs.currency
    return IsolationCost(quant, step, 1, shared_held, isolated, per_tenant, price, currency, why)


def noisy_verdicts(table: pd.DataFrame, settings: Settings | None, plan: CapacityPlan) -> list[NoisyVerdict]:
    """Per quantization: the neighbour load at which another tenant first missed its SLO."""
    if table.empty or settings is None or settings.neighbour_tenant is None:
        return []
    neighbour = settings.neighbour_tenant.name
    verdicts = []
    for quant, group in table.groupby("quant", sort=False):
        others = group[~group["neighbour"]]
        broken = others[others["outcome"].eq("misses")].sort_values("step")
        steps = sorted(group["step"].unique())
        breaking = float(broken["step"].iloc[0]) if not broken.empty else None
        held = None  # the highest step below which (and at which) every other tenant met its SLO
        for step in steps:
            if breaking is not None and step >= breaking:
                break
            outcomes = others[others["step"] == step]["outcome"]
            if outcomes.empty or not outcomes.eq("meets").all():
                break
            held = float(step)
        if breaking is None and held is not None and held == float(steps[-1]):
            sentence = (
                f"{quant}: every other tenant met its SLO at every load of {neighbour} measured, up to"
                f" {_step_words(settings, float(steps[-1]))}."
            )
        elif breaking is None:
            shown = f"up to {_step_words(settings, held)}" if held is not None else "at no load"
            sentence = (
                f"{quant}: no other tenant was shown to miss its SLO at any load of {neighbour} measured;"
                f" every one was shown to meet it {shown}, the rest undecided."
            )
        else:
            first = broken.iloc[0]
            at = _step_words(settings, breaking)
            alone = " (already without it)" if breaking == 0 else ""
            sentence = (
                f"{quant}: {first['tenant']} misses its SLO when {neighbour} sends at {at}{alone}: TTFT p99"
                f" {_seconds(first['ttft_p99_s'])}, goodput {_rate(first['goodput_rps'])}"
                f" ({first['verdict']})."
            )
        # where sharing broke, what isolation would have needed; where it never did, at the top step
        sized_at = breaking if breaking is not None else float(steps[-1])
        isolation = isolation_cost(plan, settings, str(quant), sized_at, neighbour, breaking is None)
        verdicts.append(NoisyVerdict(str(quant), neighbour, sentence, breaking, held, isolation))
    return verdicts


def _seconds(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{float(value) * 1000:,.0f} ms" if float(value) < 10 else f"{float(value):,.1f} s"


def _rate(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{float(value):.2f} good req/s"
