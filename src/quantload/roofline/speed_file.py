"""`speed.json`: llama-bench speed and its roofline for every model file of a run.

Schema `quantload.speed/1`::

    {
      "schema": "quantload.speed/1",
      "machine": MachineLimits,          # the probe the rooflines were computed against
      "results": {                       # one entry per quantization, keyed by its name
        "Q4_K_M": {"bench": SpeedResult, "roofline": RooflineResult},
        ...
      }
    }

SpeedResult (quantload.llamacpp.bench): model_path, model_type, model_size_bytes, model_n_params,
reps, n_threads, n_batch, n_ubatch, n_gpu_layers, type_k, type_v, flash_attn, backends, cpu_info,
gpu_info, build_commit, build_number, wall_time_s, command[], llama_cpp{}, measured_at, and
`prefill` / `decode`: {n_prompt, n_gen, n_depth, tokens_per_s, stddev_tokens_per_s,
samples_tokens_per_s[], mean_ns, stddev_ns, samples_ns[], test_time}.

RooflineResult (quantload.roofline.ceilings): quant, bits_per_weight, weight_bytes_per_pass,
matmul_params, tied_embeddings, kv_note, bandwidth_bytes_per_s, arithmetic_flops_per_s,
balance_flops_per_byte, explanation, expert_count, experts_used, expert_bytes (0 for a dense
model: a mixture of experts reads one token's share of its experts per generated token), and
`prefill` / `decode`: {test, tokens_per_pass, context_tokens, weight_bytes_per_token,
kv_bytes_per_token, bytes_per_token, flops_per_token, intensity_flops_per_byte,
memory_ceiling_tokens_per_s, compute_ceiling_tokens_per_s, ceiling_tokens_per_s, bound
("memory" | "compute"), measured_tokens_per_s, fraction_of_ceiling}.

RooflineResult also says the `device` the test ran on (cpu, gpu, cpu+gpu) and `device_note`
(whose limits, from where); an entry's `roofline` is null, with `roofline_missing` saying why,
where that device's limits are not known. `gpus`: GpuLimits (quantload.roofline.gpu_limits) of
the GPUs NVML listed when a test ran on one.

MachineLimits (quantload.roofline.probe): bandwidth_bytes_per_s, bandwidth_samples_bytes_per_s[],
bandwidth_method, buffer_bytes, read_threads, arithmetic_flops_per_s,
arithmetic_samples_flops_per_s[], arithmetic_method, matrix_size, machine{hostname, cpu_model,
usable_cpus, machine, numpy_version}, probed_at, probe_wall_s, source ("probe" | "cache").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantload import cpu_share
from quantload.errors import ConfigError
from quantload.llamacpp.bench import SpeedResult
from quantload.roofline.ceilings import RooflineResult
from quantload.roofline.gpu_limits import GpuLimits
from quantload.roofline.probe import MachineLimits
from quantload.rundir import read_json, write_json_atomic

SPEED_SCHEMA: Final = "quantload.speed/1"


class SpeedEntry(BaseModel):
    """One file's llama-bench result and its roofline (None, and why, where the limits of the
    device it ran on are not known)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bench: SpeedResult
    roofline: RooflineResult | None
    roofline_missing: str | None = None


class SpeedFile(BaseModel):
    """The whole `speed.json`: entries keyed by quantization name, and the machine's limits."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_id: Literal["quantload.speed/1"] = Field(default=SPEED_SCHEMA, alias="schema")
    machine: MachineLimits | None = None
    gpus: tuple[GpuLimits, ...] = Field(default=(), description="the GPUs' limits, where any ran a test")
    results: dict[str, SpeedEntry] = Field(default_factory=dict)

    def with_entry(
        self, label: str, entry: SpeedEntry, machine: MachineLimits, gpus: tuple[GpuLimits, ...] = ()
    ) -> SpeedFile:
        """A copy with `entry` stored (or replaced) under `label` and `machine` as the limits."""
        update = {"machine": machine, "results": {**self.results, label: entry}}
        return self.model_copy(update={**update, "gpus": gpus or self.gpus})

    def to_json(self) -> dict[str, Any]:
        """The JSON object as written to disk."""
        return self.model_dump(mode="json", by_alias=True)


def load_speed_file(path: Path) -> SpeedFile:
    """Read and validate a speed.json; ConfigError if it is not one."""
    try:
        return SpeedFile.model_validate(read_json(path))
    except (ValueError, ValidationError) as error:
        raise ConfigError(
            f"{path} is not a {SPEED_SCHEMA} file ({str(error).splitlines()[0]})",
            "choose another output file, or delete this one",
        ) from None


def save_speed_entry(
    path: Path, label: str, entry: SpeedEntry, machine: MachineLimits, gpus: tuple[GpuLimits, ...] = ()
) -> SpeedFile:
    """Add `entry` under `label` to the file at `path` (created if absent), atomically."""
    current = load_speed_file(path) if path.exists() else SpeedFile()
    updated = current.with_entry(label, entry, machine, gpus)
    write_json_atomic(path, updated.to_json())
    return updated


def busy_note(speeds: SpeedFile | None, threshold: float = cpu_share.BUSY_OTHER_CPU_FRAC) -> str | None:
    """A warning when other processes took more than `threshold` of the CPUs while llama-bench ran
    (load.interference_cpu_frac: the rule every load stage is held to), else None."""
    if speeds is None:
        return None
    shares = {
        label: entry.bench.other_cpu_frac
        for label, entry in speeds.results.items()
        if cpu_share.busy(entry.bench.other_cpu_frac, threshold)
    }
    if not shares:
        return None
    worst = max(value for value in shares.values() if value is not None)
    return (
        f"Other processes used up to {worst:.0%} of the CPUs while llama-bench ran"
        f" ({', '.join(shares)}): those speeds are lower and noisier than an idle machine gives;"
        " rerun when it is quiet."
    )
