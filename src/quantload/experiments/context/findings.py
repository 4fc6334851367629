"""What the report computes of the context experiment (its `Analysis.findings` entry), what it adds
to summary.json, and the policies a run that measured it left out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from quantload.analysis.report_input import ReportInput
from quantload.analysis.run_data import Gap
from quantload.experiments.context import EXPERIMENT
from quantload.experiments.context.stages import NAME
from quantload.experiments.context.tables import conversation_table, policy_table, turn_table
from quantload.rundir import STAGES_JSONL

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis

GAP_SECTION = "contexts"


@dataclass(frozen=True)
class ContextFindings:
    """Its figures per policy and turn, per conversation, and per policy."""

    turns: pd.DataFrame  # tables.turn_table
    conversations: pd.DataFrame  # tables.conversation_table
    policies: pd.DataFrame  # tables.policy_table


def context_findings(given: ReportInput) -> ContextFindings:
    """The tables of the run's context stages (empty where it has none)."""
    records = given.run.records
    conversations = conversation_table(records, given.stages)
    return ContextFindings(
        turns=turn_table(records, given.stages, given.quants),
        conversations=conversations,
        policies=policy_table(conversations, given.quants),
    )


def findings_of(analysis: Analysis) -> ContextFindings:
    """The context experiment's findings in `analysis` (empty ones where it holds none)."""
    found = analysis.findings.get(NAME)
    if isinstance(found, ContextFindings):
        return found
    return ContextFindings(pd.DataFrame(), pd.DataFrame(), pd.DataFrame())


def summary_keys(found: ContextFindings) -> Mapping[str, Any]:
    """Its keys of summary.json, named as before the experiment had a folder of its own:
    `context_policies` (tables.policy_table's rows) and `context_turns` (tables.turn_table's);
    the report makes them JSON-safe."""
    return {
        "context_policies": found.policies.to_dict("records"),
        "context_turns": found.turns.to_dict("records"),
    }


def policy_gaps(given: ReportInput) -> list[Gap]:
    """The policies of `context.policies` a run that ran the experiment has no stage of."""
    run, stages, settings = given.run, given.stages, given.run.settings
    if run.records.empty or stages.empty or settings is None or NAME not in set(stages["experiment"]):
        return []
    measured = set(stages.loc[stages["experiment"] == NAME, "context_policy"].dropna())
    gaps = []
    for policy in settings.context.policies:
        if policy not in measured:
            why = (
                "the server was not started by quantload, so it could not run with --context-shift"
                if policy == "shift"
                else run.step_why(EXPERIMENT.step, None, STAGES_JSONL)
            )
            gaps.append(Gap(GAP_SECTION, f"the {policy} policy", why, "run it through `quantload run`"))
    return gaps
