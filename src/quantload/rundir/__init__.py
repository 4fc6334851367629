"""The run directory: one folder per run, self-describing, so a report can be rebuilt from it alone.

Every file and folder name of a run directory is defined here, and `RunPaths` (with its typed
reads and appends, quantload.rundir.handle.RunDir) is the one way code reaches them. Layout
(`results/<run-id>/`), with the module each file is read and written through:
  config.json          resolved configuration (secrets masked) and its sources (rundir.config_file)
  run.json             run state: steps, servers, Prometheus (rundir.run_file)
  manifest.json        prepared model files (quantload.models.manifest)
  quality.json         perplexity per file, KL divergence from F16 (quantload.quality.results)
  speed.json           llama-bench and roofline per file (quantload.roofline.speed_file)
  kv.json              KV cache predicted vs reported per file (rundir.kv_file)
  gpu.json             each server's GPU offload check and the GPUs' idle baselines (rundir.gpu_file)
  costs.json           cost curves fitted to llama-batched-bench rows (quantload.predict.costs); one
                       per model file as costs-<quant>.json where a folder holds several
  predict.json         the capacity predicted from them before any load (quantload.predict.prediction)
  records.jsonl        one line per request (quantload.load.records), appended as they finish
  stages.jsonl         one line per load stage start/end (quantload.load.records)
  summaries.jsonl      one line per load stage: its summary, written when it ends (quantload.load.summary)
  limits.jsonl         one line per finished limit search (quantload.experiments.limit_search_run)
  soak.jsonl           the soak's samples: server memory and KV cells in use over time
                       (quantload.experiments.soak.watch), appended as they are read
  variants.jsonl       one line per server variant the flag experiments and the tune ran
                       (quantload.experiments.variant_file)
  tune.jsonl           a tune's state, appended as it goes, so it resumes (quantload.tune.state_file)
  tune.json            the tune's outcome per quantization (quantload.tune.outcome)
  sensitivity.json     the sensitivity scan (quantload.quality.sensitivity), with
  tensor-types-<BASE>.txt  its proposed mix as a --tensor-type-file, and
  sensitivity-work/    its variants while they are measured (removed when empty)
  load-summary.json    every stage summary of one `quantload load` (quantload.cli.cmd_load)
  load-plans/          each load invocation's plan, <invocation>.json (quantload.load.supervisor)
  slots/               llama-server's --slot-save-path, so a run can erase slots between experiments
  logs/                every child process's log (llama-server-<quant>.log, prometheus.log, ...)
  prometheus/          Prometheus data folder (native mode)
  report.md, report.html, table.csv, summary.json (quantload.analysis.summary_json), plots/*.png
                       what `quantload report` writes (into the run directory unless --out says)
A folder of prepared model files in the cache keeps the same manifest.json and logs/. Files that
are not in a run directory are named by the module that writes them: the cache's (for instance
quantload.models.prepared, quantload.llamacpp.build), the calibration folder beside the runs
(quantload.load.calibration_file), a comparison's folder (quantload.analysis.compare);
tests/unit/test_rundir_names.py lists each and holds the rest here.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quantload import json_input

CONFIG_JSON = "config.json"
RUN_JSON = "run.json"
MANIFEST_JSON = "manifest.json"
QUALITY_JSON = "quality.json"
SPEED_JSON = "speed.json"
KV_JSON = "kv.json"
GPU_JSON = "gpu.json"
COSTS_JSON = "costs.json"
PREDICT_JSON = "predict.json"
RECORDS_JSONL = "records.jsonl"
STAGES_JSONL = "stages.jsonl"
LIMITS_JSONL = "limits.jsonl"
SUMMARIES_JSONL = "summaries.jsonl"
SOAK_JSONL = "soak.jsonl"
VARIANTS_JSONL = "variants.jsonl"
TUNE_JSONL = "tune.jsonl"
TUNE_JSON = "tune.json"
SENSITIVITY_JSON = "sensitivity.json"
SENSITIVITY_WORK_DIR = "sensitivity-work"
LOAD_SUMMARY_JSON = "load-summary.json"
LOAD_PLANS_DIR = "load-plans"
SLOTS_DIR = "slots"
LOGS_DIR = "logs"
PROMETHEUS_DIR = "prometheus"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
TABLE_CSV = "table.csv"
SUMMARY_JSON = "summary.json"
PLOTS_DIR = "plots"
# The files a run writes before its report; a folder holding none of them is not a run directory.
RUN_FILES: tuple[str, ...] = (
    RUN_JSON,
    CONFIG_JSON,
    MANIFEST_JSON,
    QUALITY_JSON,
    SPEED_JSON,
    KV_JSON,
    RECORDS_JSONL,
)


def plot_file(key: str) -> str:
    """Where a report figure is written, relative to the report's folder: 'plots/<key>.png'."""
    return f"{PLOTS_DIR}/{key}.png"


def tensor_types_file(base_type: str) -> str:
    """The sensitivity scan's proposed mix for `base_type`: 'tensor-types-<BASE>.txt'."""
    return f"tensor-types-{base_type}.txt"


def plan_file(invocation: str) -> str:
    """One load invocation's plan, relative to the run directory: 'load-plans/<invocation>.json'."""
    return f"{LOAD_PLANS_DIR}/{invocation}.json"


