"""Finding a Prometheus that holds the run's metrics.

In order: the URL given (`--prometheus`), the run's own Prometheus (run.json), and, when neither
answers with the run's data, a Prometheus started here on a copy of the TSDB the run saved in its
folder (native mode keeps `prometheus/data`). When none works, the report's Prometheus sections
become "not measured" notes saying why and how to get them.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from quantload.analysis.run_data import Gap, RunData
from quantload.observe.prometheus import PrometheusError, PrometheusProcess
from quantload.observe.promql import PrometheusClient, PrometheusQueryError
from quantload.rundir.handle import RunDir

RUN_METRICS = '{__name__=~"quantload_.+|llamacpp_.+"}'
PROMETHEUS_HOW = (
    "install Prometheus (Debian/Ubuntu: apt-get install prometheus; macOS: brew install prometheus) "
    "so the next run records server metrics, or pass --prometheus URL of a Prometheus holding this run"
)
PROMETHEUS_HOW_INSTALLED = "pass --prometheus URL of a Prometheus holding this run"


def prometheus_how(binary: str = "prometheus") -> str:
    """How to get the Prometheus sections: install it only where it is not installed."""
    return PROMETHEUS_HOW if shutil.which(binary) is None else PROMETHEUS_HOW_INSTALLED


@dataclass(frozen=True)
class TimeWindow:
    """The part of the run the Prometheus sections look at (unix seconds)."""

    start_unix_s: float
    end_unix_s: float

    @property
    def length_s(self) -> float:
        return self.end_unix_s - self.start_unix_s


@dataclass
class PromConnection:
    """A client with the run's data, where it came from; or None and why not."""

    client: PrometheusClient | None
    origin: str
    why_not: list[str] = field(default_factory=list)
    how: str = PROMETHEUS_HOW  # how to get the sections it could not give

    def gap(self, what: str) -> Gap:
        """The note for a section that needs Prometheus."""
        return Gap("prometheus", what, "; ".join(self.why_not) or "no Prometheus", self.how)


def _has_run_data(client: PrometheusClient, window: TimeWindow) -> bool:
    span_ms = max(1000, round(window.length_s * 1000))
    series = client.query(f"count(last_over_time({RUN_METRICS}[{span_ms}ms]))", at=window.end_unix_s)
    return any(s.has_number() and s.values()[-1] > 0 for s in series)


def _try(url: str, window: TimeWindow, label: str, why_not: list[str]) -> PrometheusClient | None:
    client = PrometheusClient(url, timeout_s=10.0)
    try:
        if _has_run_data(client, window):
            return client
        why_not.append(f"{label} at {url} answers but holds no quantload metrics of this run's time")
    except PrometheusQueryError as error:
        why_not.append(f"{label} at {url} is not usable ({error.problem})")
    client.close()
    return None


def _tsdb(run: RunData) -> Path | None:
    """The saved TSDB folder (the one holding `wal/`), if the run kept one."""
    recorded = run.state.prometheus if run.state is not None else None
    bases = [RunDir(run.run_dir).prometheus_path]
    if recorded is not None and recorded.data_dir:
        bases.append(Path(recorded.data_dir))
    for base in bases:
        for candidate in (base / "data", base):
            if (candidate / "wal").is_dir():
                return candidate
    return None


def _shown(tsdb: Path, run_dir: Path) -> str:
    """The data folder as a report shows it: relative to the run folder when inside it, so a
    report stays true when the run folder is moved or shared."""
    try:
        return f"{tsdb.resolve().relative_to(run_dir.resolve())} in the run folder"
    except ValueError:
        return str(tsdb)


@contextlib.contextmanager
def _replay(
    tsdb: Path, shown: str, binary: str, window: TimeWindow, why_not: list[str]
) -> Iterator[PrometheusClient | None]:
    with tempfile.TemporaryDirectory(prefix="quantload-report-prometheus-") as scratch:
        work = Path(scratch)
        # laid out as a run directory's, where the PrometheusProcess below looks for its data
        data = RunDir(work).prometheus_path / "data"
        shutil.copytree(tsdb, data, ignore=shutil.ignore_patterns("lock"))
        process = PrometheusProcess(work, None, (), binary=binary, startup_timeout_s=60.0)
        try:
            process.start()
        except PrometheusError as error:
            why_not.append(f"a Prometheus on the saved data ({shown}) did not start ({error.problem})")
            yield None
            return
        try:
            client = _try(process.url, window, f"the Prometheus replaying {shown}", why_not)
            try:
                yield client
            finally:
                if client is not None:
                    client.close()
        finally:
            process.stop()


@contextlib.contextmanager
def open_prometheus(
    run: RunData, url: str | None, window: TimeWindow | None, binary: str = "prometheus"
) -> Iterator[PromConnection]:
    """A connection to a Prometheus with the run's data (see the module docstring)."""
    why_not: list[str] = []
    if window is None:
        yield PromConnection(None, "", ["the run has no load stages to look at"], how=prometheus_how(binary))
        return
    recorded = run.state.prometheus if run.state is not None else None
    candidates = [(url, "the Prometheus the report was given")] if url else []
    if recorded is not None and recorded.url and recorded.url != url:
        candidates.append((recorded.url, "the run's Prometheus"))
    if recorded is not None and recorded.available is False:
        why_not.append(f"the run had no Prometheus: {recorded.why or 'no reason recorded'}")
    for address, label in candidates:
        client = _try(address, window, label, why_not)
        if client is not None:
            try:
                yield PromConnection(client, f"{label} ({address})")
            finally:
                client.close()
            return
    tsdb = _tsdb(run)
    if tsdb is None:
        why_not.append("the run folder holds no saved Prometheus data (prometheus/data)")
        yield PromConnection(None, "", why_not, how=prometheus_how(binary))
        return
    shown = _shown(tsdb, run.run_dir)
    if shutil.which(binary) is None:
        why_not.append(f"saved data is in {shown} but the '{binary}' binary to read it is not installed")
        yield PromConnection(None, "", why_not)
        return
    with _replay(tsdb, shown, binary, window, why_not) as client:
        origin = f"a Prometheus started by the report on a copy of {shown}"
        yield PromConnection(client, origin if client else "", why_not, how=prometheus_how(binary))
