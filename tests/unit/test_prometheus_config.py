"""prometheus/prometheus.yml, its recording rules, and native mode's rewrite of them.

Its tests that start processes: tests/integration/test_prometheus_config_processes.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from quantload.cli.main import main as cli_main
from quantload.exporter import names
from quantload.exporter.server_metrics import RENAMES
from quantload.observe.prometheus import (
    PrometheusError,
    PrometheusProcess,
    native_config,
    prometheus_config_dir,
    scrape_address,
)

PROMETHEUS_YML = prometheus_config_dir() / "prometheus.yml"
RULES = prometheus_config_dir() / "rules" / "quantload.rules.yml"
# What the load generator serves (the contract in the load issue).
LOADGEN_METRICS = {
    "quantload_ttft_seconds",
    "quantload_tpot_seconds",
    "quantload_itl_seconds",
    "quantload_e2e_seconds",
    "quantload_client_lag_seconds",
    "quantload_requests_total",
    "quantload_output_tokens_total",
    "quantload_prompt_tokens_total",
    "quantload_active_users",
    "quantload_stage_info",
}
EXPORTER_METRICS = {value.name for value in vars(names).values() if isinstance(value, names.MetricSpec)} | {
    name for name, _ in RENAMES.values()
}


def _template() -> dict[str, Any]:
    return yaml.safe_load(PROMETHEUS_YML.read_text())


def test_scrape_jobs_and_intervals() -> None:
    config = _template()
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == {"prometheus", "exporter", "loadgen"}
    assert config["global"]["scrape_interval"] in ("1s", "2s")
    text = PROMETHEUS_YML.read_text()
    assert "llama" not in re.sub(r"#.*", "", text)  # never the servers themselves


def _metric_names(expr: str) -> set[str]:
    found = set(re.findall(r"\b(quantload_[a-z_]+|llamacpp_[a-z_]+)\b", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", name) for name in found}


def test_rules_use_only_metrics_that_exist() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    recorded = {rule["record"] for rule in rules}
    for wanted in ("ttft_seconds:p50", "ttft_seconds:p99", "tpot_seconds:p50", "tpot_seconds:p99"):
        assert any(wanted in name for name in recorded), wanted
    assert "quant:quantload_output_tokens:rate30s" in recorded
    assert "quant:quantload_server_slots_busy:ratio" in recorded
    for rule in rules:
        unknown = _metric_names(rule["expr"]) - LOADGEN_METRICS - EXPORTER_METRICS
        assert not unknown, (rule["record"], unknown)
        assert "quant" in rule["expr"]


def test_native_config_changes_only_addresses() -> None:
    template = _template()
    config = native_config(
        template,
        {"prometheus": ["127.0.0.1:9999"], "exporter": ["127.0.0.1:9646"], "loadgen": []},
        scrape_interval_s=2.0,
    )
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"prometheus", "exporter"}  # no load generator: job dropped
    assert jobs["exporter"]["static_configs"] == [{"targets": ["127.0.0.1:9646"]}]
    assert all(not key.endswith("_sd_configs") for job in jobs.values() for key in job)
    assert config["global"]["scrape_interval"] == "2s"
    assert config["rule_files"] == template["rule_files"]
    assert _template() == template  # the template itself is untouched


def test_native_config_rejects_unknown_jobs() -> None:
    with pytest.raises(PrometheusError, match="no job"):
        native_config(_template(), {"llama": ["127.0.0.1:8080"]})


@pytest.mark.parametrize(
    ("given", "address"),
    [("http://127.0.0.1:9646/metrics", "127.0.0.1:9646"), ("localhost:9647", "localhost:9647")],
)
def test_scrape_address(given: str, address: str) -> None:
    assert scrape_address(given) == address


def test_missing_binary_is_a_clean_error(tmp_path: Path) -> None:
    process = PrometheusProcess(tmp_path, "127.0.0.1:9646", binary="no-such-prometheus-binary")
    with pytest.raises(PrometheusError, match="not found") as raised:
        process.start()
    assert "apt-get install prometheus" in raised.value.hint
    assert process.pid is None


ALERTS = prometheus_config_dir() / "rules" / "quantload.alerts.yml"


def test_prometheus_loads_the_alert_rules() -> None:
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    assert "rules/quantload.alerts.yml" in config["rule_files"]
    alerts = yaml.safe_load(ALERTS.read_text())
    names = [rule["alert"] for group in alerts["groups"] for rule in group["rules"]]
    assert names == ["LlamaServerQueueing", "LlamaServerSlotsSaturated", "LlamaServerTTFTOverSLO"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--exporter", "10.0.0.9"], "--exporter"),  # no port
        ([], "no scrape targets"),
        (["--loadgen", "10.0.0.5:9647", "--listen", "nowhere"], "--listen"),
    ],
)
def test_config_prometheus_refuses_bad_targets_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    assert cli_main(["config", "prometheus", "--out", str(tmp_path / "p"), *args]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--exporter", "10.0.0.9:99999"], "bad port '99999'"),
        (["--exporter", "10.0.0.9:abc"], "bad port 'abc'"),
        (["--exporter", "10.0.0.9:9646", "--listen", "127.0.0.1:0"], "has no port"),
        (["--loadgen", "exa mple:9647"], "not a host name or IP address"),
        (["--loadgen", "0.0.0.0:9647"], "not one Prometheus can reach"),
        (["--exporter", "[::1:9646"], "--exporter"),
        (["--exporter", "10.0.0.9:9646", "--scrape-interval", "inf"], "--scrape-interval"),
        (["--exporter", "10.0.0.9:9646", "--scrape-interval", "nan"], "--scrape-interval"),
        (["--exporter", "10.0.0.9:9646", "--scrape-interval", "0.0001"], "at least 0.01 s"),
        (["--exporter", "10.0.0.9:9646", "--scrape-interval", "-1"], "--scrape-interval"),
    ],
)
def test_config_prometheus_refuses_what_prometheus_could_not_use_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    assert cli_main(["config", "prometheus", "--out", str(tmp_path / "p"), *args]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and not (tmp_path / "p").exists()


@pytest.mark.parametrize("out", ["/proc/quantload-prometheus", "FILE"])
def test_config_prometheus_refuses_an_out_it_cannot_write_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str
) -> None:
    if out == "FILE":
        out = str(tmp_path / "a-file")
        Path(out).write_text("x")
    assert cli_main(["config", "prometheus", "--out", out, "--exporter", "10.0.0.9:9646"]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and len(err.strip().splitlines()) == 1, err
