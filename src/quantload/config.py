"""The one typed configuration object, and where each of its values came from.

Layers, later ones winning: built-in defaults, the run profile's presets, `quantload.toml` in the
working folder, `QUANTLOAD_<SECTION>__<KEY>` environment variables, command-line flags.
"""

from __future__ import annotations

import json
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
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic.fields import FieldInfo

from quantload.errors import ConfigError, QuantloadError
from quantload.load.lengths import parse_length_distribution
from quantload.profiles import PROFILE_ALIASES, PROFILE_NAMES, profile_name, profile_presets

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

Quant = Literal["F16", "Q8_0", "Q4_K_M"]
CacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolchainSettings(_Section):
    """Where the llama.cpp binaries come from."""

    llama_bin: Path | None = None
    cache_dir: Path | None = None
    build_jobs: int = Field(default=0, ge=0, description="0 = all cores")


class ModelSettings(_Section):
    """Which model to prepare and which quantizations of it."""

    source: str = "qwen2.5-0.5b"
    quants: tuple[Quant, ...] = ("F16", "Q8_0", "Q4_K_M")
    tiny_seed: int = 0


class ServerSettings(_Section):
    """How each llama-server is started."""

    host: str = "127.0.0.1"
    slots: int = Field(default=8, ge=1)
    ctx_per_slot: int = Field(default=4096, ge=256)
    kv_unified: bool = False
    cache_type_k: CacheType = "f16"
    cache_type_v: CacheType = "f16"
    threads: int = Field(default=0, ge=0, description="0 = llama.cpp's default")
    gpu_layers: int = Field(default=0, ge=0)
    api_key: SecretStr | None = None
    startup_timeout_s: float = Field(default=180.0, gt=0)
    extra_args: tuple[str, ...] = ()


class QualitySettings(_Section):
    """Perplexity on WikiText-2, and KL divergence from the F16 file (llama-perplexity)."""

    dataset: Path | None = None
    ctx: int = Field(default=512, ge=16)
    chunks: int = Field(default=0, ge=0, description="0 = every chunk of the text")
    threads: int = Field(default=0, ge=0, description="0 = llama.cpp's default")
    timeout_s: float = Field(default=7200.0, gt=0, description="stop llama-perplexity after this")
    kld: bool = Field(default=True, description="measure each file's KL divergence from the F16")
    kld_chunks: int = Field(
        default=40,
        ge=0,
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

    prompt_tokens: int = Field(default=512, ge=1)
    gen_tokens: int = Field(default=128, ge=1)
    reps: int = Field(default=5, ge=1)
    threads: int = Field(default=0, ge=0, description="0 = llama.cpp's default")
    timeout_s: float = Field(default=1800.0, gt=0, description="stop llama-bench after this")
    probe_max_age_s: float = Field(
        default=86400.0, ge=0, description="reuse a cached machine probe younger than this"
    )


ExperimentName = Literal[
    "sweep", "prefix_cache", "open_loop", "sessions", "trace", "mixed", "limit_users", "limit_rate",
    "kv_types",
]  # fmt: skip
ALL_EXPERIMENTS: tuple[ExperimentName, ...] = (
    "sweep", "prefix_cache", "open_loop", "sessions", "trace", "mixed", "limit_users", "limit_rate",
    "kv_types",
)  # fmt: skip


class LoadSettings(_Section):
    """The Locust load stages and the prompt-cache experiment."""

    experiments: tuple[ExperimentName, ...] = Field(
        default=ALL_EXPERIMENTS,
        description="what `quantload run` runs per quantization, in this order; an experiment"
        " without its input is left out (open_loop: load.rates_rps, trace: trace.path,"
        " prefix_cache: load.prefix_tokens and load.prefix_requests, kv_types: kv_types.requests and"
        " two cache types in quality.kld_cache_types)",
    )

    users: tuple[Annotated[int, Field(ge=1)], ...] = Field(default=(1, 2, 4, 8), min_length=1)
    repeats: int = Field(default=3, ge=1)
    prompts: str = "builtin"
    prompt_count: int = Field(default=100, ge=1)
    min_prompt_tokens: int = Field(default=1, ge=1)
    max_prompt_tokens: int = Field(default=1024, ge=1)
    max_tokens: int = Field(default=128, ge=1)
    ignore_eos: bool = False
    temperature: float = Field(default=0.0, ge=0)
    seed: int = 42
    warmup_requests: int = Field(default=2, ge=0)
    request_timeout_s: float = Field(default=300.0, gt=0)
    stage_timeout_s: float = Field(default=3600.0, gt=0)
    rates_rps: tuple[Annotated[float, Field(gt=0)], ...] = ()
    open_loop_requests: int = Field(default=50, ge=1)
    prefix_tokens: int = Field(default=1500, ge=0)
    prefix_requests: int = Field(default=20, ge=0)
    prefix_users: int = Field(default=1, ge=1)
    cache_prompt: bool = Field(
        default=False, description="cache_prompt sent by sweep and open-loop requests"
    )
    open_loop_users: int = Field(default=64, ge=1, description="user pool serving the arrivals")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    first_byte_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="wait at most this for a response's first byte (llama-server sends it with the"
        " first token: queueing + prefill); a silent server costs this, not request_timeout_s",
    )
    first_round_jitter_s: float = Field(
        default=0.1, ge=0, description="each user's first request of a stage waits up to this"
    )
    max_consecutive_errors: int = Field(
        default=20, ge=1, description="failed requests in a row that end a stage as failed"
    )
    reuse_connections: Literal["auto", "always", "never"] = "auto"
    workers: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        default="auto",
        description="Locust worker processes: 0 = one process; auto = one process unless a stage"
        " has more than 256 users and the cores leave room for a master and two workers",
    )
    remote_workers: int = Field(
        default=0,
        ge=0,
        description="Locust workers on other hosts (`quantload load-worker`) the master waits for,"
        " besides load.workers of its own",
    )
    master_host: str = Field(
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
        default=60.0, gt=0, description="how long the master waits for its workers at each plan's start"
    )
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(
        default=9647, ge=0, le=65535, description="load generator /metrics; workers use +1+i"
    )
    saturation_cpu_frac: float = Field(default=0.9, gt=0)
    saturation_lag_s: float = Field(default=0.05, gt=0)


