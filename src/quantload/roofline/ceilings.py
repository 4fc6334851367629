"""Where a measured prefill or decode speed sits against this machine's limits (a roofline).

One forward pass handles `tokens_per_pass` tokens (1 when decoding; a micro-batch of
min(prompt, n_ubatch) tokens when prefilling) and reads every weight once (see `weights`) plus the
KV cache of the test's context (f16 cells padded to 256, as llama.cpp allocates them: an upper
bound on what attention reads). The output projection runs for every generated token, but in
llama-bench's prefill only for the last token of each batch, so it is spread over the prompt:

    decode,  per token:  bytes = weights + KV             flops = 2 x params
    prefill, per token:  bytes = (weights - output + KV) / tokens_per_pass + output x batches / prompt
                         flops = 2 x (params - output params) + 2 x output params x batches / prompt
    memory ceiling = bandwidth / bytes;  compute ceiling = arithmetic rate / flops
    ceiling = the lower of the two; `bound` names it; fraction = measured / ceiling

With one token per pass the memory ceiling is the lower: decode is memory-bound ("bandwidth / bytes
read per generated token"). A 512-token micro-batch divides the weight bytes by 512, so prefill is
compute-bound ("arithmetic rate / (2 x parameters)", with the output projection counted as above).
Attention's own arithmetic (a few percent at these contexts) is left out of the flops.

The limits are those of the device the test ran on (`device_ceilings`): this machine's CPU probe
when llama-bench kept every layer on the CPU (or has no GPU backend); the GPU's (roofline.gpu_limits)
when it offloaded every layer; with only some layers offloaded, the time per token adds each
device's share (a fraction f of the bytes at the GPU's rate, the rest at the CPU's), so the
ceiling's rate is 1 / (f / GPU rate + (1 - f) / CPU rate). Several GPUs hold consecutive layers
(llama.cpp's layer split) and run one after another: their rate is combined the same way. A test
that ran on a GPU whose limits are not known gets no roofline: set against the CPU's limits it
would read far above 100 %.

A mixture of experts reads and multiplies per generated token only the experts it is routed to
(`weights`: one token's share); a prompt micro-batch reads every expert any of its tokens uses
(nearly all of them), while each token still multiplies only its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from quantload.errors import ModelError
from quantload.kvcache import kv_shape_from_gguf, predict_kv
from quantload.llamacpp.bench import BenchTest, SpeedResult
from quantload.models.gguf_meta import GgufSummary
from quantload.roofline.explain import explain_quant
from quantload.roofline.gpu_limits import GpuLimits
from quantload.roofline.probe import MachineLimits
from quantload.roofline.weights import WeightTraffic, weight_traffic

Bound = Literal["memory", "compute"]


class BenchCeiling(BaseModel):
    """One llama-bench test against the roofline."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    test: str = Field(description="llama-bench's name, e.g. pp512 or tg128")
    tokens_per_pass: int
    context_tokens: int
    weight_bytes_per_token: float
    kv_bytes_per_token: float
    bytes_per_token: float
    flops_per_token: float
    intensity_flops_per_byte: float
    memory_ceiling_tokens_per_s: float
    compute_ceiling_tokens_per_s: float
    ceiling_tokens_per_s: float
    bound: Bound
    measured_tokens_per_s: float
    fraction_of_ceiling: float


