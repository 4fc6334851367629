"""Native mode's Prometheus: the `prometheus` binary on loopback, data inside the run directory (the
report also starts one on a copy of a run's saved data to read it again).

The configuration is the repository's `prometheus/prometheus.yml` with only the scrape addresses
changed (and the scrape interval, when configured): the exporter, the load generator's processes
and Prometheus itself. The rule files are copied beside it. Layout inside the run directory:

  prometheus/prometheus.yml, prometheus/rules/*.yml   the configuration actually used
  prometheus/data/                                    the TSDB (kept, so a report can re-read it)
  logs/prometheus.log                                 what the binary printed
"""

from __future__ import annotations

import contextlib
import math
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from quantload.assets import asset_dir
from quantload.childproc import LoggedProcess
from quantload.errors import QuantloadError
from quantload.llamacpp.server import free_port
from quantload.rundir.handle import RunDir
from quantload.urls import BadUrl, host_port

EXPORTER_JOB = "exporter"
LOADGEN_JOB = "loadgen"
SELF_JOB = "prometheus"
RETENTION = "3650d"  # keep a run's data: the report may read it again much later
PORT_ATTEMPTS = 3
READY_POLL_S = 0.2


def prometheus_config_dir() -> Path:
    """The prometheus/ folder (prometheus.yml and rules/) that compose and native mode share."""
    return asset_dir("prometheus")


class PrometheusError(QuantloadError):
    """Prometheus is missing, would not start, or its configuration cannot be written."""


MIN_SCRAPE_INTERVAL_S = 0.01  # Prometheus' durations count whole milliseconds


def scrape_address(url_or_address: str) -> str:
    """`http://127.0.0.1:9646/metrics` or `127.0.0.1:9646` -> `127.0.0.1:9646`, as a Prometheus
    target (`[::1]:9646` for an IPv6 host: quantload.urls.host_port); PrometheusError naming what
    is wrong, or a host that only says where a process listens (0.0.0.0)."""
    try:
        address = host_port(url_or_address)
    except BadUrl as error:
        raise PrometheusError(str(error)) from None
    if address.unspecified:
        raise PrometheusError(
            f"{url_or_address!r} names every address of a host (where a process listens), not one"
            " Prometheus can reach: give the host's own address"
        )
    return address.address


