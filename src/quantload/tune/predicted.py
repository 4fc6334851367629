"""Predict first (`tune.predict_first`): the space ranked by predicted limit, and only the
configurations the prediction cannot separate from the best measured.

  costs     a configuration's per-batch cost depends on -b/-ub, threads, the KV-cache type and
            flash attention: each distinct combination is one llama-batched-bench run with those
            flags (`CostFlags.args`: `-ctk/-ctv/-fa` as llama-server takes them), its cost curves
            fitted (quantload.predict.costs). Slots and `-nocb` do not change a batch's cost: the
            scheduler model simulates them (quantload.predict.simulator.ServerModel). The
            measurement is a callable (`CostMeasure`), so tests give costs of known timing.
  predict   each configuration's limit over the limit search's levels (users 1..limit.max_users, or
            rates from limit.start_rate_rps to limit.max_rate_rps in quarter-octave steps), with
            its interval from the curves' (fast, slow) bounds at the SLO's confidence
            (quantload.predict.limit.predict_limit, common random numbers across configurations).
            Speculation, GPU layers and expert placement are not predicted (the simulator has no
            drafts; the curves are of the server's own offload): such configurations are always
            measured, and say so.
  screen    the best predicted configuration is the one of highest predicted limit (its interval's
            top, then the space's order, breaking ties); a configuration is measured only where
            its interval reaches the best's (its limit_high >= the best's limit_low), or it is the
            configured flags, or it is not predicted. The rest are dropped with their reason:
            "predicted limit X [lo, hi], below the best's Y [lo, hi] (key)". A limit of none (not
            even the lowest level meets) counts as 0.
  state     one `screen` line per configuration in tune.jsonl (its prediction, kept or not, and
            why), so a resumed tune screens as the first one did without measuring costs again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from quantload.config import Settings
from quantload.errors import ConfigError
from quantload.llamacpp.placement import placement_args
from quantload.predict.costs import CostsFile
from quantload.predict.limit import SimulatedLoad, predict_limit
from quantload.predict.prediction import MISSES_PAST, client_timing, server_flags_used
from quantload.predict.simulator import ServerModel
from quantload.predict.workload_shapes import WorkloadShapes, workload_shapes
from quantload.slo import Slo
from quantload.tune.space import TuneConfig
from quantload.tune.state_file import TuneLine

PREDICT_REQUESTS = 1000  # simulated requests per level
RATE_STEP = 2 ** (1 / 4)  # the rate levels' ratio (quarter octaves)
NOT_PREDICTED_SPECULATION = "speculation is not predicted (the simulator has no draft model): measured"
NOT_PREDICTED_OFFLOAD = (
    "GPU layers and expert placement are not predicted (the cost curves are of one offload): measured"
)


@dataclass(frozen=True)
class CostFlags:
    """The flags that change a batch's cost: one llama-batched-bench run each."""

    n_batch: int
    n_ubatch: int
    threads: int  # 0 = llama.cpp's default
    cache_type: str  # K and V alike
    flash_attn: str  # auto, on, off

    def args(self) -> tuple[str, ...]:
        """What llama-batched-bench takes besides -b/-ub/-t (the same flags llama-server takes)."""
        return ("-ctk", self.cache_type, "-ctv", self.cache_type, "-fa", self.flash_attn)

    def text(self) -> str:
        return f"-b {self.n_batch} -ub {self.n_ubatch} -t {self.threads} {' '.join(self.args())}"


CostMeasure = Callable[[CostFlags], CostsFile]


def not_predicted(config: TuneConfig) -> str | None:
    """Why a configuration cannot be predicted (None: it can)."""
    if config.speculation != "none":
        return NOT_PREDICTED_SPECULATION
    if config.gpu_layers or placement_args(config.placement):
        return NOT_PREDICTED_OFFLOAD
    return None


def cost_flags(config: TuneConfig) -> CostFlags:
    logical, _, physical = config.batch.partition("/")
    return CostFlags(int(logical), int(physical), config.threads, config.cache_type, config.flash_attn)