class RooflineResult(BaseModel):
    """Prefill and decode of one model file against this machine's limits, with the reason."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quant: str
    bits_per_weight: float
    weight_bytes_per_pass: int
    matmul_params: int
    output_params: int = Field(description="parameters of the output projection (logits)")
    tied_embeddings: bool
    kv_note: str = Field(description="how KV bytes were found, or why they are left out")
    bandwidth_bytes_per_s: float
    arithmetic_flops_per_s: float
    balance_flops_per_byte: float
    prefill: BenchCeiling
    decode: BenchCeiling
    explanation: str = Field(description="one sentence: why this format decodes/prefills so")
    device: Literal["cpu", "gpu", "cpu+gpu"] = Field(default="cpu", description="what the test ran on")
    device_note: str = Field(default="", description="which device's limits, and where they come from")
    expert_count: int = Field(default=0, description="routed experts per layer (0: a dense model)")
    experts_used: int = Field(default=0, description="experts each token is routed to")
    expert_bytes: int = Field(default=0, description="bytes of every routed expert together")


def _kv_bytes(summary: GgufSummary, context_tokens: int, type_k: str, type_v: str) -> int:
    shape = kv_shape_from_gguf(summary)
    return predict_kv(shape, 1, max(1, context_tokens), type_k, type_v).total_bytes


@dataclass(frozen=True)
class TokenCost:
    """What one token of a test costs: bytes read and flops done."""

    tokens_per_pass: int
    weight_bytes_per_token: float
    kv_bytes_per_token: float
    flops_per_token: float

    @property
    def bytes_per_token(self) -> float:
        return self.weight_bytes_per_token + self.kv_bytes_per_token


def decode_cost(traffic: WeightTraffic, kv_bytes: int) -> TokenCost:
    """One generated token: every weight and the KV cache read, every parameter multiplied."""
    return TokenCost(1, traffic.bytes_per_pass, kv_bytes, 2.0 * traffic.matmul_params)


def prefill_cost(
    traffic: WeightTraffic, kv_bytes: int, n_prompt: int, n_batch: int, n_ubatch: int
) -> TokenCost:
    """One prompt token: weights shared by a micro-batch, the output projection by the prompt."""
    per_pass = max(1, min(n_prompt, n_ubatch))
    prompt = max(1, n_prompt)
    output_share = math.ceil(prompt / max(1, n_batch)) / prompt  # logit rows per prompt token
    body_bytes = traffic.bytes_for_tokens(per_pass) - traffic.output_bytes
    body_params = traffic.matmul_params - traffic.output_params
    return TokenCost(
        tokens_per_pass=per_pass,
        weight_bytes_per_token=body_bytes / per_pass + traffic.output_bytes * output_share,
        kv_bytes_per_token=kv_bytes / per_pass,
        flops_per_token=2.0 * (body_params + traffic.output_params * output_share),
    )


@dataclass(frozen=True)
class DeviceCeilings:
    """The limits a test is set against: the device it ran on, and where the figures come from."""

    device: Literal["cpu", "gpu", "cpu+gpu"]
    note: str
    bandwidth_bytes_per_s: float
    arithmetic_flops_per_s: float

    @property
    def balance_flops_per_byte(self) -> float:
        return self.arithmetic_flops_per_s / self.bandwidth_bytes_per_s


class UnknownGpuCeilings(Exception):
    """A test ran on a GPU whose limits are not known."""


def _in_turn(rates: list[float], shares: list[float]) -> float:
    """The rate of work split in `shares` done one part after another at `rates`."""
    return 1.0 / sum(share / rate for share, rate in zip(shares, rates, strict=True) if share > 0)


def offloaded_share(speed: SpeedResult, summary: GgufSummary) -> float:
    """The share of the model's layers (repeating plus output) llama-bench put on a GPU: 0 when
    it ran on the CPU alone (no GPU backend, or -ngl 0)."""
    if "CUDA" not in speed.backends.upper() or speed.n_gpu_layers == 0:
        return 0.0
    blocks = summary.arch_value("block_count")
    layers = int(blocks) + 1 if isinstance(blocks, int) else None
    if speed.n_gpu_layers < 0 or layers is None:
        return 1.0
    return min(speed.n_gpu_layers, layers) / layers


def device_ceilings(
    speed: SpeedResult, summary: GgufSummary, cpu: MachineLimits, gpus: Sequence[GpuLimits] = ()
) -> DeviceCeilings:
    """The limits of what the test ran on (see the module docstring); UnknownGpuCeilings when it
    ran on a GPU quantload has no limits for."""
    cpu_note = "this machine's CPU (the probe)"
    share = offloaded_share(speed, summary)
    if share == 0.0:
        return DeviceCeilings("cpu", cpu_note, cpu.bandwidth_bytes_per_s, cpu.arithmetic_flops_per_s)
    if not gpus:
        raise UnknownGpuCeilings(
            f"llama-bench ran on a GPU ({speed.gpu_info or speed.backends}) whose limits are not known"
            " (NVML did not answer here)"
        )
    each = [1.0 / len(gpus)] * len(gpus)
    gpu_bandwidth = _in_turn([g.bandwidth_bytes_per_s for g in gpus], each)
    gpu_arithmetic = _in_turn([g.arithmetic_flops_per_s for g in gpus], each)
    named = "; ".join(
        f"{g.name}: bandwidth from {g.bandwidth_source}, arithmetic from {g.arithmetic_source}" for g in gpus
    )
    if share >= 1.0:
        return DeviceCeilings("gpu", named, gpu_bandwidth, gpu_arithmetic)
    shares = [share, 1.0 - share]
    return DeviceCeilings(
        "cpu+gpu",
        f"{share:.0%} of the layers on the GPU ({named}), the rest on {cpu_note}",
        _in_turn([gpu_bandwidth, cpu.bandwidth_bytes_per_s], shares),
        _in_turn([gpu_arithmetic, cpu.arithmetic_flops_per_s], shares),
    )


def bench_ceiling(
    name: str, test: BenchTest, cost: TokenCost, limits: DeviceCeilings | MachineLimits
) -> BenchCeiling:
    """The roofline of one test, given what one of its tokens costs."""
    memory = limits.bandwidth_bytes_per_s / cost.bytes_per_token
    compute = limits.arithmetic_flops_per_s / cost.flops_per_token
    ceiling = min(memory, compute)
    return BenchCeiling(
        test=name,
        tokens_per_pass=cost.tokens_per_pass,
        context_tokens=test.n_depth + test.n_prompt + test.n_gen,
        weight_bytes_per_token=cost.weight_bytes_per_token,
        kv_bytes_per_token=cost.kv_bytes_per_token,
        bytes_per_token=cost.bytes_per_token,
        flops_per_token=cost.flops_per_token,
        intensity_flops_per_byte=cost.flops_per_token / cost.bytes_per_token,
        memory_ceiling_tokens_per_s=memory,
        compute_ceiling_tokens_per_s=compute,
        ceiling_tokens_per_s=ceiling,
        bound="memory" if memory <= compute else "compute",
        measured_tokens_per_s=test.tokens_per_s,
        fraction_of_ceiling=test.tokens_per_s / ceiling,
    )


def roofline(
    speed: SpeedResult, summary: GgufSummary, machine: MachineLimits, gpus: Sequence[GpuLimits] = ()
) -> RooflineResult:
    """Prefill and decode of the file `summary` describes, measured in `speed`, against the limits
    of the device it ran on (`device_ceilings`; UnknownGpuCeilings for a GPU without limits)."""
    limits = device_ceilings(speed, summary, machine, gpus)
    traffic = weight_traffic(summary)
    prefill_ctx = speed.prefill.n_depth + speed.prefill.n_prompt
    decode_ctx = speed.decode.n_depth + speed.decode.n_gen
    try:
        prefill_kv = _kv_bytes(summary, prefill_ctx, speed.type_k, speed.type_v)
        decode_kv = _kv_bytes(summary, decode_ctx, speed.type_k, speed.type_v)
        kv_note = f"KV cache ({speed.type_k}/{speed.type_v}) of the test's context, from GGUF"
    except ModelError as error:
        prefill_kv = decode_kv = 0
        kv_note = f"KV bytes left out: {error.problem}"
    prefill = bench_ceiling(
        f"pp{speed.prefill.n_prompt}",
        speed.prefill,
        prefill_cost(traffic, prefill_kv, speed.prefill.n_prompt, speed.n_batch, speed.n_ubatch),
        limits,
    )
    decode = bench_ceiling(f"tg{speed.decode.n_gen}", speed.decode, decode_cost(traffic, decode_kv), limits)
    return RooflineResult(
        quant=summary.file_type,
        bits_per_weight=round(traffic.bits_per_weight, 3),
        weight_bytes_per_pass=traffic.bytes_per_pass,
        matmul_params=traffic.matmul_params,
        output_params=traffic.output_params,
        tied_embeddings=traffic.tied_embeddings,
        kv_note=kv_note,
        bandwidth_bytes_per_s=limits.bandwidth_bytes_per_s,
        arithmetic_flops_per_s=limits.arithmetic_flops_per_s,
        balance_flops_per_byte=limits.balance_flops_per_byte,
        prefill=prefill,
        decode=decode,
        explanation=explain_quant(summary.file_type, traffic, prefill, decode),
        device=limits.device,
        device_note=limits.note,
        expert_count=traffic.expert_count,
        experts_used=traffic.experts_used,
        expert_bytes=traffic.expert_bytes,
    )
