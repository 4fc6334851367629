"""What a tune gives its user: the configurations ranked, the winner's exact llama-server command
line and the `.env` and compose lines that apply it, what the search cost against the full grid,
and the capacity plan recomputed on the winner.

  ranking       one row per configuration at the highest rung it reached: its limit (users or
                requests/s shown to meet the SLO), the lowest level shown to miss it, goodput at
                the limit, the memory its server reported (every buffer), its KV cache, the time its
                trials took, and whether another configuration of its rung beat it (dropped); with
                tune.predict_first each row's predicted limit and interval, and after the measured
                rows those the prediction screened out (rung -1, not run, why: their prediction
                against the best's)
  winner        the best configuration, named only where it beats the configured flags by a decided
                margin (quantload.comparison); otherwise the configured flags are as good as any
                tried, and the configurations tied with the best are named
  command       the variant's own launch (quantload.stack.server_variants.variant_spec on the
                server's spec), as `shlex.join` of the llama-server argv quantload ran
  .env/compose  `QL_SLOTS` and `QL_CTX_TOTAL` (docker-compose.yml passes them as -np and -c), and an
                override file giving the quantization's service the other flags as llama.cpp's own
                `LLAMA_ARG_*` variables (a flag on the command line wins over its variable, so only
                flags the compose command does not set are given this way)
  cost          trials and seconds the search took, against the full grid of the same space: every
                configuration measured as the final rung measures (its time cap and level budget),
                estimated from the final rung's mean trial time
  plan          quantload.analysis.capacity_plan's arithmetic on the winner's decided limit,
                goodput and memory, with the [plan] inputs
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantload.analysis.capacity_plan import (
    MeasuredLimit,
    QuantPlan,
    ServerMemory,
    plan_quant,
    plan_view,
)
from quantload.config import Settings
from quantload.kvcache import MIB
from quantload.llamacpp.server import ServerSpec
from quantload.rundir import write_json_atomic
from quantload.rundir.handle import RunDir
from quantload.stack.server_variants import variant_spec
from quantload.text_format import span
from quantload.tune.search import TuneOutcome
from quantload.tune.space import TuneConfig

DEFAULT_SERVER_PORT = 8080  # llama-server's own default port
# llama.cpp's environment variable of each flag a configuration may set (common/arg.cpp set_env).
ENV_OF_FLAG: dict[str, str] = {
    "-b": "LLAMA_ARG_BATCH",
    "-ub": "LLAMA_ARG_UBATCH",
    "-ctk": "LLAMA_ARG_CACHE_TYPE_K",
    "-ctv": "LLAMA_ARG_CACHE_TYPE_V",
    "-fa": "LLAMA_ARG_FLASH_ATTN",
    "-t": "LLAMA_ARG_THREADS",
    "--spec-type": "LLAMA_ARG_SPEC_TYPE",
    "--spec-draft-n-max": "LLAMA_ARG_SPEC_DRAFT_N_MAX",
    "-md": "LLAMA_ARG_SPEC_DRAFT_MODEL",
}
SWITCHES: dict[str, tuple[str, str]] = {  # a flag without a value: its variable and value
    "-cb": ("LLAMA_ARG_CONT_BATCHING", "1"),
    "-nocb": ("LLAMA_ARG_CONT_BATCHING", "0"),
}


def compose_service(quant: str) -> str:
    """The quantization's llama-server service in docker-compose.yml (llama-q4-k-m)."""
    return "llama-" + quant.lower().replace("_", "-")


@dataclass(frozen=True)
class RankedRow:
    """One configuration as the ranking shows it."""

    rank: int
    key: str
    rung: int
    final: bool
    limit: float | None
    lowest_miss: float | None
    dropped: bool  # another configuration of its rung beat it
    goodput_rps: float | None
    output_tok_s: float | None
    memory_mib: float | None
    kv_mib: float | None
    seconds: float
    ran: bool
    why: str
    screened: bool = False  # tune.predict_first dropped it unmeasured (why says its prediction)
    predicted_limit: float | None = None
    predicted_low: float | None = None
    predicted_high: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def predicted(self, outcome: TuneOutcome, key: str) -> RankedRow:
        """The row with the configuration's prediction (tune.predict_first), where it has one."""
        found = outcome.screening.prediction(key) if outcome.screening is not None else None
        if found is None:
            return self
        return dataclasses.replace(
            self, predicted_limit=found.limit, predicted_low=found.limit_low, predicted_high=found.limit_high
        )


