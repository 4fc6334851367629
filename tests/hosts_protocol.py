"""The whole protocol across hosts, by the commands a user with several machines types.

Hosts (tests/netns_hosts.py), each with its own address, no command given a loopback URL:

  server    a llama-server per quantization (the flags `quantload run` starts them with, listening
            on the server's address), and the measurements of its files: `quantload quality`,
            `quantload speed`, and `quantload kv --from-log` on each server's log
  load1/2   `quantload load-worker --master-host <control>`, each serving /metrics on its address
  control   `quantload load --remote-workers 2` (its Locust master listens on the control
            host's address), then `quantload report --prometheus http://<monitor>:9090`
  monitor   `quantload exporter` over the three servers, and Prometheus with the configuration
            `quantload config prometheus` writes (the exporter and every load process's /metrics)

The run folder is shared (the namespaces share one file system); on real machines it would be
copied to the control host, as the compose docs copy it out of their volume. What `run_protocol`
does, in order, is timed per phase for the benchmark.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netns_hosts import HostNetwork
from quantload.config import Settings, load_config
from quantload.llamacpp.server import ServerSpec
from quantload.llamacpp.toolchain import Toolchain
from quantload.served import server_alias, server_name

HOSTS = ("server", "load1", "load2", "control", "monitor")
LOAD_HOSTS = ("load1", "load2")
QUANTS = ("F16", "Q8_0", "Q4_K_M")
FIRST_SERVER_PORT = 8081
EXPORTER_PORT = 9646
LOADGEN_PORT = 9647
PROMETHEUS_PORT = 9090
MASTER_PORT = 5557
QUANTLOAD = (sys.executable, "-m", "quantload.cli.main")
STEP_TIMEOUT_S = 900.0


def profile_settings(profile: str, tmp: Path) -> Settings:
    """The settings a profile gives (what every host's commands run with)."""
    return load_config(tmp, {"QUANTLOAD_RUN__PROFILE": profile}).settings


@dataclass
class ProtocolRun:
    """What one protocol run left: the run folder, each phase's seconds, and the report's output."""

    run_dir: Path
    seconds: dict[str, float] = field(default_factory=dict)
    outputs: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.run_dir / "summary.json").read_text())
        return data


