"""prometheus/prometheus.yml, its recording and alert rules, and the configurations
`quantload config prometheus` writes, checked by promtool.

Moved from tests/unit/test_prometheus_config.py, whose other tests start no process.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from quantload.cli.main import main as cli_main
from quantload.observe.prometheus import (
    PrometheusProcess,
    prometheus_config_dir,
)
from support import require_binary

pytestmark = pytest.mark.integration

PROMETHEUS_YML = prometheus_config_dir() / "prometheus.yml"
RULES = prometheus_config_dir() / "rules" / "quantload.rules.yml"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool", "apt-get install -y prometheus")
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)


def test_promtool_accepts_the_config_and_rules() -> None:
    config = _promtool("check", "config", str(PROMETHEUS_YML))
    assert config.returncode == 0, config.stdout + config.stderr
    rules = _promtool("check", "rules", str(RULES))
    assert rules.returncode == 0, rules.stdout + rules.stderr


def test_written_config_passes_promtool(tmp_path: Path) -> None:
    process = PrometheusProcess(tmp_path, "http://127.0.0.1:9646", ["127.0.0.1:9647"], 1.0)
    path = process.write_config(port=9090)
    assert path == tmp_path / "prometheus" / "prometheus.yml"
    result = _promtool("check", "config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


ALERTS = prometheus_config_dir() / "rules" / "quantload.alerts.yml"
ALERTS_TEST = prometheus_config_dir().parent / "prometheus" / "tests" / "quantload.alerts.test.yml"


def test_promtool_accepts_the_alert_rules_and_their_unit_tests_pass() -> None:
    checked = _promtool("check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 3 rules found" in checked.stdout
    tested = _promtool("test", "rules", str(ALERTS_TEST))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_config_prometheus_writes_targets_on_other_hosts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prom"
    code = cli_main([
        "config", "prometheus", "--out", str(out), "--listen", "10.0.0.9:9090",
        "--exporter", "10.0.0.9:9646", "--loadgen", "http://10.0.0.5:9647/metrics",
        "--loadgen", "10.0.0.6:9647", "--scrape-interval", "2",
    ])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "--web.listen-address=10.0.0.9:9090" in printed
    written = yaml.safe_load((out / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in written["scrape_configs"]}
    assert jobs["prometheus"]["static_configs"] == [{"targets": ["10.0.0.9:9090"]}]
    assert jobs["exporter"]["static_configs"] == [{"targets": ["10.0.0.9:9646"]}]
    assert jobs["loadgen"]["static_configs"] == [{"targets": ["10.0.0.5:9647", "10.0.0.6:9647"]}]
    assert "dns_sd_configs" not in jobs["loadgen"]  # compose's discovery has no place off its network
    assert written["global"]["scrape_interval"] == "2s"
    assert (out / "rules" / "quantload.rules.yml").is_file() and (out / "rules" / "quantload.alerts.yml").is_file()
    result = _promtool("check", "config", str(out / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_ipv6_targets_and_listen_addresses_are_written_as_prometheus_takes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prom"
    code = cli_main([
        "config", "prometheus", "--out", str(out), "--listen", "[::]:9090",
        "--exporter", "[fd00::5]:9646", "--loadgen", "http://[::1]:9647/metrics", "--scrape-interval", "0.25",
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "--web.listen-address=[::]:9090" in capsys.readouterr().out
    written = yaml.safe_load((out / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in written["scrape_configs"]}
    assert jobs["prometheus"]["static_configs"] == [{"targets": ["[::1]:9090"]}]  # itself, reachably
    assert jobs["exporter"]["static_configs"] == [{"targets": ["[fd00::5]:9646"]}]
    assert jobs["loadgen"]["static_configs"] == [{"targets": ["[::1]:9647"]}]
    assert written["global"]["scrape_interval"] == "250ms"
    if shutil.which("promtool"):
        result = _promtool("check", "config", str(out / "prometheus.yml"))
        assert result.returncode == 0, result.stdout + result.stderr
