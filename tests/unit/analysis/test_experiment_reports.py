"""An experiment's own part of the report, declared on the experiment (ExperimentReport): the report
step finds it through the registry and uses it alike, and nothing under analysis/ names the
experiment. The prompt-cache, open-loop, sessions, mixed, context, noisy-neighbour, kv_types and soak
experiments have a chapter of their own; the flag experiments (batching, slots, speculation) are
sections of the server flags chapter, before the tune's, and the trace replay the traffic chapter's
first section."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
from pathlib import Path

import pytest

from quantload.analysis import build_report
from quantload.analysis.analyze import analyze_run
from quantload.analysis.chapters import chapters, figures
from quantload.analysis.chapters import load as load_chapter
from quantload.analysis.chapters import model_files as model_files_chapter
from quantload.analysis.chapters import plan as plan_chapter
from quantload.analysis.chapters import server_flags as server_flags_chapter
from quantload.analysis.chapters import ttft as ttft_chapter
from quantload.analysis.run_data import load_run
from quantload.analysis.summary_json import clean
from quantload.config import ReportSettings
from quantload.experiments import registry
from quantload.experiments.batching.findings import BatchingFindings
from quantload.experiments.context.findings import ContextFindings
from quantload.experiments.context.report import REPORT as CONTEXT_REPORT
from quantload.experiments.kv_types.findings import KvTypesFindings
from quantload.experiments.kv_types.report import REPORT as KV_TYPES_REPORT
from quantload.experiments.mixed.findings import MixedFindings
from quantload.experiments.mixed.report import REPORT as MIXED_REPORT
from quantload.experiments.noisy_neighbour.findings import NoisyNeighbourFindings
from quantload.experiments.noisy_neighbour.report import REPORT
from quantload.experiments.open_loop.findings import OpenLoopFindings
from quantload.experiments.open_loop.report import REPORT as OPEN_LOOP_REPORT
from quantload.experiments.prefix_cache.findings import PrefixCacheFindings
from quantload.experiments.prefix_cache.report import REPORT as PREFIX_CACHE_REPORT
from quantload.experiments.ramp_up.report import REPORT as RAMP_UP_REPORT
from quantload.experiments.sessions.findings import SessionsFindings
from quantload.experiments.sessions.report import REPORT as SESSIONS_REPORT
from quantload.experiments.slots.findings import SlotsFindings
from quantload.experiments.soak.findings import SoakFindings
from quantload.experiments.soak.report import REPORT as SOAK_REPORT
from quantload.experiments.speculation.findings import SpeculationFindings
from quantload.experiments.trace.findings import TraceFindings
from quantload.llamacpp.server import free_port

ANALYSIS = Path(__file__).resolve().parents[3] / "src" / "quantload" / "analysis"


def _imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def test_no_module_of_the_analysis_imports_an_experiment_with_a_report_part() -> None:
    moved = (
        "noisy_neighbour", "experiments.sessions", "experiments.mixed", "session_tables", "mixed_tables",
        "experiments.context", "context_tables", "kv_types", "experiments.batching", "experiments.slots",
        "experiments.speculation", "experiments.open_loop", "experiments.trace", "experiments.prefix_cache",
    )
    for path in sorted(ANALYSIS.rglob("*.py")):
        imported = _imported(ast.parse(path.read_text(encoding="utf-8")))
        assert not any(word in name for name in imported for word in moved), path.name
        assert not any(name.rsplit(".", 1)[-1] == "soak" for name in imported), path.name
    assert not (ANALYSIS / "soak.py").exists() and not (ANALYSIS / "chapters" / "soak.py").exists()


def test_the_registry_hands_the_report_each_part_in_its_order() -> None:
    parts = registry.reported()
    names = [
        "prefix_cache", "open_loop", "sessions", "trace", "mixed", "batching", "slots", "speculation", "context",
        "noisy_neighbour", "kv_types", "soak", "ramp_up",
    ]  # fmt: skip
    assert [experiment.name for experiment, _ in parts] == names
    by_name = {experiment.name: part for experiment, part in parts}
    reports = [
        PREFIX_CACHE_REPORT, OPEN_LOOP_REPORT, SESSIONS_REPORT, MIXED_REPORT, CONTEXT_REPORT, REPORT, KV_TYPES_REPORT, SOAK_REPORT,
        RAMP_UP_REPORT,
    ]  # fmt: skip
    assert [part for _, part in parts if part.within is None] == reports
    assert [name for name, part in by_name.items() if part.within == "server_flags"] == [
        "batching", "slots", "speculation",
    ]
    assert [name for name, part in by_name.items() if part.within == "traffic"] == ["trace"]
    every = chapters()
    # the sessions and mixed sections stay where they were: after the plan, before the rest of traffic
    at = every.index(plan_chapter.CHAPTER)
    assert every[at + 1 : at + 3] == (SESSIONS_REPORT.chapter, MIXED_REPORT.chapter)
    after_flags = at + 4  # plan, sessions, mixed, traffic, then the server flags chapter
    assert every[after_flags + 1 : after_flags + 4] == (CONTEXT_REPORT.chapter, REPORT.chapter, SOAK_REPORT.chapter)
    assert every[every.index(model_files_chapter.CHAPTER) + 1] is KV_TYPES_REPORT.chapter
    # the open loop stays the load chapter's last section, before the ramp-up's chapter and the plan
    assert every[every.index(load_chapter.CHAPTER) + 1 : at] == (OPEN_LOOP_REPORT.chapter, RAMP_UP_REPORT.chapter)
    # the prompt cache stays the last section after where TTFT goes
    assert every[every.index(ttft_chapter.CHAPTER) + 1 : every.index(model_files_chapter.CHAPTER)] == (
        PREFIX_CACHE_REPORT.chapter,
    )
    keys = [figure.key for figure in figures()]
    assert keys.index("ttft_by_turn") < keys.index("mixed_itl") < keys.index("mixed_timeline")
    # the server flags chapter: the experiments' figures in the registry's order, then the tune's
    assert keys[keys.index("batching") : keys.index("tune") + 1] == ["batching", "slots", "speculation", "tune"]
    assert keys.index("tune") < keys.index("context_by_turn")
    assert keys.index("context_by_turn") < keys.index("noisy_neighbour") < keys.index("kv_cache_types")
    assert keys.index("noisy_neighbour") + 1 == keys.index("soak")
    assert {"mixed"} == {e.name for e, part in parts if part.itl_gaps}
    assert {"prefix_cache"} == {e.name for e, part in parts if part.file_gaps is not None}
    assert [(e.name, f.name) for e, part in parts for f in part.compared] == [
        ("prefix_cache", "prompt-cache TTFT p50 speed-up")
    ]
    assert server_flags_chapter.KEY == "server_flags"


def test_a_part_that_follows_no_chapter_of_the_report_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    listing = importlib.import_module("quantload.analysis.chapters")
    experiment = registry.get("noisy_neighbour")
    part = registry.report_part(experiment)
    misplaced = dataclasses.replace(part, follows="nowhere")
    monkeypatch.setattr(listing, "reported", lambda: ((experiment, misplaced),))
    with pytest.raises(ValueError, match="nowhere"):
        chapters()
    within_nothing = dataclasses.replace(part, within="nowhere")
    monkeypatch.setattr(listing, "reported", lambda: ((experiment, within_nothing),))
    with pytest.raises(ValueError, match="nowhere"):
        chapters()



def test_the_findings_are_kept_by_name_and_summarized_under_the_old_keys(synthetic_run: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    analysis = analyze_run(load_run(synthetic_run), ReportSettings(), dead)
    found = analysis.findings["noisy_neighbour"]
    assert isinstance(found, NoisyNeighbourFindings)
    assert found.tenants.empty and found.steps.empty and found.verdicts == ()
    sessions, mixed = analysis.findings["sessions"], analysis.findings["mixed"]
    assert isinstance(sessions, SessionsFindings) and isinstance(mixed, MixedFindings)
    assert sessions.turns.empty and sessions.hits.empty and sessions.hit_summary.empty
    assert mixed.table.empty and mixed.verdict.startswith("not measured")
    build_report(synthetic_run, dead)
    summary = json.loads((synthetic_run / "summary.json").read_text())
    assert (summary["tenants"], summary["noisy_neighbour"], summary["noisy_verdicts"]) == ([], [], [])
    assert (summary["session_turns"], summary["session_hits"], summary["mixed"]) == ([], [], [])
    assert summary["mixed_verdict"] == mixed.verdict
    # none of the three files a "not measured" note the sessions or mixed experiment never had
    assert not [gap for gap in summary["not_measured"] if "sessions" in gap["what"] or "mixed" in gap["what"]]
    soaked = analysis.findings["soak"]
    assert isinstance(soaked, SoakFindings) and soaked.runs == () and summary["soak"] == []
    context = analysis.findings["context"]
    assert isinstance(context, ContextFindings) and context.policies.empty and context.turns.empty
    assert isinstance(analysis.findings["kv_types"], KvTypesFindings)
    assert (summary["context_policies"], summary["context_turns"], summary["kv_cache_types"]) == ([], [], [])
    for name, kind in (
        ("batching", BatchingFindings),
        ("slots", SlotsFindings),
        ("speculation", SpeculationFindings),
    ):
        flag = analysis.findings[name]
        assert isinstance(flag, kind) and flag.table.empty
        assert summary["server_flags"][name] == {"rows": [], "verdict": flag.verdict}
    assert set(summary["server_flags"]) == {"batching", "slots", "speculation", "tune"}
    cache = analysis.findings["prefix_cache"]
    assert isinstance(cache, PrefixCacheFindings)
    assert summary["prompt_cache"] == [clean(item.to_dict()) for item in cache.comparisons]
    traced = analysis.findings["trace"]
    assert isinstance(traced, TraceFindings) and traced.stages.empty and "trace" not in summary
    opened = analysis.findings["open_loop"]
    assert isinstance(opened, OpenLoopFindings) and opened.levels.empty and summary["open_loop_levels"] == []


def test_a_report_part_is_its_modules_report_and_a_module_without_one_is_refused() -> None:
    experiment = registry.get("sessions")
    assert experiment.report == "quantload.experiments.sessions.report"
    assert registry.report_part(experiment) is SESSIONS_REPORT
    with pytest.raises(TypeError, match=r"quantload\.experiments\.sessions\.stages has no REPORT"):
        registry.report_part(dataclasses.replace(experiment, report="quantload.experiments.sessions.stages"))
    with pytest.raises(ValueError, match="sweep experiment has no part of its own"):
        registry.report_part(registry.get("sweep"))