class KvTypeSettings(_Section):
    """The KV-cache type trade-off (the kv_types experiment): per quantization, after its other
    experiments, a llama-server for each cache type of quality.kld_cache_types (the quantization's
    own server for the type it serves) and one closed-loop stage of decode-heavy requests on each:
    short prompts, max_tokens with ignore_eos, cache_prompt off."""

    users: int = Field(default=8, ge=1, description="concurrent users of each cache type's stage")
    requests: int = Field(
        default=16, ge=0, description="measured requests per cache type; 0 = no kv_types experiment"
    )
    max_tokens: int = Field(default=128, ge=2, description="tokens generated per request (ignore_eos)")
    prompt_max_tokens: int = Field(
        default=32, ge=1, description="only prompts of at most this many tokens (load.prompts' set)"
    )


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
        default=50, ge=1, description="requests per closed-loop stage for lengths, dataset and trace"
    )
    max_output_tokens: int = Field(
        default=1024, ge=1, description="cap on a dataset reply's length asked as max_tokens"
    )


class SessionSettings(_Section):
    """Multi-turn conversations: the sessions experiment, and workload.kind = sessions."""

    users: int = Field(default=4, ge=1, description="conversations in flight at once")
    count: int = Field(default=8, ge=0, description="conversations per stage (0: no sessions experiment)")
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
        default=1, ge=1, description="repeats of the stages (each stage already holds many turns)"
    )


class TraceSettings(_Section):
    """A timestamped trace replayed open loop (the trace experiment, workload.kind = trace)."""

    path: str | None = Field(default=None, description="JSONL trace; Mooncake fields accepted")
    speed: float = Field(default=1.0, gt=0, le=1000, description="2 = twice the trace's pace")
    max_requests: int = Field(default=500, ge=1, description="the trace's first N requests")


class MixedSettings(_Section):
    """The mixed-traffic diagnosis: decode-heavy traffic alone, then with long prompts mixed in."""

    users: int = Field(default=4, ge=1, description="closed-loop users of both stages")
    decode_requests: int = Field(default=16, ge=1, description="decode-heavy requests per stage")
    decode_prompt_tokens: int = Field(default=64, ge=1, description="whole prompt of a decode-heavy request")
    decode_output_tokens: int = Field(default=128, ge=2, description="its output (ignore_eos on)")
    long_prompt_tokens: int = Field(default=3000, ge=1, description="whole prompt of a long request")
    long_output_tokens: int = Field(default=16, ge=1, description="its output")
    long_fraction: float = Field(
        default=0.25, gt=0, lt=1, description="share of the mixed stage's requests that are long"
    )
    batch_sizes: tuple[str, ...] = Field(
        default=("2048/512", "256/256"),
        min_length=1,
        description="llama-server -b/-ub pairs the experiment is repeated at (the server restarts)",
    )
    repeats: int = Field(default=1, ge=1, description="repeats of each stage (long prompts are slow)")

    @field_validator("batch_sizes")
    @classmethod
    def _batch_pairs(cls, pairs: tuple[str, ...]) -> tuple[str, ...]:
        for pair in pairs:
            logical, slash, physical = pair.partition("/")
            if not slash or not logical.isdigit() or not physical.isdigit() or int(physical) > int(logical):
                raise ValueError(f"{pair!r} is not B/UB with UB <= B, e.g. 2048/512")
        return pairs


