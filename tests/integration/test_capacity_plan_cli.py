"""The capacity plan for real: from the shared tiny run, and the scale-out alert on a server pushed
past its limit (more users than slots) with the real exporter, Prometheus and load generator."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from load_api import experiment
from quantload.analysis import build_report
from quantload.config import LoadSettings, ReportSettings
from quantload.exporter import ExporterTarget, start_exporter
from quantload.llamacpp.server import LlamaServer, ServerSpec, free_port
from quantload.llamacpp.toolchain import Toolchain
from quantload.observe.prometheus import PrometheusProcess
from quantload.served import ServedTarget
from quantload.slo import Slo
from support import require_binary, run_quantload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def test_the_plan_of_the_shared_run_has_every_figure(ci_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / ci_run.name
    shutil.copytree(ci_run, copy)
    result = run_quantload(
        ["report", str(copy), "--plan", "--target-rps", "20", "--headroom", "0.3", "--price-per-hour", "1",
         "--memory-budget-gib", "0.5"],
        cwd=tmp_path, timeout_s=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "capacity plan" in result.stdout
    plan = _json(copy / "summary.json")["plan"]
    assert plan["inputs"]["target_rps"] == 20 and plan["inputs"]["headroom_frac"] == 0.3
    assert plan["missing"] == []
    assert [q["quant"] for q in plan["quants"]] == ["F16", "Q8_0", "Q4_K_M"]
    for quant in plan["quants"]:
        memory = quant["memory"]
        assert memory["weights_bytes"] > 30e6 and memory["kv_bytes"] > 0 and memory["buffers_bytes"] > 0
        assert memory["total_bytes"] == memory["weights_bytes"] + memory["kv_bytes"] + memory["buffers_bytes"]
        assert memory["fits"] is True and memory["max_slots_at_ctx"] >= 4
        if quant["limit"]["users"] is not None:  # the tiny model holds the SLO on this machine
            count = quant["by_rate"]
            assert quant["servers"] == count["servers"] >= 1 and 0 < count["utilisation"] <= 0.7 + 1e-9
            costs = quant["costs"]
            assert costs["per_hour_planned"] == quant["servers"] * 1.0
            assert costs["per_request_planned"] == pytest.approx(quant["servers"] / (20 * 3600))
            assert quant["prompt_limit"] is not None
    report = (copy / "report.md").read_text()
    assert "## Capacity plan" in report and "## When to add a server" in report
    assert len(plan["scale_out"]) == 3


def test_the_queueing_alert_fires_on_a_server_pushed_past_its_slots(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    require_binary("prometheus", "apt-get install -y prometheus")
    spec = ServerSpec(model_path=tiny_models["Q4_K_M"], alias="tiny-Q4_K_M", slots=2, ctx_per_slot=1024)
    loadgen_port = free_port()
    with LlamaServer(toolchain, spec, tmp_path / "logs" / "llama-server-Q4_K_M.log") as server:
        target = ExporterTarget(name="llama-q4_k_m", url=server.url, quant="Q4_K_M", model="tiny",
                                log_path=server.log_path)
        exporter = start_exporter([target], port=0)
        try:
            with PrometheusProcess(tmp_path, exporter.url, [f"http://127.0.0.1:{loadgen_port}"], 1.0) as prometheus:
                prometheus.wait_scraping()
                settings = LoadSettings(
                    users=(1, 6), repeats=1, prompt_count=12, max_prompt_tokens=200, max_tokens=48,
                    ignore_eos=True, warmup_requests=1, first_round_jitter_s=0.02, stage_timeout_s=120,
                    metrics_port=loadgen_port,
                )  # fmt: skip
                served = ServedTarget(name="llama-q4_k_m", quant="Q4_K_M", model="tiny", url=server.url)
                summaries = experiment("sweep", served, settings, tmp_path, "pushed")
                assert all(s.status == "ok" for s in summaries), summaries
                time.sleep(3)  # two more scrapes and rule evaluations
                alerts = httpx.get(f"{prometheus.url}/api/v1/query",
                                   params={"query": 'ALERTS{alertname="LlamaServerQueueing"}'}).json()
                deferred = httpx.get(f"{prometheus.url}/api/v1/query",
                                     params={"query": "max_over_time(quant:llamacpp_requests_deferred:sum[5m])"}).json()
                assert float(deferred["data"]["result"][0]["value"][1]) > 0
                states = {a["metric"]["alertstate"] for a in alerts["data"]["result"]}
                assert states & {"pending", "firing"}, alerts
                assert all(a["metric"]["quant"] == "Q4_K_M" for a in alerts["data"]["result"])
                written = build_report(tmp_path, prometheus.url, ReportSettings(), slo=Slo(0.25, 0.1))
        finally:
            exporter.stop()
    (signal,) = _json(written.summary)["plan"]["scale_out"]
    assert signal["deferred_from_users"] == 6
    assert signal["levels"][0]["deferred_max"] == 0 and signal["levels"][1]["deferred_max"] > 0