def _number(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


@dataclass(frozen=True)
class ConfigPrediction:
    """One configuration's predicted limit and interval; `why` says why it was not predicted."""

    key: str
    limit: float | None = None
    limit_low: float | None = None
    limit_high: float | None = None
    why: str = ""

    @property
    def predicted(self) -> bool:
        return not self.why

    def text(self) -> str:
        """"X [lo, hi]"."""
        return f"{_number(self.limit)} [{_number(self.limit_low)}, {_number(self.limit_high)}]"


def _value(limit: float | None) -> float:
    return 0.0 if limit is None else limit


def levels(settings: Settings, cwd: Path | None = None) -> tuple[SimulatedLoad, list[float]]:
    """The load of every level and the levels the limit search may reach (see the docstring)."""
    limit, shapes = settings.limit, _shapes(settings, cwd).shapes
    if settings.tune.objective == "users":
        users = [float(n) for n in range(1, limit.max_users + 1)]
        return SimulatedLoad("closed", shapes, PREDICT_REQUESTS, client=client_timing(settings)), users
    rates: list[float] = []
    rate = limit.start_rate_rps
    while rate <= limit.max_rate_rps * (1 + 1e-9):
        rates.append(round(rate, 4))
        rate *= RATE_STEP
    return SimulatedLoad("poisson", shapes, PREDICT_REQUESTS), rates


def _shapes(settings: Settings, cwd: Path | None = None) -> WorkloadShapes:
    ctx = settings.tune.ctx_per_slot or settings.server.ctx_per_slot
    server = settings.server.model_copy(update={"ctx_per_slot": ctx})
    return workload_shapes(settings.model_copy(update={"server": server}), cwd)


def _check_costs(costs: CostsFile, flags: CostFlags) -> None:
    measured = (costs.n_batch, costs.n_ubatch)
    if measured != (flags.n_batch, flags.n_ubatch) or (flags.threads and costs.n_threads != flags.threads):
        raise ConfigError(
            f"cost curves asked for {flags.text()} were measured with -b {costs.n_batch} -ub"
            f" {costs.n_ubatch} -t {costs.n_threads}",
            "measure each combination's curves with its own flags",
        )


def predict_space(
    settings: Settings,
    configs: Sequence[TuneConfig],
    measure: CostMeasure,
    progress: Callable[[str], None] = lambda _: None,
    cwd: Path | None = None,
) -> list[ConfigPrediction]:
    """Each configuration's prediction (see the module docstring): one cost measurement per
    distinct `CostFlags` of the predicted configurations, in the space's order."""
    load, reached = levels(settings, cwd)
    slo = Slo.of(settings.slo)
    measured: dict[CostFlags, CostsFile] = {}
    found: list[ConfigPrediction] = []
    for config in configs:
        why = not_predicted(config)
        if why is not None:
            found.append(ConfigPrediction(config.key, why=why))
            continue
        flags = cost_flags(config)
        if flags not in measured:
            progress(f"cost curves {len(measured) + 1}: {flags.text()}")
            measured[flags] = measure(flags)
            _check_costs(measured[flags], flags)
        curves = measured[flags].curves()
        fast, slow = curves.bounds(settings.slo.confidence)
        continuous = config.batching == "continuous"
        server = ServerModel(config.slots, config.ctx_per_slot, flags.n_batch, continuous)
        limit = predict_limit(
            server, curves, slo, load, reached, cost_bounds=(fast, slow), seed=settings.load.seed,
            misses_past=MISSES_PAST,
        )  # fmt: skip
        found.append(ConfigPrediction(config.key, limit.limit, limit.limit_low, limit.limit_high))
    return found


def configured_key(settings: Settings, configs: Iterable[TuneConfig]) -> str | None:
    """The configuration of the space that is the server's configured flags (None: none is)."""
    server = settings.server
    if server.cache_type_k != server.cache_type_v:
        return None
    try:
        used = server_flags_used(settings)
        fa_value = _flag_fa(server.extra_args)
    except ConfigError:
        return None
    for config in configs:
        flags = cost_flags(config)
        same = (
            config.slots == used.slots
            and config.ctx_per_slot == used.ctx_per_slot
            and (flags.n_batch, flags.n_ubatch) == (used.n_batch, used.n_ubatch)
            and config.threads == used.threads
            and config.cache_type == server.cache_type_k
            and config.flash_attn == fa_value
            and (config.batching == "continuous") == used.continuous_batching
            and not_predicted(config) is None
        )
        if same:
            return config.key
    return None


def _flag_fa(args: Sequence[str]) -> str:
    for index, arg in enumerate(args):
        if arg in ("-fa", "--flash-attn") and index + 1 < len(args):
            return {"1": "on", "0": "off"}.get(args[index + 1], args[index + 1])
        if arg.startswith("--flash-attn="):
            return arg.split("=", 1)[1]
    return "auto"  # llama.cpp's default


@dataclass(frozen=True)
class Screening:
    """The space as the prediction screened it: every prediction, the best, those measured."""

    predictions: tuple[ConfigPrediction, ...]
    best: str | None
    kept: tuple[str, ...]
    dropped: tuple[tuple[str, str], ...]  # (key, reason)

    def reason(self, key: str) -> str | None:
        return next((why for dropped, why in self.dropped if dropped == key), None)

    def prediction(self, key: str) -> ConfigPrediction | None:
        return next((p for p in self.predictions if p.key == key), None)

    def sentence(self) -> str:
        total = len(self.predictions)
        best = self.prediction(self.best) if self.best is not None else None
        head = f"predicted first: {len(self.kept)} of {total} configuration(s) measured"
        if best is None:
            return f"{head} (none could be predicted)"
        return f"{head}, {len(self.dropped)} screened out; best predicted {best.key}: {best.text()}"

    def to_dict(self) -> dict[str, object]:
        return {
            "best": self.best,
            "kept": list(self.kept),
            "dropped": [{"key": key, "why": why} for key, why in self.dropped],
            "predictions": [p.__dict__ for p in self.predictions],
            "sentence": self.sentence(),
        }


def best_of(predictions: Sequence[ConfigPrediction]) -> ConfigPrediction | None:
    """The best predicted configuration: highest limit, then interval top, then the first."""
    ranked = [p for p in predictions if p.predicted]
    if not ranked:
        return None
    order = {p.key: n for n, p in enumerate(ranked)}
    return max(ranked, key=lambda p: (_value(p.limit), _value(p.limit_high), -order[p.key]))


def screen(predictions: Sequence[ConfigPrediction], always: Iterable[str] = ()) -> Screening:
    """Keep what the prediction cannot separate from the best (see the module docstring)."""
    best = best_of(predictions)
    if best is None:
        return Screening(tuple(predictions), None, tuple(p.key for p in predictions), ())
    kept: list[str] = []
    dropped: list[tuple[str, str]] = []
    keep = set(always)
    for prediction in predictions:
        measured = not prediction.predicted or prediction.key in keep
        if measured or _value(prediction.limit_high) >= _value(best.limit_low):
            kept.append(prediction.key)
        else:
            dropped.append(
                (
                    prediction.key,
                    f"predicted limit {prediction.text()}, below the best's {best.text()} ({best.key})",
                )
            )
    return Screening(tuple(predictions), best.key, tuple(kept), tuple(dropped))


def screen_lines(screening: Screening, run_id: str, quant: str, server: str) -> list[TuneLine]:
    """The screening as tune.jsonl lines, one per configuration."""
    kept = set(screening.kept)
    return [
        TuneLine(
            kind="screen",
            key=p.key,
            predicted_limit=p.limit,
            predicted_low=p.limit_low,
            predicted_high=p.limit_high,
            kept=p.key in kept,
            why=screening.reason(p.key) or p.why,
            predicted=p.predicted,
            run_id=run_id,
            quant=quant,
            server=server,
        )
        for p in screening.predictions
    ]


def screening_of(lines: Sequence[TuneLine]) -> Screening | None:
    """The screening a tune.jsonl recorded (None: it has none)."""
    found = [line for line in lines if line.kind == "screen" and line.key is not None]
    if not found:
        return None
    predictions = tuple(
        ConfigPrediction(
            str(line.key), line.predicted_limit, line.predicted_low, line.predicted_high,
            "" if line.predicted else line.why,
        )
        for line in found
    )
    best = best_of(predictions)
    return Screening(
        predictions,
        best.key if best else None,
        tuple(str(line.key) for line in found if line.kept),
        tuple((str(line.key), line.why) for line in found if not line.kept),
    )

