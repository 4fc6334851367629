"""Helpers for the speed tests: a minimal GGUF file, captured llama-bench runs, machine limits."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from quantload.llamacpp.tool_run import ToolRun
from quantload.roofline.probe import MachineLimits, this_machine

CAPTURED = Path(__file__).resolve().parents[2] / "fixtures" / "llamacpp"


def write_small_gguf(path: Path, tied: bool = True, n_embd: int = 64, vocab: int = 100) -> Path:
    """A 1-layer qwen2-shaped GGUF holding F32 tensors (enough for metadata and byte counts)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(1)
    writer.add_embedding_length(n_embd)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_context_length(4096)
    writer.add_file_type(0)
    writer.add_tensor("token_embd.weight", np.zeros((vocab, n_embd), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((n_embd, n_embd), dtype=np.float32))
    if not tied:
        writer.add_tensor("output.weight", np.zeros((vocab, n_embd), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def limits(
    bandwidth_bytes_per_s: float = 10e9, flops_per_s: float = 100e9, others: float | None = 0.0
) -> MachineLimits:
    """MachineLimits with chosen numbers, probed now while other work took `others` of the CPUs."""
    return MachineLimits(
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        bandwidth_samples_bytes_per_s=[bandwidth_bytes_per_s],
        bandwidth_method="test",
        buffer_bytes=1,
        read_threads=1,
        arithmetic_flops_per_s=flops_per_s,
        arithmetic_samples_flops_per_s=[flops_per_s],
        arithmetic_method="test",
        matrix_size=1,
        machine=this_machine(),
        probed_at=datetime.now(UTC).isoformat(timespec="seconds"),
        probe_wall_s=0.0,
        other_cpu_frac=others,
    )


def bench_run(stdout_name: str, stderr_name: str, returncode: int = 0) -> ToolRun:
    """A ToolRun made of two captured files."""
    return ToolRun(
        command=("llama-bench",),
        returncode=returncode,
        stdout=(CAPTURED / stdout_name).read_text(encoding="utf-8"),
        stderr=(CAPTURED / stderr_name).read_text(encoding="utf-8"),
        wall_time_s=2.0,
        timed_out=False,
    )
