"""One sentence per file on why its format decodes and prefills as it does.

Decoding reads every weight for each token, so fewer bits per weight means fewer bytes and a higher
memory-bound ceiling. Prefill multiplies a whole micro-batch per read of the weights, so it is
bound by arithmetic, which is the same 2 x parameters per token in every format, and quantized
formats add the work of unpacking their blocks before multiplying.
"""

from __future__ import annotations

from typing import Protocol

from quantload.roofline.weights import WeightTraffic

FLOAT_BITS_THRESHOLD = 15.0
# What a kernel must unpack before it can multiply, per format family.
_UNPACKING: dict[str, str] = {
    "Q8_0": "its 8-bit blocks (one scale per 32 weights)",
    "Q4_0": "its 4-bit blocks (one scale per 32 weights)",
    "Q4_1": "its 4-bit blocks (a scale and a minimum per 32 weights)",
    "Q4_K": "its 4-bit K-quant super-blocks (6-bit scales and minimums per 32 of 256 weights)",
    "Q5_K": "its 5-bit K-quant super-blocks (6-bit scales and minimums per 32 of 256 weights)",
    "Q6_K": "its 6-bit K-quant super-blocks (8-bit scales per 16 of 256 weights)",
}


class _Ceiling(Protocol):
    @property
    def ceiling_tokens_per_s(self) -> float: ...

    @property
    def bound(self) -> str: ...

    @property
    def flops_per_token(self) -> float: ...


def _unpacking(quant: str) -> str:
    for prefix, phrase in _UNPACKING.items():
        if quant.startswith(prefix):
            return phrase
    return f"its {quant} blocks"


def explain_quant(quant: str, traffic: WeightTraffic, prefill: _Ceiling, decode: _Ceiling) -> str:
    """Why `quant` decodes as it does (bytes per token) and prefills as it does (arithmetic)."""
    megabytes = traffic.bytes_per_pass / 1e6
    gigaflops = prefill.flops_per_token / 1e9
    bits = traffic.bits_per_weight
    experts = (
        f" (its {traffic.experts_used} of {traffic.expert_count} experts per layer, of"
        f" {traffic.expert_bytes / 1e6:,.0f} MB of experts in all)"
        if traffic.expert_count
        else ""
    )
    decode_part = (
        f"{quant} stores {bits:.1f} bits per weight, so each generated token reads"
        f" {megabytes:,.0f} MB{experts}"
    )
    prefill_part = (
        f"prefill is {prefill.bound}-bound at the same {gigaflops:.2f} GFLOP per token in every format,"
    )
    if bits >= FLOAT_BITS_THRESHOLD:
        return (
            f"{decode_part}, more than any quantized file, which gives the lowest decode ceiling"
            f" ({decode.ceiling_tokens_per_s:,.0f} tokens/s, {decode.bound}-bound); {prefill_part}"
            f" and {quant} needs only a cheap conversion to f32 before multiplying, so it can"
            " prefill as fast as the quantized files or faster."
        )
    return (
        f"{decode_part}, {16 / bits:.1f}x fewer bytes than 16-bit weights, which lifts its decode"
        f" ceiling to {decode.ceiling_tokens_per_s:,.0f} tokens/s ({decode.bound}-bound);"
        f" {prefill_part} and {quant} must also unpack {_unpacking(quant)} before multiplying,"
        " so fewer bytes do not make it prefill faster."
    )
