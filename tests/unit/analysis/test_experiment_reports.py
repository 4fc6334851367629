"""An experiment's own part of the report, declared on the experiment (ExperimentReport): the report
step finds it through the registry and uses it alike, and nothing under analysis/ names the
experiment. The noisy neighbour and the soak have one."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from quantload.analysis import build_report
from quantload.analysis.analyze import analyze_run
from quantload.analysis.chapters import chapters, figures
from quantload.analysis.chapters import contexts as contexts_chapter
from quantload.analysis.run_data import load_run
from quantload.config import ReportSettings
from quantload.experiments import registry
from quantload.experiments.noisy_neighbour.findings import NoisyNeighbourFindings
from quantload.experiments.noisy_neighbour.report import REPORT
from quantload.experiments.soak.findings import SoakFindings
from quantload.experiments.soak.report import REPORT as SOAK_REPORT
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


def test_no_module_of_the_analysis_names_the_noisy_neighbour_or_the_soak() -> None:
    for path in sorted(ANALYSIS.rglob("*.py")):
        imported = _imported(ast.parse(path.read_text(encoding="utf-8")))
        assert not any("noisy_neighbour" in name for name in imported), path.name
        assert not any(name.rsplit(".", 1)[-1] == "soak" for name in imported), path.name
    assert not (ANALYSIS / "soak.py").exists() and not (ANALYSIS / "chapters" / "soak.py").exists()


def test_the_registry_hands_the_report_each_part_in_its_order() -> None:
    parts = registry.reported()
    assert [experiment.name for experiment, _ in parts] == ["noisy_neighbour", "soak"]
    assert parts[0][1] is REPORT and parts[1][1] is SOAK_REPORT
    every = chapters()
    after = every.index(contexts_chapter.CHAPTER)
    assert every[after + 1 : after + 3] == (REPORT.chapter, SOAK_REPORT.chapter)
    keys = [figure.key for figure in figures()]
    assert keys.index("noisy_neighbour") + 1 == keys.index("soak")


def test_the_findings_are_kept_by_name_and_summarized_under_the_old_keys(synthetic_run: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    analysis = analyze_run(load_run(synthetic_run), ReportSettings(), dead)
    found = analysis.findings["noisy_neighbour"]
    assert isinstance(found, NoisyNeighbourFindings)
    assert found.tenants.empty and found.steps.empty and found.verdicts == ()
    build_report(synthetic_run, dead)
    summary = json.loads((synthetic_run / "summary.json").read_text())
    assert (summary["tenants"], summary["noisy_neighbour"], summary["noisy_verdicts"]) == ([], [], [])
    soaked = analysis.findings["soak"]
    assert isinstance(soaked, SoakFindings) and soaked.runs == () and summary["soak"] == []