class LimitSettings(_Section):
    """The limit search: the most users (limit_users) and highest rate (limit_rate) within the SLO."""

    start_users: int = Field(default=1, ge=1, description="the closed-loop search's first level")
    max_users: int = Field(default=64, ge=1, description="the most users it may try")
    start_rate_rps: float = Field(default=0.5, gt=0, description="the open-loop search's first rate")
    max_rate_rps: float = Field(default=64.0, gt=0, description="the highest rate it may try")
    growth: float = Field(default=2.0, gt=1, description="each growing trial multiplies the level")
    rate_resolution: float = Field(default=0.1, gt=0, lt=1, description="rates are bisected to this")
    repeats: int = Field(default=3, ge=1, description="the answer must hold in a majority of these")
    time_cap_s: float = Field(default=900.0, gt=0, description="per search; ends it early")
    requests_per_user: int = Field(default=4, ge=1, description="closed-loop trial requests per user")
    min_requests: int = Field(default=8, ge=1, description="fewest requests of a trial")
    trial_seconds: float = Field(default=30.0, gt=0, description="open-loop trial length at its rate")
    trial_timeout_s: float = Field(default=300.0, gt=0, description="a trial over this fails hard")
    hard_failure_frac: float = Field(
        default=0.1, gt=0, le=1, description="failed share of a trial that ends its level at once"
    )


class ObserveSettings(_Section):
    """Exporter, Prometheus and Grafana."""

    exporter_host: str = "127.0.0.1"
    exporter_port: int = Field(default=9646, ge=0, le=65535)
    exporter_timeout_s: float = Field(
        default=0.5, gt=0, description="keep below Prometheus' scrape timeout (1 s)"
    )
    exporter_targets: tuple[str, ...] = Field(
        default=(), description="NAME=URL[,quant=Q,model=M,api_key_env=VAR,kv_cells=N,log=PATH]"
    )
    prometheus_binary: str = "prometheus"
    prometheus_port: int = Field(default=0, ge=0, le=65535, description="0 = a free port")
    scrape_interval_s: float = Field(default=1.0, gt=0)
    grafana_url: str | None = Field(
        default=None, description="stage annotations are pushed here after each load; unset = none"
    )
    grafana_token: SecretStr | None = Field(
        default=None, description="service-account token; used instead of user/password when set"
    )
    grafana_user: str | None = Field(default=None, description="basic auth, with grafana_password")
    grafana_password: SecretStr | None = None


class ReportSettings(_Section):
    """Service-level objectives the capacity verdict is judged against."""

    slo_ttft_p99_s: float = Field(default=1.0, gt=0)
    slo_tpot_s: float = Field(default=0.1, gt=0)
    client_lag_threshold_s: float = Field(default=0.05, gt=0)
    max_kld_mean_nats: float = Field(
        default=0.05,
        ge=0,
        description="the quality loss the verdict accepts: mean KL divergence from the F16 file"
        " (nats, quality.kld). 0.05 admits the 4-bit K-quants of an 8B model (llama.cpp's own"
        " table for LLaMA 3 8B: Q4_K_M 0.031, Q4_K_S 0.043) and rules out legacy 4-bit (Q4_0 0.072)"
        " and everything at 3 bits or fewer",
    )


class PlanSettings(_Section):
    """The capacity plan's inputs: the load to serve, the headroom kept, what a server costs and
    may use. Each is optional; the plan leaves out what an unset input would give."""

    target_rps: float | None = Field(
        default=None, gt=0, description="requests per second to serve; unset = no server count for a rate"
    )
    target_users: int | None = Field(
        default=None, ge=1, description="concurrent users to serve; unset = no server count for users"
    )
    headroom_frac: float = Field(
        default=0.3, ge=0, lt=1, description="share of each server's measured limit kept free"
    )
    price_per_hour: float | None = Field(
        default=None, gt=0, description="what one server costs per hour; unset = no costs"
    )
    currency: str = Field(default="", description="the unit of price_per_hour, e.g. USD")
    memory_budget_gib: float | None = Field(
        default=None, gt=0, description="memory one server may use, GiB; unset = no fit check"
    )


MAX_CALIBRATION_STREAMS = 1024
MAX_CALIBRATION_COUNTS = 8


