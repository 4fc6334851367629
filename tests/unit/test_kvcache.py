from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantload.errors import ModelError
from quantload.kvcache import KvShape, kv_shape_from_hf_config, pad_cells, predict_kv
from quantload.llamacpp.server_log import parse_flash_attention, parse_kv_sizes, parse_slot_layout

QWEN25_05B_CONFIG = {  # published hyperparameters of Qwen2.5-0.5B-Instruct
    "hidden_size": 896,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "num_hidden_layers": 24,
    "max_position_embeddings": 32768,
}


def test_qwen25_05b_full_protocol_layout_is_384_mib() -> None:
    shape = kv_shape_from_hf_config(QWEN25_05B_CONFIG)
    assert shape.bytes_per_token_f16 == 12_288
    prediction = predict_kv(shape, slots=8, ctx_per_slot=4096)
    assert f"{prediction.total_mib:.2f}" == "384.00"
    assert prediction.n_stream == 8 and prediction.cells_per_stream == 4096


def test_single_slot_4096_is_48_mib() -> None:
    shape = kv_shape_from_hf_config(QWEN25_05B_CONFIG)
    assert f"{predict_kv(shape, 1, 4096).total_mib:.2f}" == "48.00"


def test_padding_and_streams() -> None:
    shape = KvShape(2, (2, 2), 64, 64, 32768, "test")
    assert pad_cells(1000) == 1024 and pad_cells(1024) == 1024
    split = predict_kv(shape, slots=3, ctx_per_slot=1000)  # n_ctx 3000 -> 3072 -> 1024 per stream
    assert (split.n_ctx, split.cells_per_stream, split.n_stream) == (3072, 1024, 3)
    unified = predict_kv(shape, slots=3, ctx_per_slot=1000, unified=True)
    assert (unified.cells_per_stream, unified.n_stream) == (3072, 1)


@pytest.mark.parametrize(("cache_type", "bytes_per_32"), [("f16", 64), ("q8_0", 34), ("q4_0", 18), ("f32", 128)])
def test_quantized_cache_types_count_blocks(cache_type: str, bytes_per_32: int) -> None:
    shape = KvShape(1, (1,), 32, 32, 4096, "test")
    prediction = predict_kv(shape, 1, 256, cache_type, cache_type)
    assert prediction.k_bytes == 256 * bytes_per_32


def test_block_misaligned_head_is_refused() -> None:
    shape = KvShape(1, (1,), 48, 48, 4096, "test")
    with pytest.raises(ModelError, match="not a multiple"):
        predict_kv(shape, 1, 256, "q4_0", "q4_0")


def test_hf_config_missing_key() -> None:
    with pytest.raises(ModelError, match="lacks"):
        kv_shape_from_hf_config({"hidden_size": 896})


LOG = """0.00.013.323 I cmn  common_param: common_params_print_info: build 6912 (a1b2c3d) with GNU 12.2.0 for Linux x86_64
0.01.422.440 I llama_kv_cache:        CPU KV buffer size =    32.00 MiB
0.01.422.441 I llama_kv_cache: size =   32.00 MiB (  4096 cells,   2 layers,  8/8 seqs), K (f16):   16.00 MiB, V (f16):   16.00 MiB
0.01.500.000 I srv  load_model: initializing, n_slots = 8, n_ctx_slot = 4096, kv_unified = 'false'
"""


def test_parse_server_log() -> None:
    (line,) = parse_kv_sizes(LOG)
    assert (line.total_mib, line.cells, line.layers, line.seqs, line.type_k, line.v_mib) == (
        32.0, 4096, 2, 8, "f16", 16.0,
    )
    layout = parse_slot_layout(LOG)
    assert layout is not None and layout.n_ctx_slot == 4096 and not layout.kv_unified
    assert parse_kv_sizes("nothing here") == []


