"""An experiment's own part of the report, declared on the experiment (ExperimentReport): the report
step finds it through the registry and uses it alike, and nothing under analysis/ names the
experiment. The noisy neighbour has a chapter of its own; the flag experiments (batching, slots,
speculation) are sections of the server flags chapter, before the tune's."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from quantload.analysis import build_report
from quantload.analysis.analyze import analyze_run
from quantload.analysis.chapters import chapters, figures
from quantload.analysis.chapters import contexts as contexts_chapter
from quantload.analysis.chapters import server_flags as server_flags_chapter
from quantload.analysis.run_data import load_run
from quantload.config import ReportSettings
from quantload.experiments import registry
from quantload.experiments.batching.findings import BatchingFindings
from quantload.experiments.noisy_neighbour.findings import NoisyNeighbourFindings
from quantload.experiments.noisy_neighbour.report import REPORT
from quantload.experiments.slots.findings import SlotsFindings
from quantload.experiments.speculation.findings import SpeculationFindings
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


FOLDERS = ("noisy_neighbour", "batching", "slots", "speculation")


def test_no_module_of_the_analysis_imports_an_experiment_with_its_own_part() -> None:
    for path in sorted(ANALYSIS.rglob("*.py")):
        imported = _imported(ast.parse(path.read_text(encoding="utf-8")))
        for name in FOLDERS:
            assert not any(f"experiments.{name}" in module for module in imported), (path.name, name)


def test_the_registry_hands_the_report_each_part_in_its_order() -> None:
    parts = registry.reported()
    assert [experiment.name for experiment, _ in parts] == [
        "batching",
        "slots",
        "speculation",
        "noisy_neighbour",
    ]
    assert parts[-1][1] is REPORT
    assert [part.within for _, part in parts] == [*(["server_flags"] * 3), None]
    every = chapters()
    assert every[every.index(contexts_chapter.CHAPTER) + 1] is REPORT.chapter
    keys = [figure.key for figure in figures()]
    # the server flags chapter: the experiments' figures in the registry's order, then the tune's
    assert keys[keys.index("batching") : keys.index("tune") + 1] == [
        "batching",
        "slots",
        "speculation",
        "tune",
    ]
    assert keys.index("tune") < keys.index("noisy_neighbour")
    assert server_flags_chapter.KEY == "server_flags"


def test_the_findings_are_kept_by_name_and_summarized_under_the_old_keys(synthetic_run: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    analysis = analyze_run(load_run(synthetic_run), ReportSettings(), dead)
    found = analysis.findings["noisy_neighbour"]
    assert isinstance(found, NoisyNeighbourFindings)
    assert found.tenants.empty and found.steps.empty and found.verdicts == ()
    build_report(synthetic_run, dead)
    summary = json.loads((synthetic_run / "summary.json").read_text())
    assert (summary["tenants"], summary["noisy_neighbour"], summary["noisy_verdicts"]) == ([], [], [])
    for name, kind in (
        ("batching", BatchingFindings),
        ("slots", SlotsFindings),
        ("speculation", SpeculationFindings),
    ):
        flag = analysis.findings[name]
        assert isinstance(flag, kind) and flag.table.empty
        assert summary["server_flags"][name] == {"rows": [], "verdict": flag.verdict}
    assert set(summary["server_flags"]) == {"batching", "slots", "speculation", "tune"}
