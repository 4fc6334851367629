"""Roofline arithmetic: weight traffic, ceilings, the bound that applies, and the explanation."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from speed_helpers import bench_run, limits, write_small_gguf

from quantload.llamacpp.bench import BenchTest, SpeedResult, measure_speed
from quantload.llamacpp.tool_run import ToolRun
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.gguf_meta import read_gguf
from quantload.roofline.ceilings import bench_ceiling, decode_cost, prefill_cost, roofline
from quantload.roofline.explain import explain_quant
from quantload.roofline.weights import WeightTraffic, traffic_from_tensors, weight_traffic

TENSORS = {
    "token_embd.weight": (1000, 500),
    "blk.0.attn_q.weight": (200, 100),
    "output_norm.weight": (8, 2),
}


def captured_speed(toolchain: Toolchain) -> SpeedResult:
    run = bench_run("bench_ok.json", "bench_ok.stderr")

    def runner(command: list[str], on_output: Any, timeout_s: float | None) -> ToolRun:
        return run

    return measure_speed(toolchain, Path("tiny.gguf"), 64, 16, 3, 0, runner=runner)


def test_tied_embeddings_are_read_whole_as_the_output_projection() -> None:
    traffic = traffic_from_tensors(TENSORS)
    assert traffic.tied_embeddings
    assert (traffic.bytes_per_pass, traffic.matmul_params) == (1208, 602)
    assert (traffic.output_bytes, traffic.output_params) == (1000, 500)
    assert traffic.bits_per_weight == pytest.approx(8 * 1208 / 602)


def test_untied_embeddings_are_only_looked_up() -> None:
    traffic = traffic_from_tensors({**TENSORS, "output.weight": (800, 400)})
    assert not traffic.tied_embeddings
    assert (traffic.bytes_per_pass, traffic.matmul_params) == (1008, 502)
    assert (traffic.output_bytes, traffic.output_params) == (800, 400)


def test_weight_traffic_reads_the_file(tmp_path: Path) -> None:
    summary = read_gguf(write_small_gguf(tmp_path / "m.gguf", tied=False))
    traffic = weight_traffic(summary)
    assert traffic.bytes_per_pass == 4 * 64 * 64 + 4 * 100 * 64
    assert traffic.matmul_params == 64 * 64 + 100 * 64
    assert traffic.bits_per_weight == pytest.approx(32.0)


def test_decode_is_memory_bound_and_prefill_compute_bound() -> None:
    traffic = WeightTraffic(
        bytes_per_pass=100_000_000, matmul_params=100_000_000, output_bytes=0, output_params=0,
        tied_embeddings=True, bits_per_weight=8.0,
    )  # fmt: skip
    machine = limits(bandwidth_bytes_per_s=10e9, flops_per_s=100e9)
    test = BenchTest(
        n_prompt=0, n_gen=128, n_depth=0, tokens_per_s=50.0, stddev_tokens_per_s=1.0,
        samples_tokens_per_s=[50.0], mean_ns=1, stddev_ns=0, samples_ns=[1], test_time="t",
    )  # fmt: skip
    decode = bench_ceiling("tg128", test, decode_cost(traffic, 0), machine)
    assert decode.memory_ceiling_tokens_per_s == pytest.approx(100.0)
    assert decode.compute_ceiling_tokens_per_s == pytest.approx(500.0)
    assert (decode.bound, decode.ceiling_tokens_per_s) == ("memory", pytest.approx(100.0))
    assert decode.fraction_of_ceiling == pytest.approx(0.5)
    assert decode.intensity_flops_per_byte == pytest.approx(2.0)
    prefill = bench_ceiling("pp512", test, prefill_cost(traffic, 0, 512, 2048, 512), machine)
    assert prefill.bound == "compute"
    assert prefill.ceiling_tokens_per_s == pytest.approx(500.0)
    assert prefill.weight_bytes_per_token == pytest.approx(100e6 / 512)


def test_prefill_computes_logits_once_per_batch_decode_for_every_token() -> None:
    traffic = WeightTraffic(
        bytes_per_pass=3000, matmul_params=1500, output_bytes=1000, output_params=500,
        tied_embeddings=True, bits_per_weight=16.0,
    )  # fmt: skip
    assert decode_cost(traffic, 40).flops_per_token == 3000
    assert decode_cost(traffic, 40).bytes_per_token == 3040
    one_batch = prefill_cost(traffic, 400, n_prompt=1000, n_batch=2048, n_ubatch=500)
    assert one_batch.tokens_per_pass == 500
    assert one_batch.flops_per_token == pytest.approx(2 * 1000 + 2 * 500 / 1000)
    assert one_batch.weight_bytes_per_token == pytest.approx(2000 / 500 + 1000 / 1000)
    assert one_batch.kv_bytes_per_token == pytest.approx(400 / 500)
    two_batches = prefill_cost(traffic, 0, n_prompt=1000, n_batch=500, n_ubatch=500)
    assert two_batches.flops_per_token == pytest.approx(2 * 1000 + 2 * 500 * 2 / 1000)


def test_roofline_of_a_file_counts_kv_at_the_bench_context(tmp_path: Path, fake_toolchain: Toolchain) -> None:
    summary = read_gguf(write_small_gguf(tmp_path / "m.gguf", tied=False))
    speed = captured_speed(fake_toolchain)  # pp64 and tg16
    result = roofline(speed, summary, limits())
    kv_bytes = 256 * 2 * (16 + 16) * 2  # 256 cells (padded) x 2 KV heads x (K + V dims) x f16
    output_bytes = 4 * 100 * 64  # the untied output.weight, F32
    assert result.decode.kv_bytes_per_token == kv_bytes
    assert result.decode.bytes_per_token == result.weight_bytes_per_pass + kv_bytes
    assert result.decode.flops_per_token == 2 * result.matmul_params
    assert result.prefill.tokens_per_pass == 64
    assert result.prefill.bytes_per_token == pytest.approx(
        (result.weight_bytes_per_pass - output_bytes + kv_bytes) / 64 + output_bytes / 64
    )
    assert result.output_params == 100 * 64
    assert (result.prefill.test, result.decode.test) == ("pp64", "tg16")
    assert result.decode.measured_tokens_per_s == speed.decode.tokens_per_s
    assert result.quant == "F32"
    assert "KV cache (f16/f16)" in result.kv_note
    assert result.explanation.startswith("F32 stores 32.0 bits per weight")


def test_explanations_say_why_quantized_decodes_faster_but_may_not_prefill_faster() -> None:
    class Ceiling:
        def __init__(self, bound: str, tokens_per_s: float) -> None:
            self.bound = bound
            self.ceiling_tokens_per_s = tokens_per_s
            self.flops_per_token = 0.27e9

    prefill, decode = Ceiling("compute", 300.0), Ceiling("memory", 95.0)
    quantized = WeightTraffic(105_000_000, 135_000_000, 0, 0, True, 6.2)
    text = explain_quant("Q4_K_M", quantized, prefill, decode)
    assert "6.2 bits per weight" in text
    assert "2.6x fewer bytes" in text
    assert "95 tokens/s (memory-bound)" in text
    assert "compute-bound at the same 0.27 GFLOP per token" in text
    assert "unpack its 4-bit K-quant super-blocks" in text
    assert not re.search(r"\.\s+[A-Z]", text) and text.endswith("prefill faster.")  # one sentence
    f16 = WeightTraffic(270_000_000, 135_000_000, 0, 0, True, 16.0)
    full = explain_quant("F16", f16, prefill, decode)
    assert "more than any quantized file" in full
    assert "prefill as fast as the quantized files or faster" in full
    assert "Q8_0 must also unpack its 8-bit blocks" in explain_quant(
        "Q8_0", WeightTraffic(143_000_000, 135_000_000, 0, 0, True, 8.5), prefill, decode
    )