def test_kv_json_merges_entries(tmp_path: Path) -> None:
    from quantload.kvcheck import kv_check_from_log, merge_kv_file

    shape = KvShape(2, (2, 2), 64, 64, 32768, "test")
    check = kv_check_from_log(predict_kv(shape, 8, 4096), LOG, None)
    out = tmp_path / "kv.json"
    merge_kv_file(out, "Q8_0", check, {"origin": "cache", "binary_version": "version: 1"})
    merge_kv_file(out, "F16", "the server died")  # a later merge without a toolchain keeps the record
    data = json.loads(out.read_text())
    assert data["schema"] == "quantload.kv/1"
    assert data["llama_cpp"] == {"origin": "cache", "binary_version": "version: 1"}
    assert data["results"]["Q8_0"]["diff_pct"] == 0.0
    assert data["results"]["Q8_0"]["server_build"] == "6912 (a1b2c3d) with GNU 12.2.0 for Linux x86_64"
    assert data["results"]["F16"] == {"error": "the server died"}


def test_the_kv_types_servers_are_filed_apart_and_every_merge_keeps_the_rest(tmp_path: Path) -> None:
    from quantload.kvcheck import kv_check_from_log, merge_kv_cache_type, merge_kv_file

    shape = KvShape(2, (2, 2), 64, 64, 32768, "test")
    out = tmp_path / "kv.json"
    merge_kv_file(out, "Q8_0", kv_check_from_log(predict_kv(shape, 8, 4096), LOG, None), {"origin": "cache"})
    q8_log = LOG.replace("K (f16):   16.00 MiB, V (f16):   16.00 MiB", "K (q8_0):    8.50 MiB, V (q8_0):    8.50 MiB")
    q8_log = q8_log.replace("size =   32.00 MiB", "size =   17.00 MiB")
    q8 = kv_check_from_log(predict_kv(shape, 8, 4096, "q8_0", "q8_0"), q8_log, None)
    merge_kv_cache_type(out, "Q8_0", "q8_0", q8)
    merge_kv_cache_type(out, "Q8_0", "q4_0", "llama-server did not become ready")
    merge_kv_file(out, "F16", "the server died")  # the main entries' writer keeps cache_types
    data = json.loads(out.read_text())
    assert sorted(data["results"]) == ["F16", "Q8_0"] and data["llama_cpp"] == {"origin": "cache"}
    assert data["cache_types"]["Q8_0"]["q8_0"]["diff_pct"] == 0.0
    assert data["cache_types"]["Q8_0"]["q8_0"]["reported_mib"] == 17.0
    assert data["cache_types"]["Q8_0"]["q4_0"] == {"error": "llama-server did not become ready"}


def test_flash_attention_as_asked_or_as_auto_resolved() -> None:
    asked = "I llama_context: flash_attn            = {}\n"
    assert parse_flash_attention(asked.format("enabled")) == "enabled"
    assert parse_flash_attention(asked.format("disabled")) == "disabled"
    auto = asked.format("auto")
    assert parse_flash_attention(auto + "I resolve_fused_ops: Flash Attention enabled\n") == "enabled"
    assert parse_flash_attention(auto + "W resolve_fused_ops: Flash Attention not supported, set to disabled") == (
        "disabled"
    )
    assert parse_flash_attention(auto) is None and parse_flash_attention(LOG) is None


def test_formula_names_every_factor_with_the_type_sizes() -> None:
    shape = KvShape(n_layer=2, n_head_kv=(2, 2), head_dim_k=64, head_dim_v=64, n_ctx_train=0, source="test")
    prediction = predict_kv(shape, slots=8, ctx_per_slot=4096, cache_type_k="q8_0", cache_type_v="f16")
    expected_bytes = 2 * 8 * 4096 * 2 * (64 * 34 // 32 + 64 * 2)
    assert prediction.total_bytes == expected_bytes
    text = prediction.formula()
    for part in ("layers 2", "streams 8", "cells 4096", "KV heads 2", "head dim K 64 x q8_0 [34 B per 32 elements]",
                 "head dim V 64 x f16 [2 B/element]", f"{expected_bytes:,} bytes"):  # fmt: skip
        assert part in text
    assert prediction.as_dict()["type_size_k"] == "34 B per 32 elements"


def test_an_unchecked_prediction_has_the_checked_shape() -> None:
    from quantload.kvcheck import kv_check_from_log, unchecked_dict

    prediction = predict_kv(KvShape(2, (2, 2), 64, 64, 32768, "test"), 8, 4096)
    checked = kv_check_from_log(prediction, LOG, None).as_dict()
    unchecked = unchecked_dict(prediction)
    assert set(unchecked) == set(checked)
    assert unchecked["diff_pct"] is None and unchecked["predicted_mib"] == checked["predicted_mib"]
