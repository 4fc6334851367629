"""The kv_types experiment's whole path against fake servers (one per KV-cache type, one type whose
server cannot be had), with real Locust processes.

Moved from tests/unit/load/test_kv_types.py, whose other tests start no process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from load_api import context
from quantload.config import LoadSettings
from quantload.experiments.base import ExperimentContext
from quantload.experiments.kv_types.stages import run as run_kv_types
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.records import iter_records, iter_stage_events
from quantload.load.supervisor import LoadError
from quantload.served import ServedTarget
from variant_fakes import FakeVariants

pytestmark = pytest.mark.integration

TARGET = ServedTarget(name="llama-q8_0", quant="Q8_0", model="m", url="http://127.0.0.1:1")
SCRIPT = FakeScript(ttft_ms=(2, 5), itl_ms=(1, 2), tokens=6, close_after_stream=True)


def load_settings(**changes: object) -> LoadSettings:
    base: dict[str, object] = dict(
        warmup_requests=1, request_timeout_s=10, first_round_jitter_s=0.01, metrics_port=0,
        stage_timeout_s=60, max_tokens=99,
    )  # fmt: skip
    base.update(changes)
    return LoadSettings.model_validate(base)




@pytest.mark.slow
def test_every_cache_type_gets_its_stage_and_a_missing_server_fails_after_the_others(tmp_path: Path) -> None:
    servers = FakeVariants(
        refused=lambda flags: flags.cache_type == "q4_0", name=lambda flags: f"llama-q8_0-{flags.label}"
    )
    run = context(tmp_path, load_settings(), kv_types={"users": 2, "requests": 4, "max_tokens": 6},
                  quality={"kld_cache_types": ["f16", "q4_0", "q8_0"]})  # fmt: skip
    with FakeServer(SCRIPT) as own:  # the quantization's own server serves its own cache type, f16
        target = TARGET.model_copy(update={"url": own.url})
        with pytest.raises(LoadError, match=r"measured 2 of 3 KV-cache types; q4_0: llama-server with kv-q4_0"):
            run_kv_types(ExperimentContext(run, target, servers))
    assert [flags.cache_type for flags in servers.served] == ["q8_0"]
    ends = [e for e in iter_stage_events(tmp_path / "stages.jsonl") if e.event == "stage_end"]
    assert [(e.kv_cache_type, e.status, e.requests_done, e.stage_users) for e in ends] == [
        ("f16", "ok", 4, 2), ("q8_0", "ok", 4, 2),
    ]
    measured = [r for r in iter_records(tmp_path / "records.jsonl") if not r.warmup]
    assert len(measured) == 8 and all(r.experiment == "kv_types" and r.ok for r in measured)
    assert all((r.max_tokens, r.ignore_eos, r.cache_prompt) == (6, True, False) for r in measured)
    assert {r.server for r in measured} == {"llama-q8_0", "llama-q8_0-kv-q8_0"}
    kv = json.loads((tmp_path / "kv.json").read_text())
    assert kv["cache_types"]["Q8_0"]["q8_0"]["error"] == "the fake logs no KV line"