class Protocol:
    """The protocol across the hosts of `network` (see the module docstring)."""

    def __init__(
        self,
        network: HostNetwork,
        toolchain: Toolchain,
        manifest: Path,
        run_dir: Path,
        profile: str,
        experiments: Sequence[str],
        dataset: Path,
        env: Mapping[str, str],
    ) -> None:
        self.network = network
        self.toolchain = toolchain
        self.manifest = json.loads(manifest.read_text())
        self.manifest_path = manifest
        self.run_dir = run_dir
        self.profile = profile
        self.experiments = list(experiments)
        self.dataset = dataset
        self.env = {**env, "QUANTLOAD_RUN__PROFILE": profile, "PYTHONUNBUFFERED": "1"}
        self.settings = profile_settings(profile, run_dir.parent)
        self.model = str(self.manifest["source"].get("name", "model"))
        self.result = ProtocolRun(run_dir)

    # ------------------------------------------------------------------ addresses

    def address(self, host: str) -> str:
        return self.network[host].address

    def server_url(self, quant: str) -> str:
        return self.network["server"].url(FIRST_SERVER_PORT + QUANTS.index(quant))

    @property
    def prometheus_url(self) -> str:
        return self.network["monitor"].url(PROMETHEUS_PORT)

    def model_path(self, quant: str) -> Path:
        return self.manifest_path.parent / str(self.manifest["files"][quant]["file"])

    # ------------------------------------------------------------------ running things

    def _run(self, phase: str, host: str, argv: Sequence[str], timeout_s: float = STEP_TIMEOUT_S) -> None:
        started = time.monotonic()
        result = self.network.run(host, argv, timeout_s, env=self.env, cwd=self.run_dir)
        self.result.seconds[phase] = self.result.seconds.get(phase, 0.0) + time.monotonic() - started
        self.result.outputs[phase] = result
        if result.returncode != 0:
            raise AssertionError(
                f"{phase} on {host} exited {result.returncode}: {' '.join(argv[3:])}\n"
                f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
            )

    def _spawn(self, host: str, argv: Sequence[str], log_name: str) -> subprocess.Popen[bytes]:
        return self.network.spawn(host, argv, self.run_dir / "logs" / log_name, env=self.env, cwd=self.run_dir)

    def _timed(self, phase: str, started: float) -> None:
        self.result.seconds[phase] = self.result.seconds.get(phase, 0.0) + time.monotonic() - started

    # ------------------------------------------------------------------ the phases

    def measure_files(self) -> None:
        """Quality and speed of every file, on the host that holds them."""
        files = [str(self.model_path(q)) for q in QUANTS]
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.manifest_path, self.run_dir / "manifest.json")
        quality = [*QUANTLOAD, "quality", *files, "--dataset", str(self.dataset), "--out", "quality.json"]
        self._run("quality", "server", quality)
        self._run("speed", "server", [*QUANTLOAD, "speed", *files, "--out", "speed.json"])

    def start_servers(self) -> None:
        started = time.monotonic()
        server = self.settings.server
        for quant in QUANTS:
            spec = ServerSpec(
                model_path=self.model_path(quant), alias=server_alias(self.model, quant),
                slots=server.slots, ctx_per_slot=server.ctx_per_slot, host=self.address("server"),
                slot_save_path=self.run_dir / "slots",
            )  # fmt: skip
            (self.run_dir / "slots").mkdir(parents=True, exist_ok=True)
            port = FIRST_SERVER_PORT + QUANTS.index(quant)
            self._spawn("server", spec.command(self.toolchain.path("llama-server"), port), f"llama-server-{quant}.log")
        for quant in QUANTS:
            self._wait_ok("control", f"{self.server_url(quant)}/health", 300)
        self._timed("servers", started)

    def start_monitoring(self) -> None:
        started = time.monotonic()
        monitor = self.address("monitor")
        config = self.run_dir / "prometheus-config"
        loadgen = [f"{self.address(h)}:{LOADGEN_PORT}" for h in ("control", *LOAD_HOSTS)]
        self._run("monitoring", "monitor", [
            *QUANTLOAD, "config", "prometheus", "--out", str(config), "--listen", f"{monitor}:{PROMETHEUS_PORT}",
            "--exporter", f"{monitor}:{EXPORTER_PORT}", *[a for address in loadgen for a in ("--loadgen", address)],
        ])  # fmt: skip
        targets = [
            f"{server_name(q)}={self.server_url(q)},quant={q},model={self.model}" for q in QUANTS
        ]
        self._spawn("monitor", [
            *QUANTLOAD, "exporter", "--host", monitor, "--port", str(EXPORTER_PORT),
            *[a for target in targets for a in ("--target", target)],
        ], "exporter.log")  # fmt: skip
        self._spawn("monitor", [
            shutil.which("prometheus") or "prometheus", f"--config.file={config / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.run_dir / 'prometheus' / 'data'}", "--storage.tsdb.retention.time=3650d",
            f"--web.listen-address={monitor}:{PROMETHEUS_PORT}",
        ], "prometheus.log")  # fmt: skip
        self._wait_ok("control", f"{self.prometheus_url}/-/ready", 60)
        self.wait_for_series("count(quantload_target_up == 1)", len(QUANTS), 60)
        self._timed("monitoring", started)

    def start_workers(self) -> None:
        for host in LOAD_HOSTS:
            self._spawn(host, [
                *QUANTLOAD, "load-worker", "--master-host", self.address("control"), "--master-port", str(MASTER_PORT),
                "--metrics-host", self.address(host), "--metrics-port", str(LOADGEN_PORT),
                "--log", str(self.run_dir / "logs" / f"load-worker-{host}.log"),
            ], f"load-worker-{host}.console")  # fmt: skip

    def load(self) -> None:
        argv = [*QUANTLOAD, "load"]
        for quant in QUANTS:
            argv += ["--url", self.server_url(quant), "--name", server_name(quant), "--quant", quant]
        argv += ["--model", self.model, *[a for e in self.experiments for a in ("-e", e)]]
        control = self.address("control")
        argv += [
            "--remote-workers", str(len(LOAD_HOSTS)), "--master-host", control, "--master-port", str(MASTER_PORT),
            "--metrics-host", control, "--metrics-port", str(LOADGEN_PORT),
            "--run-id", self.run_dir.name, "--out", str(self.run_dir),
        ]  # fmt: skip
        self._run("load", "control", argv)

    def check_kv(self) -> None:
        server = self.settings.server
        for quant in QUANTS:
            self._run("kv", "server", [
                *QUANTLOAD, "kv", str(self.model_path(quant)), "--slots", str(server.slots),
                "--ctx-per-slot", str(server.ctx_per_slot), "--label", quant, "--out", "kv.json",
                "--from-log", str(self.run_dir / "logs" / f"llama-server-{quant}.log"),
            ])  # fmt: skip

    def report(self) -> None:
        self._run("report", "control", [*QUANTLOAD, "report", str(self.run_dir), "--prometheus", self.prometheus_url])

    def run(self) -> ProtocolRun:
        """Every phase in order (the caller's network removes what was started)."""
        started = time.monotonic()
        self.measure_files()
        self.start_servers()
        self.start_monitoring()
        self.start_workers()
        self.load()
        self.check_kv()
        self.wait_for_scrapes()
        self.report()
        self._timed("total", started)
        return self.result

    # ------------------------------------------------------------------ looking at Prometheus

    def query(self, expression: str, host: str = "control") -> list[dict[str, Any]]:
        """An instant query of the monitoring host's Prometheus, sent from `host`."""
        from urllib.parse import quote

        body = self.network.get(host, f"{self.prometheus_url}/api/v1/query?query={quote(expression)}")
        result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
        return result

    def wait_for_series(self, expression: str, at_least: float, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.query(expression)
            if found and float(found[0]["value"][1]) >= at_least:
                return
            time.sleep(1.0)
        raise AssertionError(f"Prometheus never had {expression} >= {at_least}")

    def wait_for_scrapes(self) -> None:
        """Two scrape intervals: the last stage's series are in Prometheus before the report."""
        time.sleep(2 * self.settings.observe.scrape_interval_s + 1)

    def _wait_ok(self, host: str, url: str, timeout_s: float) -> None:
        code = (
            "import sys, time, urllib.request\n"
            f"deadline = time.monotonic() + {timeout_s!r}\n"
            "while time.monotonic() < deadline:\n"
            "    try:\n"
            f"        urllib.request.urlopen({url!r}, timeout=3); sys.exit(0)\n"
            "    except Exception:\n"
            "        time.sleep(0.3)\n"
            "sys.exit(1)\n"
        )
        result = self.network.run(host, [sys.executable, "-c", code], timeout_s + 10)
        if result.returncode != 0:
            raise AssertionError(f"{url} did not answer from {host} within {timeout_s:g} s")
