"""The noisy-neighbour experiment against a fake server with real Locust processes (one process, and
a master with workers): records, stage lines, metrics labels and the report's per-tenant figures.

Moved from tests/unit/load/test_tenants.py, whose other tests start no process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from load_api import settings_context
from quantload.analysis.capacity_plan import CapacityPlan, MeasuredLimit, PlanSettingsView, QuantPlan
from quantload.analysis.run_data import load_run
from quantload.analysis.stage_tables import stage_table
from quantload.config import Settings
from quantload.experiments.base import ExperimentContext
from quantload.experiments.noisy_neighbour.stages import run as run_noisy_neighbour
from quantload.experiments.noisy_neighbour.tables import noisy_table, noisy_verdicts, tenant_table
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.records import iter_records, iter_stage_events
from quantload.served import ServedTarget
from quantload.slo import Slo

pytestmark = pytest.mark.integration

TARGET = ServedTarget(name="fake", quant="Q4_K_M", model="m", url="http://127.0.0.1:1")
LOAD = {"warmup_requests": 1, "request_timeout_s": 10, "first_round_jitter_s": 0.0, "metrics_port": 0,
        "max_tokens": 6}  # fmt: skip


def _two_tenants(tmp_path: Path, steps: list[float], b: dict[str, Any] | None = None) -> Settings:
    return Settings.model_validate(
        {
            "load": LOAD,
            "tenants": [
                {"name": "a", "users": 2, "slo_ttft_p99_s": 5.0},
                {"name": "b", "users": 1, **(b or {}),
                 "workload": {"kind": "lengths", "input_lengths": "fixed:40", "output_lengths": "fixed:4"}},
            ],
            "noisy_neighbour": {"steps": steps, "requests_per_user": 3},
        }
    )  # fmt: skip


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, change in edges:
        now += change
        most = max(most, now)
    return most


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "master-and-workers"])
def test_the_noisy_neighbour_against_a_fake_server_and_its_report(tmp_path: Path, workers: int) -> None:
    settings = _two_tenants(tmp_path, [0, 1, 4])
    settings = settings.model_copy(update={"load": settings.load.model_copy(update={"workers": workers})})
    (tmp_path / "config.json").write_text(f'{{"settings": {settings.model_dump_json()}}}')
    script = FakeScript(ttft_ms=(20, 30), itl_ms=(5, 5), tokens=6, max_streams=2, close_after_stream=True)
    with FakeServer(script) as fake:
        target = TARGET.model_copy(update={"url": fake.url})
        done = run_noisy_neighbour(ExperimentContext(settings_context(tmp_path, settings), target))
    assert [(s.phase, s.status, s.users, s.requests) for s in done.summaries] == [
        ("b at 0 users", "ok", 2, 6), ("b at 1 user", "ok", 3, 9), ("b at 4 users", "ok", 6, 18),
    ]  # fmt: skip
    records = [r for r in iter_records(tmp_path / "records.jsonl") if not r.warmup]
    assert all(r.ok and r.tenant in ("a", "b") for r in records)
    for summary in done.summaries:  # each tenant kept to its own users, whatever the other sent
        for tenant, users in ((t.name, t.users) for t in summary.tenants or []):
            mine = [(r.sent_unix_s, r.sent_unix_s + (r.e2e_s or 0)) for r in records
                    if r.stage_id == summary.stage_id and r.tenant == tenant]  # fmt: skip
            assert 1 <= _max_overlap(mine) <= users, (summary.phase, tenant)
    ends = [e for e in iter_stage_events(tmp_path / "stages.jsonl") if e.event == "stage_end"]
    assert [[t.name for t in e.tenants or []] for e in ends] == [["a"], ["a", "b"], ["a", "b"]]

    run = load_run(tmp_path)
    stages = stage_table(run, Slo(1.0, 0.1))
    per_tenant = tenant_table(run.records, stages, run.settings, Slo(1.0, 0.1))
    assert sorted(zip(per_tenant["tenant"], per_tenant["slo_ttft_s"], strict=True))[0] == ("a", 5.0)
    table = noisy_table(run.records, stages, run.settings, Slo(1.0, 0.1), ["Q4_K_M"])
    assert table[["step", "tenant"]].values.tolist() == [[0.0, "a"], [1.0, "a"], [1.0, "b"], [4.0, "a"], [4.0, "b"]]
    assert table["fairness_index"].iloc[0] is None or pd_isna(table["fairness_index"].iloc[0])
    assert all(0 < index <= 1 for index in table["fairness_index"].iloc[1:])
    limit = MeasuredLimit("Q4_K_M", users=2, rps=None, output_tok_s=None, source="the sweep")
    plan = CapacityPlan(
        PlanSettingsView(None, None, 0.0, 2.0, "USD", None),
        (QuantPlan("Q4_K_M", limit, None, None, None, None, None, None),), (),
    )  # fmt: skip
    (verdict,) = noisy_verdicts(table, run.settings, plan)
    assert verdict.neighbour == "b" and verdict.sentence.startswith("Q4_K_M: ")
    cost = verdict.isolation
    assert cost is not None and cost.shared_servers == 1
    assert cost.step == (verdict.breaking_step if verdict.breaking_step is not None else 4.0)
    assert cost.shared_held is (verdict.breaking_step is None)
    # each tenant against one server's 2-user limit, no headroom: a at 2 users 1 server, b ceil(step / 2)
    assert cost.per_tenant == {"a": 1, **({"b": -(-int(cost.step) // 2)} if cost.step else {})}
    assert cost.isolated_servers == sum(cost.per_tenant.values()) and cost.price_per_hour == 2.0


def pd_isna(value: object) -> bool:
    import pandas as pd

    return bool(pd.isna(value))
