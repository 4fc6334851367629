"""The speculation experiment's variants and stages: each way of speculating a server restarted
with it, its traffic at 1 user and at the limit, and whether it speculated (probe) (the experiment
as a whole: the package docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from quantload.config import Settings
from quantload.errors import ConfigError, QuantloadError
from quantload.experiments.at_limit import users_at_limit
from quantload.experiments.base import (
    ExperimentContext,
    ExperimentRun,
    Preflight,
    ServerFlags,
    experiment_run,
)
from quantload.experiments.running import invocation_id, run_stages
from quantload.experiments.speculation.probe import check_after, check_before
from quantload.experiments.variant_file import SpeculationCheck, append_variant, variant_line
from quantload.load.plan import PlannedRequest, assemble_plan, stage_plan
from quantload.load.prompts import select_prompts
from quantload.load.records import iter_records
from quantload.load.summary import StageSummary
from quantload.load.supervisor import LoadError
from quantload.load.workloads import StageRequests
from quantload.models.vocab import draft_file_problem, draft_problem
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget

NAME = "speculation"
OFF = "off"
INSTRUCTIONS = (
    "Repeat the following text exactly, word for word, and write nothing else.",
    "Copy the following text, correcting only its spelling and punctuation, and write nothing else.",
)


@dataclass(frozen=True)
class SpecVariant:
    """One way of speculating: its name in the report and the flags that ask for it."""

    kind: str  # "off", "ngram", "draft", "synth"
    flags: ServerFlags

    @property
    def speculates(self) -> bool:
        return self.kind != OFF


def _n_max(settings: Settings) -> tuple[str, ...]:
    n_max = settings.speculation.draft_n_max
    return ("--spec-draft-n-max", str(n_max)) if n_max is not None else ()


def ngram_args(settings: Settings) -> tuple[str, ...]:
    kind = settings.speculation.ngram_type
    base = ("--spec-default",) if kind == "default" else ("--spec-type", kind)
    return (*base, *_n_max(settings))


def draft_args(draft: Path, settings: Settings) -> tuple[str, ...]:
    return ("-md", str(draft), "--spec-type", "draft-simple", *_n_max(settings))


def spec_variants(settings: Settings) -> list[SpecVariant]:
    """Off, the n-gram type, the draft model (when given), then each synthetic length."""
    spec = settings.speculation
    ngram = ngram_args(settings)
    variants = [
        SpecVariant(OFF, ServerFlags(extra_args=("--spec-type", "none"), label="spec off")),
        SpecVariant("ngram", ServerFlags(extra_args=ngram, label=f"spec ngram {spec.ngram_type}")),
    ]
    base = ngram
    if spec.draft_model is not None:
        base = draft_args(spec.draft_model, settings)
        label = f"spec draft {spec.draft_model.stem}"
        variants.append(SpecVariant("draft", ServerFlags(extra_args=base, label=label)))
    for length in spec.synth_lengths:
        synth = (*base, "--spec-synth-len", f"{length:g}")
        variants.append(SpecVariant("synth", ServerFlags(extra_args=synth, label=f"spec synth {length:g}")))
    return variants


def check_draft(settings: Settings, build_types: Sequence[str], models: dict[str, Path] | None) -> None:
    """ConfigError when the build lacks a type asked for, or the draft is missing or of another
    vocabulary than a model it would draft for."""
    spec = settings.speculation
    wanted: list[str] = ["ngram-mod" if spec.ngram_type == "default" else spec.ngram_type]
    if spec.draft_model is not None:
        wanted.append("draft-simple")
    lacking = [kind for kind in wanted if build_types and kind not in build_types]
    if lacking:
        raise ConfigError(
            f"this llama-server build has no speculative decoding type {lacking[0]}",
            f"it has {', '.join(build_types)}",
        )
    if spec.draft_model is None:
        return
    for quant, path in (models or {}).items():
        problem = draft_problem(path, spec.draft_model)
        if problem is not None:
            raise ConfigError(
                f"speculation.draft_model: {problem} (target {quant}: {path.name})",
                "give a GGUF of the same model at another precision, or unset speculation.draft_model",
            )
    if not models:
        problem = draft_file_problem(spec.draft_model)
        if problem is not None:
            raise ConfigError(f"speculation.draft_model: {problem}", "give a GGUF draft model, or unset it")


def check(preflight: Preflight) -> None:
    check_draft(preflight.settings, preflight.build.spec_types, dict(preflight.models))


def traffic(settings: Settings, kind: str, count: int, cwd: Path) -> StageRequests:
    """`count` requests of one traffic kind (see the module docstring), cycling the prompts."""
    spec = settings.speculation
    try:
        chosen = select_prompts(settings.load.prompts, count, 8, spec.prompt_max_tokens, cwd)
    except ConfigError as error:
        raise ConfigError(error.problem, "raise speculation.prompt_max_tokens") from None
    texts: dict[str, str] = {}
    requests = []
    for index in range(count):
        prompt = chosen[index % len(chosen)]
        if kind == "repeat":
            instruction = INSTRUCTIONS[index % len(INSTRUCTIONS)]
            prompt_id = f"{NAME}-{kind}{index % len(INSTRUCTIONS)}-{prompt.id}"
            texts[prompt_id] = f"{instruction}\n\n{prompt.text}"
        else:
            prompt_id = f"{NAME}-{kind}-{prompt.id}"
            texts[prompt_id] = prompt.text
        requests.append(PlannedRequest(prompt_id=prompt_id, max_tokens=spec.max_tokens))
    return StageRequests(tuple(requests), texts, f"speculation-{kind}", ignore_eos=False)


def _stages(
    context: ExperimentContext, target: ServedTarget, variant: SpecVariant, levels: Sequence[int]
) -> list[StageSummary]:
    settings = context.settings
    spec = settings.speculation
    summaries: list[StageSummary] = []
    for kind in spec.traffic:
        for users in levels:
            drawn = traffic(settings, kind, max(spec.requests, 2 * users), context.run.cwd)
            invocation = f"{invocation_id(NAME, target)}-{kind}-{users}"
            stage = stage_plan(
                settings.load,
                invocation,
                0,
                NAME,
                users,
                drawn,
                cache_prompt=False,
                timeout_s=spec.stage_timeout_s,
                phase=f"{kind} traffic",
                server_args=variant.flags.label,
                server_state=f"cache_prompt off; {variant.flags.label}",
            )
            plan = assemble_plan(settings.load, target, context.run.run_id, invocation, [drawn], [stage])
            summaries += run_stages(context, plan).summaries
    return summaries


def request_drafts(run_dir: RunDir, stage_ids: set[str]) -> tuple[list[float], int]:
    """The draft tokens each measured request of these stages reported, and how many there were."""
    drafts, requests = [], 0
    for record in iter_records(run_dir.records_path):
        if record.stage_id in stage_ids and not record.warmup:
            requests += 1
            drafts.append(float((record.timings or {}).get("draft_n", 0.0)))
    return drafts, requests


def _failed(summaries: Sequence[StageSummary], why: str) -> list[StageSummary]:
    return [s.model_copy(update={"status": "failed", "reason": why}) for s in summaries]


def _one_variant(
    context: ExperimentContext, variant: SpecVariant, levels: Sequence[int]
) -> tuple[list[StageSummary], str | None]:
    assert context.servers is not None
    with context.servers.variant(variant.flags) as served:
        check: SpeculationCheck | None = None
        if variant.speculates:
            check = check_before(served.target, served.startup_log)
            if not check.speculating:
                append_variant(context.run.run_dir, variant_line(context.run.run_id, NAME, served, check))
                return [], check.why
        summaries = _stages(context, served.target, variant, levels)
        if check is not None:
            drafts, requests = request_drafts(context.run.run_dir, {s.stage_id for s in summaries})
            check = check_after(served.target, check, drafts, requests)
        append_variant(context.run.run_dir, variant_line(context.run.run_id, NAME, served, check))
    if check is not None and not check.speculating:
        return _failed(summaries, check.why), check.why
    return summaries, None


def run(context: ExperimentContext) -> ExperimentRun:
    settings = context.settings
    if context.servers is None:
        raise ConfigError(
            "the speculation experiment restarts llama-server with each way of speculating",
            "run it through `quantload run`",
        )
    check_draft(settings, (), None)
    at_limit = users_at_limit(context, settings.speculation.users, NAME)
    levels = sorted({1, at_limit.users})
    context.run.progress(0, None, f"{context.target.name} speculation at {levels} users ({at_limit.source})")
    summaries: list[StageSummary] = []
    failed: list[str] = []
    variants = spec_variants(settings)
    for variant in variants:
        try:
            done, why = _one_variant(context, variant, levels)
        except QuantloadError as error:
            done, why = [], error.one_line()
        summaries += done
        if why is not None:
            failed.append(f"{variant.flags.label}: {why}")
    if failed:
        raise LoadError(
            f"the speculation experiment measured {len(variants) - len(failed)} of {len(variants)} ways"
            f" of speculating; {'; '.join(failed)}",
            "the stages it did run are in records.jsonl; variants.jsonl says why",
        )
    return at_limit.with_search_time(experiment_run(NAME, summaries))