@dataclass(frozen=True)
class RunPaths:
    """Where each file of one run directory is (nothing is read or made but `logs`).

    quantload.rundir.handle.RunDir adds the typed reads and appends; this class imports nothing,
    so the Locust processes and the modules quantload.load imports can use it too.
    """

    path: Path

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_JSON

    @property
    def run_file_path(self) -> Path:
        """run.json: the run's state (rundir.run_file)."""
        return self.path / RUN_JSON

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_JSON

    @property
    def quality_path(self) -> Path:
        return self.path / QUALITY_JSON

    @property
    def speed_path(self) -> Path:
        return self.path / SPEED_JSON

    @property
    def kv_path(self) -> Path:
        return self.path / KV_JSON

    @property
    def costs_path(self) -> Path:
        """costs.json: cost curves of one model file (quantload.predict.costs)."""
        return self.path / COSTS_JSON

    def costs_path_of(self, quant: str) -> Path:
        """costs-<quant>.json: the cost curves of one of several model files."""
        stem, _, suffix = COSTS_JSON.rpartition(".")
        return self.path / f"{stem}-{quant}.{suffix}"

    @property
    def predict_path(self) -> Path:
        """predict.json: the capacity predicted before the load (quantload.predict.prediction)."""
        return self.path / PREDICT_JSON

    @property
    def gpu_path(self) -> Path:
        return self.path / GPU_JSON

    @property
    def records_path(self) -> Path:
        return self.path / RECORDS_JSONL

    @property
    def stages_path(self) -> Path:
        return self.path / STAGES_JSONL

    @property
    def summaries_path(self) -> Path:
        return self.path / SUMMARIES_JSONL

    @property
    def limits_path(self) -> Path:
        return self.path / LIMITS_JSONL

    @property
    def soak_path(self) -> Path:
        return self.path / SOAK_JSONL

    @property
    def variants_path(self) -> Path:
        return self.path / VARIANTS_JSONL

    @property
    def tune_state_path(self) -> Path:
        """tune.jsonl: the tune's lines (quantload.tune.state_file)."""
        return self.path / TUNE_JSONL

    @property
    def tune_outcome_path(self) -> Path:
        """tune.json: the tune's outcome per quantization (quantload.tune.outcome)."""
        return self.path / TUNE_JSON

    @property
    def sensitivity_path(self) -> Path:
        return self.path / SENSITIVITY_JSON

    @property
    def sensitivity_work_path(self) -> Path:
        return self.path / SENSITIVITY_WORK_DIR

    def tensor_types_path(self, base_type: str) -> Path:
        return self.path / tensor_types_file(base_type)

    @property
    def load_summary_path(self) -> Path:
        """load-summary.json: the stage summaries of one `quantload load`."""
        return self.path / LOAD_SUMMARY_JSON

    @property
    def plans_path(self) -> Path:
        """The folder of the load plans (load-plans/)."""
        return self.path / LOAD_PLANS_DIR

    def plan_path(self, invocation: str) -> Path:
        """Where the load plan of one invocation is written."""
        return self.path / plan_file(invocation)

    @property
    def slots_path(self) -> Path:
        """llama-server's --slot-save-path."""
        return self.path / SLOTS_DIR

    @property
    def logs_path(self) -> Path:
        """The folder of every child process's log (not made: see `logs`)."""
        return self.path / LOGS_DIR

    @property
    def logs(self) -> Path:
        """The folder of every child process's log (made on first use)."""
        folder = self.logs_path
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def log_path(self, name: str) -> Path:
        """One child process's log, `name` in logs/ (the folder is not made)."""
        return self.logs_path / name

    @property
    def prometheus_path(self) -> Path:
        """Prometheus's data folder (native mode)."""
        return self.path / PROMETHEUS_DIR

    @property
    def report_md_path(self) -> Path:
        return self.path / REPORT_MD

    @property
    def report_html_path(self) -> Path:
        return self.path / REPORT_HTML

    @property
    def table_csv_path(self) -> Path:
        return self.path / TABLE_CSV

    @property
    def summary_path(self) -> Path:
        """summary.json: the report's figures (quantload.analysis.summary_json)."""
        return self.path / SUMMARY_JSON

    @property
    def plots_path(self) -> Path:
        return self.path / PLOTS_DIR

    def plot_path(self, key: str) -> Path:
        """Where the report figure `key` is drawn."""
        return self.path / plot_file(key)

    def holds_run_files(self) -> bool:
        """Whether the folder holds any of RUN_FILES (else it is no run directory)."""
        return any((self.path / name).is_file() for name in RUN_FILES)


def make_run_id(config_json: dict[str, Any], now: datetime | None = None) -> str:
    """UTC timestamp plus a short hash of the resolved configuration."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    digest = hashlib.sha256(json.dumps(config_json, sort_keys=True).encode()).hexdigest()[:8]
    return f"{stamp}-{digest}"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a temporary file of its own and rename it, so a reader never sees half a file,
    whoever else writes the same file at the same time."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file of this writer's own in the same folder, renamed
    over it: a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    partial = Path(name)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    """Parse a JSON file; ValueError (json_input.JsonInputError) for text that is not JSON within
    the bounds every reader keeps (nested too deep, not UTF-8)."""
    return json_input.loads(path.read_bytes())
