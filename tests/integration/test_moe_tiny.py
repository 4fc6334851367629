"""The tiny mixture of experts through the real tools: written, quantized (a mix that keeps the
experts at Q4_K and the attention at Q8_0 among them), its KV cache predicted to the llama-server's
own figure, served by llama-server and loaded."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from load_api import experiment
from quantload.config import LoadSettings, MixSettings, PrepareSettings, ToolchainSettings
from quantload.kvcache import kv_shape_from_gguf, predict_kv
from quantload.kvcheck import kv_check_with_server
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.toolchain import Toolchain, ensure_llama_source
from quantload.models.gguf_meta import read_gguf
from quantload.models.gguf_scan import scan_gguf
from quantload.models.manifest import Manifest
from quantload.models.prepare import prepare_models
from quantload.paths import cache_root
from quantload.served import ServedTarget

pytestmark = pytest.mark.integration
MIX = "experts-q4k-attn-q8"
Q4_K, Q8_0, F32 = 12, 8, 0  # ggml_type ids


@pytest.fixture(scope="module")
def tiny_moe(toolchain: Toolchain, tmp_path_factory: pytest.TempPathFactory) -> tuple[Manifest, Path]:
    out = tmp_path_factory.mktemp("tiny-moe")
    prepare = PrepareSettings(
        quants=("F16", "Q4_K_M"),
        mixes=(MixSettings(name=MIX, base="Q4_K_M", tensor_types=("_exps=q4_k", "attn_=q8_0")),),
    )
    manifest = prepare_models(
        "tiny-moe", out, toolchain, cache_root(None, os.environ), os.environ,
        functools.partial(ensure_llama_source, ToolchainSettings(), os.environ), prepare=prepare,
    )  # fmt: skip
    return manifest, out


def test_the_tiny_moe_is_prepared_with_its_active_parameters_and_a_mix(tiny_moe: tuple[Manifest, Path]) -> None:
    manifest, out = tiny_moe
    assert list(manifest.files) == ["F16", MIX, "Q4_K_M"]  # largest first
    for entry in manifest.files.values():
        assert entry.architecture == "qwen3moe" and entry.moe is not None
        assert entry.moe["expert_count"] == 4 and entry.moe["expert_used_count"] == 2
        assert entry.moe["total_params"] == entry.n_params
        expert = entry.moe["expert_params"]
        assert entry.moe["active_params"] == entry.n_params - expert // 2
    mix = manifest.files[MIX]
    assert mix.recipe == "Q4_K_M --tensor-type _exps=q4_k --tensor-type attn_=q8_0"
    tensors = scan_gguf(out / mix.file).tensors
    experts = {t.type_id for name, t in tensors.items() if "_exps." in name}
    attention = {t.type_id for name, t in tensors.items() if name.endswith(("attn_q.weight", "attn_k.weight",
                                                                          "attn_v.weight", "attn_output.weight"))}
    assert experts == {Q4_K} and attention == {Q8_0}
    assert {t.type_id for name, t in tensors.items() if "ffn_gate_inp" in name} == {F32}  # the router stays
    plain = scan_gguf(out / manifest.files["Q4_K_M"].file).tensors
    assert manifest.files[MIX].size_bytes > manifest.files["Q4_K_M"].size_bytes  # the attention costs bytes
    assert plain["blk.0.attn_q.weight"].type_id == Q4_K  # Q4_K_M alone leaves the attention at 4 bits


def test_the_kv_prediction_of_the_moe_is_the_servers_own_figure(
    tiny_moe: tuple[Manifest, Path], toolchain: Toolchain, tmp_path: Path
) -> None:
    manifest, out = tiny_moe
    model = out / manifest.files[MIX].file
    prediction = predict_kv(kv_shape_from_gguf(read_gguf(model)), 3, 900, "f16", "f16")
    spec = ServerSpec(model, "tiny-moe", slots=3, ctx_per_slot=900)
    check = kv_check_with_server(toolchain, spec, prediction, tmp_path / "server.log", 120)
    assert check.reported_mib == check.predicted_mib and check.diff_pct == 0.0


def test_the_mix_is_served_and_loaded(tiny_moe: tuple[Manifest, Path], toolchain: Toolchain, tmp_path: Path) -> None:
    manifest, out = tiny_moe
    spec = ServerSpec(out / manifest.files[MIX].file, "tiny-moe", slots=2, ctx_per_slot=1024, threads=1)
    load = LoadSettings(
        users=(1, 2), repeats=1, prompt_count=4, max_prompt_tokens=120, max_tokens=8, ignore_eos=True,
        warmup_requests=1, request_timeout_s=60, stage_timeout_s=120, metrics_port=0,
    )  # fmt: skip
    with LlamaServer(toolchain, spec, tmp_path / "llama-server.log", startup_timeout_s=120) as server:
        target = ServedTarget(name="tiny-moe", quant=MIX, model="tiny-qwen3moe", url=server.url)
        summaries = experiment("sweep", target, load, tmp_path, "moe-sweep")
    # a level sends at least its planned requests, more while its verdict is undecided
    assert [(s.users, s.status, s.failed) for s in summaries] == [(1, "ok", 0), (2, "ok", 0)]
    assert all(s.ok >= 4 for s in summaries), [s.ok for s in summaries]
    assert all(s.output_tok_s and s.output_tokens == s.ok * 8 for s in summaries)  # 8 tokens each, eos ignored