def ranking(outcome: TuneOutcome) -> list[RankedRow]:
    """The configurations, best first (see the module docstring)."""
    rows = []
    seconds: dict[str, float] = {}
    for trial in outcome.trials:
        seconds[str(trial.key)] = seconds.get(str(trial.key), 0.0) + trial.seconds
    last = len(outcome.search.rungs) - 1
    dropped = {key for rung in outcome.search.rungs for key in outcome.search.dropped(rung.index)}
    for rank, score in enumerate(outcome.search.ranking(), start=1):
        line = outcome.trial(score.key, score.rung)
        rows.append(
            RankedRow(
                rank=rank,
                key=score.key,
                rung=score.rung,
                final=score.rung == last,
                limit=score.limit,
                lowest_miss=score.lowest_miss,
                dropped=score.key in dropped,
                goodput_rps=score.goodput_rps,
                output_tok_s=line.output_tok_s if line else None,
                memory_mib=line.memory_mib if line else None,
                kv_mib=line.kv_mib if line else None,
                seconds=round(seconds.get(score.key, 0.0), 1),
                ran=score.ran,
                why=score.why,
            ).predicted(outcome, score.key)
        )
    screening = outcome.screening
    for key, reason in screening.dropped if screening is not None else ():
        rows.append(
            RankedRow(
                rank=len(rows) + 1, key=key, rung=-1, final=False, limit=None, lowest_miss=None,
                dropped=False, goodput_rps=None, output_tok_s=None, memory_mib=None, kv_mib=None,
                seconds=0.0, ran=False, why=f"{SCREENED_OUT}: {reason}", screened=True,
            ).predicted(outcome, key)
        )
    return rows


SCREENED_OUT = "screened out by prediction"


def winner_command(
    spec: ServerSpec, config: TuneConfig, settings: Settings, binary: Path, port: int = 0
) -> str:
    """The winner's llama-server command line, exactly as quantload launches its variant, on the
    port the server ran on (`port`, else the spec's; 8080, llama-server's own, where neither says)."""
    flags = config.server_flags(settings, "winner")
    tuned = variant_spec(spec, flags)
    return shlex.join(tuned.command(binary, port or spec.port or DEFAULT_SERVER_PORT))


def env_lines(config: TuneConfig) -> list[str]:
    """The .env lines docker-compose.yml turns into -np and -c."""
    return [f"QL_SLOTS={config.slots}", f"QL_CTX_TOTAL={config.slots * config.ctx_per_slot}"]


def flag_environment(args: Sequence[str]) -> dict[str, str]:
    """llama.cpp's LLAMA_ARG_* variables for the flags of `args` (a later flag wins)."""
    found: dict[str, str] = {}
    index = 0
    while index < len(args):
        flag = args[index]
        if flag in SWITCHES:
            name, value = SWITCHES[flag]
            found[name] = value
        elif flag == "--spec-default":  # no variable of its own: the n-gram type it sets
            found["LLAMA_ARG_SPEC_TYPE"] = "ngram-mod"
        elif flag in ENV_OF_FLAG and index + 1 < len(args):
            found[ENV_OF_FLAG[flag]] = args[index + 1]
            index += 1
        index += 1
    return found


