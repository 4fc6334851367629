"""The run directory: one folder per run, self-describing, so a report can be rebuilt from it alone.

Every file name of a run directory is defined here. Layout (`results/<run-id>/`), with the model
each file is read and written through:
  config.json          resolved configuration (secrets masked) and its sources (rundir.config_file)
  run.json             run state: steps, servers, Prometheus (rundir.run_file)
  manifest.json        prepared model files (quantload.models.manifest)
  quality.json         perplexity per file, KL divergence from F16 (quantload.quality.results)
  speed.json           llama-bench and roofline per file (quantload.roofline.speed_file)
  kv.json              KV cache predicted vs reported per file (rundir.kv_file)
  gpu.json             each server's GPU offload check and the GPUs' idle baselines (rundir.gpu_file)
  records.jsonl        one line per request (quantload.load.records), appended as they finish
  stages.jsonl         one line per load stage start/end (quantload.load.records)
  summaries.jsonl      one line per load stage: its summary, written when it ends (quantload.load.summary)
  limits.jsonl         one line per finished limit search (quantload.experiments.limit_search_run)
  soak.jsonl           the soak's samples: server memory and KV cells in use over time
                       (quantload.experiments.soak_watch), appended as they are read
  logs/                every child process's log (llama-server-<quant>.log, prometheus.log, ...)
  prometheus/          Prometheus data folder (native mode)
  report.md, report.html, table.csv, summary.json (quantload.analysis.summary_json), plots/*.png
                       what `quantload report` writes
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
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
RECORDS_JSONL = "records.jsonl"
STAGES_JSONL = "stages.jsonl"
LIMITS_JSONL = "limits.jsonl"
SUMMARIES_JSONL = "summaries.jsonl"
SOAK_JSONL = "soak.jsonl"
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
