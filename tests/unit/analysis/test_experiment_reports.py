"""An experiment's own part of the report, declared on the experiment (ExperimentReport): the report
step finds it through the registry and uses it alike, and nothing under analysis/ names the
experiment. The context, noisy-neighbour and kv_types experiments have one."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from quantload.analysis import build_report
from quantload.analysis.analyze import analyze_run
from quantload.analysis.chapters import chapters, figures
from quantload.analysis.chapters import model_files as model_files_chapter
from quantload.analysis.chapters import server_flags as server_flags_chapter
from quantload.analysis.run_data import load_run
from quantload.config import ReportSettings
from quantload.experiments import registry
from quantload.experiments.context.findings import ContextFindings
from quantload.experiments.context.report import REPORT as CONTEXT_REPORT
from quantload.experiments.kv_types.findings import KvTypesFindings
from quantload.experiments.kv_types.report import REPORT as KV_TYPES_REPORT
from quantload.experiments.noisy_neighbour.findings import NoisyNeighbourFindings
from quantload.experiments.noisy_neighbour.report import REPORT
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


def test_no_module_of_the_analysis_names_an_experiment_with_a_report_part() -> None:
    for path in sorted(ANALYSIS.rglob("*.py")):
        imported = _imported(ast.parse(path.read_text(encoding="utf-8")))
        for name in ("noisy_neighbour", "experiments.context", "kv_types"):
            assert not any(name in module for module in imported), (path.name, name)


def test_the_registry_hands_the_report_each_part_in_its_order() -> None:
    parts = registry.reported()
    assert [experiment.name for experiment, _ in parts] == ["context", "noisy_neighbour", "kv_types"]
    assert [part for _, part in parts] == [CONTEXT_REPORT, REPORT, KV_TYPES_REPORT]
    every = chapters()
    after_flags = every.index(server_flags_chapter.CHAPTER)
    assert every[after_flags + 1 : after_flags + 3] == (CONTEXT_REPORT.chapter, REPORT.chapter)
    assert every[every.index(model_files_chapter.CHAPTER) + 1] is KV_TYPES_REPORT.chapter
    keys = [figure.key for figure in figures()]
    assert keys.index("context_by_turn") < keys.index("noisy_neighbour") < keys.index("kv_cache_types")


def test_the_findings_are_kept_by_name_and_summarized_under_the_old_keys(synthetic_run: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    analysis = analyze_run(load_run(synthetic_run), ReportSettings(), dead)
    found = analysis.findings["noisy_neighbour"]
    assert isinstance(found, NoisyNeighbourFindings)
    assert found.tenants.empty and found.steps.empty and found.verdicts == ()
    context = analysis.findings["context"]
    assert isinstance(context, ContextFindings) and context.policies.empty and context.turns.empty
    assert isinstance(analysis.findings["kv_types"], KvTypesFindings)
    build_report(synthetic_run, dead)
    summary = json.loads((synthetic_run / "summary.json").read_text())
    assert (summary["tenants"], summary["noisy_neighbour"], summary["noisy_verdicts"]) == ([], [], [])
    assert (summary["context_policies"], summary["context_turns"], summary["kv_cache_types"]) == ([], [], [])