def compose_override(config: TuneConfig, settings: Settings, quant: str) -> str:
    """A compose override file (YAML) giving the quantization's service the winner's other flags."""
    spec = variant_spec(
        ServerSpec(model_path=Path("model.gguf"), alias="m", extra_args=()), config.server_flags(settings, "")
    )
    args = ["-ctk", spec.cache_type_k, "-ctv", spec.cache_type_v, *spec.extra_args]
    variables = flag_environment(args)
    lines = ["services:", f"  {compose_service(quant)}:", "    environment:"]
    lines += [f'      {name}: "{value}"' for name, value in variables.items()]
    if "--spec-default" in args:
        lines.append(
            "      # --spec-default's n-gram sizes (24/48/64) have no variables: add them to the command"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class SearchCost:
    """What the search took against the full grid of the same space."""

    trials: int
    seconds: float
    configs: int
    grid_trials: int
    grid_seconds: float | None  # estimated: every configuration at the final rung's mean trial time
    ending: str

    @property
    def share(self) -> float | None:
        return self.seconds / self.grid_seconds if self.grid_seconds else None

    def sentence(self) -> str:
        said = f"{self.trials} trials in {span(self.seconds)} for {self.configs} configurations"
        if self.grid_seconds:
            said += (
                f"; the full grid (each configuration searched as the finalists were) would take about"
                f" {span(self.grid_seconds)}: this search cost {self.share:.0%} of it"
            )
        if self.ending == "budget":
            said += "; the budget ended the search before its last rung finished"
        return said


def search_cost(outcome: TuneOutcome) -> SearchCost:
    search = outcome.search
    final = search.rungs[-1].index
    finals = [s.seconds for s in search.scores if s.rung == final and s.ran]
    per_config = statistics.mean(finals) if finals else None
    count = len(outcome.configs)
    return SearchCost(
        trials=len(search.scores),
        seconds=round(search.elapsed_s, 1),
        configs=count,
        grid_trials=count,
        grid_seconds=round(per_config * count, 1) if per_config is not None else None,
        ending=outcome.ending,
    )


def winner_plan(outcome: TuneOutcome, settings: Settings, model_size_bytes: int) -> QuantPlan | None:
    """The capacity plan of the winner (its best trial's decided limit, goodput and memory)."""
    config = outcome.winner
    best = outcome.search.winner()
    if config is None or best is None:
        return None
    line = outcome.trial(best.key, best.rung)
    users = int(best.limit) if settings.tune.objective == "users" and best.limit is not None else None
    rps = best.limit if settings.tune.objective == "rate" else best.goodput_rps
    limit = MeasuredLimit(
        outcome.quant,
        users,
        rps,
        line.output_tok_s if line else None,
        f"quantload tune's winner ({best.key}), rung {best.rung + 1}",
    )
    memory = None
    if line is not None and line.kv_mib is not None:
        kv_bytes = round(line.kv_mib * MIB)
        cells = config.slots * config.ctx_per_slot
        memory = ServerMemory(
            weights_bytes=round(line.model_mib * MIB) if line.model_mib else model_size_bytes,
            kv_bytes=kv_bytes,
            buffers_bytes=round(line.buffers_mib * MIB) if line.buffers_mib is not None else None,
            slots=config.slots,
            ctx_per_slot=config.ctx_per_slot,
            kv_bytes_per_cell=kv_bytes / cells if cells else None,
            budget_bytes=None,
        )
    inputs = plan_view(**settings.plan.model_dump())
    if memory is not None and inputs.memory_budget_bytes is not None:
        memory = ServerMemory(**{**memory.__dict__, "budget_bytes": inputs.memory_budget_bytes})
    return plan_quant(limit, inputs, memory, None, settings.slo.ttft_s, settings.slo.tpot_s)


def plan_lines(plan: QuantPlan | None, currency: str) -> list[str]:
    """The plan in a few lines a person reads."""
    if plan is None:
        return [
            "no capacity plan: no configuration was shown to beat the configured flags (or to meet the SLO)"
        ]
    limit = plan.limit
    held = f"{limit.users} users" if limit.users is not None else "-"
    rate = f"{limit.rps:.2f} good requests/s" if limit.rps is not None else "no goodput measured"
    lines = [f"one server holds {held} within the SLO ({rate}); from {limit.source}"]
    for count in (plan.by_rate, plan.by_users):
        if count is not None:
            lines.append(
                f"for {count.target:g} {count.kind}: {count.servers} server(s), each at"
                f" {count.utilisation:.0%} of its limit"
            )
    if plan.memory is not None:
        memory = plan.memory
        fits = "" if memory.fits is None else (" (fits the budget)" if memory.fits else " (over the budget)")
        lines.append(
            f"memory per server: {memory.total_bytes / MIB:,.0f} MiB (weights"
            f" {memory.weights_bytes / MIB:,.0f}, KV {(memory.kv_bytes or 0) / MIB:,.0f}, buffers"
            f" {(memory.buffers_bytes or 0) / MIB:,.0f}){fits}"
        )
    if plan.costs is not None and plan.costs.per_million_output_at_limit is not None:
        lines.append(
            f"cost per million output tokens at the limit:"
            f" {plan.costs.per_million_output_at_limit:.3g} {currency}"
        )
    if plan.by_rate is None and plan.by_users is None:
        lines.append("no target load set: plan.target_rps or plan.target_users gives a server count")
    return lines


TUNE_RESULT_SCHEMA = "quantload.tune_result/1"


def quant_summary(
    outcome: TuneOutcome,
    spec: ServerSpec,
    settings: Settings,
    binary: Path,
    model_size_bytes: int,
    port: int = 0,
) -> dict[str, Any]:
    """A quantization's entry of tune.json (see the module docstring)."""
    winner = outcome.winner
    plan = winner_plan(outcome, settings, model_size_bytes)
    cost = search_cost(outcome)
    return {
        "quant": outcome.quant,
        "server": outcome.server,
        "objective": settings.tune.objective,
        "ending": outcome.ending,
        "ranking": [row.to_dict() for row in ranking(outcome)],
        "winner": winner.key if winner is not None else None,
        "winner_flags": winner.to_dict() if winner is not None else None,
        "command": winner_command(spec, winner, settings, binary, port) if winner is not None else None,
        "env": env_lines(winner) if winner is not None else [],
        "compose_override": compose_override(winner, settings, outcome.quant) if winner is not None else None,
        "cost": {**cost.__dict__, "share": cost.share, "sentence": cost.sentence()},
        "plan": plan.to_dict() if plan is not None else None,
        "plan_lines": plan_lines(plan, settings.plan.currency),
        "against_baseline": against_baseline(outcome),
        "notes": list(outcome.notes),
        "screening": outcome.screening.to_dict() if outcome.screening is not None else None,
    }


def against_baseline(outcome: TuneOutcome) -> dict[str, Any] | None:
    """The best configuration against the configured flags, decided (quantload.comparison): a
    winner is named only where it beats them; otherwise the configured flags are as good as any
    tried. The configurations tied with the best are named too."""
    best, baseline = outcome.search.winner(), outcome.baseline
    comparison = outcome.against_baseline()
    if best is None or baseline is None or comparison is None:
        return None
    tied = [score.key for score in outcome.search.tied_with(best)]
    said = comparison.text(best.key, "the configured flags")
    if comparison.better != "a":
        said = f"the configured flags are as good as any configuration tried: {said}"
    if tied:
        said += f"; tied with {best.key}: {', '.join(tied)}"
    return {
        "winner": best.key if comparison.better == "a" else None,
        "best": best.key,
        "best_limit": best.limit,
        "best_lowest_miss": best.lowest_miss,
        "best_goodput_rps": best.goodput_rps,
        "best_rung": best.rung,
        "baseline_limit": baseline.limit,
        "baseline_lowest_miss": baseline.lowest_miss,
        "baseline_goodput_rps": baseline.goodput_rps,
        "limit_ratio": comparison.ratio,
        "limit_ratio_low": comparison.low,
        "limit_ratio_high": comparison.high,
        "decided": comparison.shown,
        "tied": tied,
        "sentence": said,
    }


def write_tune_json(run_dir: Path, quant: str, summary: dict[str, Any]) -> None:
    """Add (or replace) one quantization's entry of the run's tune.json."""
    from quantload.analysis.summary_json import clean  # the report's JSON rules (NaN to null)

    path = RunDir(run_dir).tune_outcome_path
    current: dict[str, Any] = {}
    if path.is_file():
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
            current = loaded.get("quants", {}) if isinstance(loaded, dict) else {}
        except ValueError:
            current = {}
    write_json_atomic(path, {"schema": TUNE_RESULT_SCHEMA, "quants": {**current, quant: clean(summary)}})