class CalibrateSettings(_Section):
    """`quantload calibrate`: the load client against a fake server of known timing."""

    streams: tuple[int, ...] = Field(
        default=(1, 8, 64, 256),
        description=f"rising stream counts to measure, each 1-{MAX_CALIBRATION_STREAMS},"
        f" at most {MAX_CALIBRATION_COUNTS}",
    )
    seconds_per_count: float = Field(
        default=5.0, gt=0, le=60, description="how long each stream count streams"
    )
    max_error_p99_s: float = Field(
        default=0.005,
        gt=0,
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

    profile: Literal["quick", "full", "ci"] = "full"
    out: Path = Path("results")
    servers_at_once: bool = False

    @field_validator("profile", mode="before")
    @classmethod
    def _profile_alias(cls, value: Any) -> Any:
        """An earlier profile name (`seed`) is read as the profile it now goes by."""
        return PROFILE_ALIASES.get(value, value) if isinstance(value, str) else value


class Settings(_Section):
    """Every setting quantload reads, grouped by the step that uses it."""

    toolchain: ToolchainSettings = ToolchainSettings()
    model: ModelSettings = ModelSettings()
    server: ServerSettings = ServerSettings()
    quality: QualitySettings = QualitySettings()
    speed: SpeedSettings = SpeedSettings()
    load: LoadSettings = LoadSettings()
    workload: WorkloadSettings = WorkloadSettings()
    sessions: SessionSettings = SessionSettings()
    trace: TraceSettings = TraceSettings()
    mixed: MixedSettings = MixedSettings()
    limit: LimitSettings = LimitSettings()
    observe: ObserveSettings = ObserveSettings()
    kv_types: KvTypeSettings = KvTypeSettings()
    report: ReportSettings = ReportSettings()
    plan: PlanSettings = PlanSettings()
    calibrate: CalibrateSettings = CalibrateSettings()
    run: RunSettings = RunSettings()


@dataclass(frozen=True)
class ResolvedConfig:
    """The settings and, for each dotted key, the layer its value came from."""

    settings: Settings
    sources: Mapping[str, str]

    def source_of(self, key: str) -> str:
        """Where `key` (dotted, e.g. `load.max_tokens`) got its value."""
        return self.sources.get(key, "default")


def _known_keys() -> dict[str, set[str]]:
    return {
        name: set(field.annotation.model_fields)  # type: ignore[union-attr]
        for name, field in Settings.model_fields.items()
    }


def _check_keys(layer: Mapping[str, Mapping[str, Any]], origin: str) -> None:
    known = _known_keys()
    for section, values in layer.items():
        if section not in known:
            raise ConfigError(
                f"unknown configuration section '{section}' in {origin}",
                f"known sections: {', '.join(sorted(known))}",
            )
        if not isinstance(values, Mapping):
            raise ConfigError(f"'{section}' in {origin} must be a table of keys")
        for key in values:
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
    _check_keys(data, str(path))
    return data


def _field(section: str, key: str) -> FieldInfo:
    model = Settings.model_fields[section].annotation
    assert isinstance(model, type) and issubclass(model, BaseModel)
    return model.model_fields[key]


def _splits_on_commas(item: Any) -> bool:
    """Items that never hold a comma themselves: numbers and fixed names (Literal)."""
    if typing.get_origin(item) is Annotated:
        item = typing.get_args(item)[0]
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
    if typing.get_origin(annotation) not in (tuple, list):
        return raw
    item = typing.get_args(annotation)[0] if typing.get_args(annotation) else str
    text = raw.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise ConfigError(f"{text!r} is not a JSON list", 'e.g. ["a", "b"]') from None
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


def _validation_message(error: ValidationError, sources: Mapping[str, str]) -> ConfigError:
    first = error.errors()[0]
    location = [str(part) for part in first["loc"][:2]]
    dotted = ".".join(location)
    origin = sources.get(dotted, "default")
    secret = len(location) == 2 and _is_secret(*location)
    return ConfigError(
        f"configuration key '{dotted}' (from {origin}): {first['msg']}",
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
        raise _validation_message(error, layered_sources) from None
    return ResolvedConfig(settings=settings, sources=layered_sources)


def describe(config: ResolvedConfig) -> list[tuple[str, str, str]]:
    """Rows of (dotted key, value as text, source) for every setting, secrets masked."""
    rows: list[tuple[str, str, str]] = []
    dumped = config.settings.model_dump(mode="json")
    for section, values in dumped.items():
        for key, value in values.items():
            dotted = f"{section}.{key}"
            # SecretStr values dump as '**********', so keys and tokens never print.
            rows.append((dotted, json.dumps(value), config.source_of(dotted)))
    return rows
