"""The run directory's typed files: what the writers put in run.json, kv.json and config.json reads
back through the same models the report uses, and the report's frame columns follow the load
package's record models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from quantload.analysis.run_data import (
    NUMERIC_RECORD_COLUMNS,
    RECORD_COLUMNS,
    RECORD_FLAGS,
    STAGE_COLUMNS,
    load_run,
    scalar_fields,
)
from quantload.config import load_config
from quantload.kvcache import KvShape, predict_kv
from quantload.kvcheck import kv_check_from_log, merge_kv_file
from quantload.load.records import RequestRecord, StageEvent
from quantload.rundir import CONFIG_JSON, KV_JSON, RUN_JSON, write_json_atomic
from quantload.rundir.config_file import ConfigFile, load_config_file
from quantload.rundir.kv_file import load_kv_file
from quantload.rundir.run_file import load_run_file
from quantload.stack.run_state import RunState

KV_LOG = (
    "llama_kv_cache:        CPU KV buffer size =    32.00 MiB\n"
    "llama_kv_cache: size =   32.00 MiB (  4096 cells,   2 layers,  8/8 seqs), K (f16):   16.00 MiB,"
    " V (f16):   16.00 MiB\n"
    "slot   load_model: id  0 | task -1 | new slot, n_ctx = 4096\n"
)


def test_run_state_writes_what_the_report_reads(tmp_path: Path) -> None:
    state = RunState(tmp_path, "run-1", "full", "tiny", servers_at_once=False)
    first = state.begin("prepare")
    state.end(first, "ok", busy_seconds=1.23456)
    state.skip("quality", None, "no dataset")
    state.server("Q8_0", url="http://127.0.0.1:1", log="server.log", pid=42, status="running")
    state.server("Q8_0", status="died", exit_code=-9)  # later fields update, earlier ones stay
    state.prometheus(True, "http://127.0.0.1:9090", None, "prometheus")
    state.note("servers ran one at a time")
    state.begin("load", "Q8_0")
    state.finish("interrupted")

    written = json.loads((tmp_path / RUN_JSON).read_text())
    assert written == state.data and written["schema"] == "quantload.run/1"
    run = load_run_file(tmp_path / RUN_JSON)
    assert (run.run_id, run.status, run.profile, run.model, run.servers_at_once) == (
        "run-1", "interrupted", "full", "tiny", False,
    )  # fmt: skip
    assert [(s.name, s.quant, s.status) for s in run.steps] == [
        ("prepare", None, "ok"), ("quality", None, "skipped"), ("load", "Q8_0", "failed"),
    ]  # fmt: skip
    assert (
        run.steps[0].busy_seconds == 1.235
        and run.steps[2].error == "run ended (interrupted) before the step did"
    )
    server = run.servers["Q8_0"]
    assert (server.url, server.pid, server.status, server.exit_code) == ("http://127.0.0.1:1", 42, "died", -9)
    assert run.prometheus is not None and run.prometheus.data_dir == "prometheus"
    assert run.notes == ["servers ran one at a time"] and state.status == "interrupted"
    assert (
        load_run(tmp_path).step_why("quality", None, "quality.json")
        == "the quality step was skipped: no dataset"
    )


def test_run_state_refuses_a_server_field_run_json_does_not_have(tmp_path: Path) -> None:
    state = RunState(tmp_path, "run-1", "full", "tiny", servers_at_once=True)
    with pytest.raises(TypeError, match="adress"):
        state.server("F16", adress="http://x")


def test_kv_json_keeps_every_factor_a_check_has(tmp_path: Path) -> None:
    check = kv_check_from_log(predict_kv(KvShape(2, (2, 2), 64, 64, 32768, "test"), 8, 4096), KV_LOG, None)
    merge_kv_file(tmp_path / KV_JSON, "Q8_0", check, {"origin": "cache"})
    merge_kv_file(tmp_path / KV_JSON, "F16", "llama-server did not start")
    payload = json.loads((tmp_path / KV_JSON).read_text())
    assert payload["results"]["Q8_0"] == check.as_dict()  # no key of the check is dropped by the model
    assert payload["results"]["F16"] == {"error": "llama-server did not start"}
    assert payload["llama_cpp"] == {"origin": "cache"}
    kv = load_kv_file(tmp_path / KV_JSON)
    assert kv.to_json() == payload
    result = kv.results["Q8_0"]
    assert result.reported_mib == 32.0 and result.diff_pct == 0.0 and result.reported_lines is not None
    assert result.reported_lines[0].cells == 4096 and kv.results["F16"].predicted_mib is None


def test_config_json_reads_back_as_the_same_settings(tmp_path: Path) -> None:
    config = load_config(tmp_path, {"QUANTLOAD_OBSERVE__GRAFANA_PASSWORD": "hunter2"}, {"run.profile": "ci"})
    write_json_atomic(tmp_path / CONFIG_JSON, ConfigFile.of(config).to_json())
    text = (tmp_path / CONFIG_JSON).read_text()
    assert "hunter2" not in text
    read = load_config_file(tmp_path / CONFIG_JSON)
    assert read.settings.load == config.settings.load and read.settings.run.profile == "ci"
    assert read.sources["load.repeats"] == "profile:ci"
    assert read.settings.observe.grafana_password is not None
    assert read.settings.observe.grafana_password.get_secret_value() == "**********"


def test_frame_columns_follow_the_record_models() -> None:
    for model, columns in ((RequestRecord, RECORD_COLUMNS), (StageEvent, STAGE_COLUMNS)):
        kept = set(model.model_fields) - {"schema_"}
        lists_and_objects = {name for name in kept if name not in scalar_fields(model)}
        assert set(columns) >= kept - lists_and_objects
        assert not set(columns) & lists_and_objects
    assert {"itl_s", "timings"} <= set(RequestRecord.model_fields) - set(RECORD_COLUMNS)
    assert {"end_unix_s", "prompt_ms", "cache_n"} <= set(NUMERIC_RECORD_COLUMNS) <= set(RECORD_COLUMNS)
    assert set(RECORD_FLAGS) == {"warmup", "cache_prompt", "ok", "within_deadline"}

    class Later(BaseModel):  # a field added to a record model becomes a column by itself
        queue_s: float | None = None
        tags: list[str] = []
        kind: str = "x"

    assert scalar_fields(Later) == ("queue_s", "kind")