def prometheus_duration(value_s: float) -> str:
    """`value_s` as Prometheus writes a duration: whole seconds (`2s`) or milliseconds (`250ms`)."""
    if not math.isfinite(value_s) or value_s < MIN_SCRAPE_INTERVAL_S:
        raise PrometheusError(
            f"a scrape interval of {value_s:g} s cannot be written for Prometheus (at least"
            f" {MIN_SCRAPE_INTERVAL_S:g} s, a finite number)"
        )
    millis = round(value_s * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"



def native_config(
    template: dict[str, Any],
    addresses: dict[str, list[str]],
    scrape_interval_s: float | None = None,
) -> dict[str, Any]:
    """The template with each job's targets replaced by `addresses[job]` (static only).

    A job with no addresses is dropped; a job the template lacks is an error.
    """
    config = dict(template)
    jobs = {job["job_name"]: job for job in config.get("scrape_configs", [])}
    unknown = set(addresses) - set(jobs)
    if unknown:
        raise PrometheusError(f"prometheus.yml has no job {sorted(unknown)}")
    scrape_configs = []
    for name, job in jobs.items():
        targets = addresses.get(name, [])
        if not targets:
            continue
        kept = {k: v for k, v in job.items() if not k.endswith("_sd_configs")}
        kept["static_configs"] = [{"targets": list(targets)}]
        scrape_configs.append(kept)
    config["scrape_configs"] = scrape_configs
    if scrape_interval_s is not None:
        interval = prometheus_duration(scrape_interval_s)
        config["global"] = {
            **config.get("global", {}),
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        }
    return config


def find_prometheus(binary: str) -> Path:
    """The Prometheus executable, or PrometheusError saying how to install it."""
    found = shutil.which(binary)
    if found is None:
        raise PrometheusError(
            f"the Prometheus binary {binary!r} was not found",
            "install it (Debian/Ubuntu: apt-get install prometheus; macOS: brew install "
            "prometheus) or set observe.prometheus_binary",
        )
    return Path(found)


def prometheus_missing(binary: str) -> str | None:
    """Why Prometheus cannot be used (the binary is not installed), or None when it can."""
    if shutil.which(binary) is not None:
        return None
    return (
        f"the '{binary}' binary is not installed (Debian/Ubuntu: apt-get install prometheus;"
        " macOS: brew install prometheus)"
    )


def write_prometheus_config(
    folder: Path,
    addresses: dict[str, list[str]],
    scrape_interval_s: float | None = None,
    config_dir: Path | None = None,
) -> Path:
    """The repository's prometheus.yml with each job's targets replaced by `addresses[job]`
    (`native_config`), written with its rule files into `folder`; returns the yml path."""
    source = config_dir if config_dir is not None else prometheus_config_dir()
    template_path = source / "prometheus.yml"
    try:
        template = yaml.safe_load(template_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise PrometheusError(
            f"cannot read {template_path}: {error}", "run from a quantload checkout"
        ) from None
    config = native_config(template, addresses, scrape_interval_s)
    path = folder / "prometheus.yml"
    header = f"# Written by quantload from {template_path}; only addresses differ.\n"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for rule_file in template.get("rule_files", []):
            target = folder / rule_file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / rule_file, target)
        path.write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    except OSError as error:
        raise PrometheusError(
            f"cannot write the Prometheus configuration into {folder}: {error.strerror or error}"
            f" ({error.filename or folder})",
            "give a folder you can write to",
        ) from None
    return path


class PrometheusProcess(LoggedProcess):
    """A Prometheus server for one run. Use as a context manager, or start() and stop()."""

    def __init__(
        self,
        run_dir: Path,
        exporter_url: str | None,
        loadgen_urls: Sequence[str] = (),
        scrape_interval_s: float | None = None,
        *,
        binary: str = "prometheus",
        port: int = 0,
        host: str = "127.0.0.1",
        config_dir: Path | None = None,
        startup_timeout_s: float = 30.0,
    ) -> None:
        self.run_dir = run_dir
        self.exporter_url = exporter_url
        self.loadgen_urls = list(loadgen_urls)
        self.scrape_interval_s = scrape_interval_s
        self.binary = binary
        self.host = host
        self.wanted_port = port
        self.config_dir = config_dir if config_dir is not None else prometheus_config_dir()
        self.startup_timeout_s = startup_timeout_s
        self.port = 0
        super().__init__(RunDir(run_dir).log_path("prometheus.log"))

    @property
    def folder(self) -> Path:
        return RunDir(self.run_dir).prometheus_path

    @property
    def url(self) -> str:
        """Base URL of the HTTP API, e.g. http://127.0.0.1:40123."""
        return f"http://{self.host}:{self.port}"

    def write_config(self, port: int) -> Path:
        """Write prometheus.yml and its rule files into the run directory; return the yml path."""
        addresses = {
            SELF_JOB: [f"{self.host}:{port}"],
            EXPORTER_JOB: [scrape_address(self.exporter_url)] if self.exporter_url else [],
            LOADGEN_JOB: [scrape_address(url) for url in self.loadgen_urls],
        }
        return write_prometheus_config(self.folder, addresses, self.scrape_interval_s, self.config_dir)

    def start(self) -> PrometheusProcess:
        """Write the configuration, launch Prometheus and wait until it is ready."""
        binary = find_prometheus(self.binary)
        for attempt in range(PORT_ATTEMPTS):
            self.port = self.wanted_port if self.wanted_port else free_port(self.host)
            self._launch(binary, self.write_config(self.port))
            if self.wait_http_ok(f"{self.url}/-/ready", self.startup_timeout_s):
                return self
            self.stop()
            in_use = "address already in use" in self.log_text().lower()
            if not in_use or self.wanted_port or attempt == PORT_ATTEMPTS - 1:
                break
        raise PrometheusError(
            f"Prometheus did not become ready on {self.url}: {self.log_tail()}",
            f"full log in {self.log_path}",
        )

    def _launch(self, binary: Path, config_path: Path) -> None:
        command = [
            str(binary),
            f"--config.file={config_path}",
            f"--storage.tsdb.path={self.folder / 'data'}",
            f"--storage.tsdb.retention.time={RETENTION}",
            f"--web.listen-address={self.host}:{self.port}",
        ]
        self.launch(command)

    def wait_for_series(self, selector: str, timeout_s: float = 20.0) -> bool:
        """Wait until an instant query of `selector` returns a series (e.g. a new exporter target
        has been scraped once); True when it did, False on timeout."""
        return self._poll_api(
            "/api/v1/query", {"query": selector}, lambda data: bool(data["result"]), timeout_s
        )

    def wait_scraping(self, timeout_s: float = 20.0) -> bool:
        """Wait until every configured target has been scraped once (Prometheus hands new targets
        to its scrapers up to 5 s after start); True when they were, False on timeout."""

        def all_scraped(data: Any) -> bool:
            active = data["activeTargets"]
            return bool(active) and all(t.get("health") != "unknown" for t in active)

        return self._poll_api("/api/v1/targets", {}, all_scraped, timeout_s)

    def _poll_api(
        self, path: str, params: dict[str, str], ready: Callable[[Any], bool], timeout_s: float
    ) -> bool:
        """Poll an API path until `ready(body["data"])`; False if time runs out or Prometheus exits."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline and self.alive():
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    if ready(client.get(f"{self.url}{path}", params=params).json()["data"]):
                        return True
                time.sleep(READY_POLL_S)
        return False
