"""Cost curves: seconds of one llama_decode call, fitted to llama-batched-bench (and llama-bench) rows.

The model is linear in five terms, each non-negative, each with a physical reading:

    seconds = per_ubatch_s          x ubatches            (fixed cost of one graph computation:
                                                            building it, starting the threads, and
                                                            on a CPU streaming every weight once)
            + per_prompt_token_s    x prompt tokens       (the layers' work on one prompt token)
            + per_decode_token_s    x decoded tokens      (one generated position: its layers' work
                                                            and its logits over the vocabulary)
            + per_decode_kv_token_s x KV tokens the decoded sequences hold (attention reads each
                                                            cached K and V once per decoded token)
            + per_prompt_pair_s     x prompt attention pairs (query, key): a prompt of p tokens on
                                                            a sequence already holding k attends
                                                            p*k + p*(p+1)/2 pairs

ubatches = ceil(tokens of the call / -ub): llama.cpp splits a llama_decode call (at most -b tokens)
into ubatches of at most -ub. A llama-batched-bench row (`llamacpp.batched_bench`, whose docstring
says what each number means) gives two observations: its prefill (B prompts of PP tokens: B*PP
tokens in calls of -b, B*PP*(PP+1)/2 pairs) and its TG decode steps (TG calls of B tokens; before
step i the sequences hold B*(PP+i) tokens, so TG*B*(PP+(TG-1)/2) KV tokens over the steps: exact
for a linear model). A llama-bench test (one sequence, at depth d) gives one: its prompt and its
generation summed. Unmodelled, so left in the residual: the one logits row of each prompt, KV
padding (llama.cpp attends whole blocks of cells), and speed changes with cache size.

The fit is least squares on relative residuals (each observation weighted by 1/its seconds: a
0.02 s decode step counts as much as a 5 s prefill), with the coefficients constrained to be
non-negative (scipy's NNLS). Its error is kept two ways: `relative_rms`, the spread of
(predicted - measured) / measured with the degrees of freedom taken out, and each coefficient's
standard error from the linearised covariance (for a coefficient held at 0 by the constraint, the
unconstrained one). `CostCurves.bounds(confidence)` scales the whole curve by 1 -/+ z x
relative_rms: the simulation runs the low and the high curve for an interval.

`costs.json` (schema `quantload.costs/1`, rundir.COSTS_JSON) keeps the model file, its size and
quantization type, the threads and -b/-ub, the llama.cpp build, every raw row and the fit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy.optimize import nnls
from scipy.stats import norm

from quantload.errors import MeasurementError
from quantload.llamacpp.batched_bench import BatchedBenchResult, BatchedBenchRow
from quantload.llamacpp.bench import BenchRecord
from quantload.models.gguf_meta import read_gguf
from quantload.rundir import read_json, write_json_atomic

COSTS_SCHEMA: Final = "quantload.costs/1"
TERMS: tuple[str, ...] = (
    "per_ubatch_s",
    "per_prompt_token_s",
    "per_decode_token_s",
    "per_decode_kv_token_s",
    "per_prompt_pair_s",
)
_BUILD = re.compile(r"build (\d+)")


@dataclass(frozen=True)
class Work:
    """What one or more llama_decode calls did, in the five terms of the model."""

    ubatches: float = 0.0
    prompt_tokens: float = 0.0
    decode_tokens: float = 0.0
    decode_kv_tokens: float = 0.0
    prompt_pairs: float = 0.0

    def vector(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        """The terms in TERMS order."""
        return np.array(
            [self.ubatches, self.prompt_tokens, self.decode_tokens, self.decode_kv_tokens, self.prompt_pairs],
            dtype=np.float64,
        )

    def __add__(self, other: Work) -> Work:
        return Work(*(a + b for a, b in zip(self.vector(), other.vector(), strict=True)))


@dataclass(frozen=True)
class Observation:
    """Measured seconds of some work, and where they come from (for error messages and plots)."""

    work: Work
    seconds: float
    source: str


def ubatches_of(tokens: int, n_batch: int, n_ubatch: int) -> int:
    """Graph computations for `tokens` decoded in calls of at most `n_batch`, ubatches of `n_ubatch`."""
    full, rest = divmod(tokens, n_batch)
    return full * -(-n_batch // n_ubatch) + -(-rest // n_ubatch)


def prompt_pairs(prompt: int, held: int = 0) -> float:
    """(query, key) pairs of a `prompt`-token prompt on a sequence already holding `held` tokens."""
    return prompt * held + prompt * (prompt + 1) / 2


def prefill_work(prompt: int, prompts: int, n_batch: int, n_ubatch: int, depth: int = 0) -> Work:
    """`prompts` prompts of `prompt` tokens each, in one batch, on sequences holding `depth`."""
    return Work(
        ubatches=ubatches_of(prompts * prompt, n_batch, n_ubatch),
        prompt_tokens=prompts * prompt,
        prompt_pairs=prompts * prompt_pairs(prompt, depth),
    )


def decode_work(steps: int, sequences: int, held: int, n_ubatch: int) -> Work:
    """`steps` decode calls of one token for each of `sequences` sequences holding `held` tokens
    each before the first."""
    return Work(
        ubatches=steps * -(-sequences // n_ubatch),
        decode_tokens=steps * sequences,
        decode_kv_tokens=sequences * (steps * held + steps * (steps - 1) / 2),
    )


def batched_bench_observations(
    rows: Sequence[BatchedBenchRow], n_batch: int, n_ubatch: int
) -> list[Observation]:
    """Two observations per row: its prefill (T_PP) and its decode steps (T_TG)."""
    found: list[Observation] = []
    for row in rows:
        pp, tg, b = row.prompt_tokens, row.gen_tokens, row.sequences
        name = f"batched-bench pp{pp} tg{tg} B{b}"
        prompts = 1 if row.prompt_shared else b
        found.append(
            Observation(prefill_work(pp, prompts, n_batch, n_ubatch), row.prompt_s, f"{name} prefill")
        )
        found.append(Observation(decode_work(tg, b, pp, n_ubatch), row.gen_s, f"{name} decode"))
    return found


def bench_observations(records: Sequence[BenchRecord]) -> list[Observation]:
    """One observation per llama-bench test: its prompt at its depth, then its generation."""
    found: list[Observation] = []
    for record in records:
        work = Work()
        if record.n_prompt > 0:
            work += prefill_work(record.n_prompt, 1, record.n_batch, record.n_ubatch, record.n_depth)
        if record.n_gen > 0:
            work += decode_work(record.n_gen, 1, record.n_depth + record.n_prompt, record.n_ubatch)
        name = f"llama-bench pp{record.n_prompt} tg{record.n_gen} d{record.n_depth}"
        found.append(Observation(work, record.avg_ns / 1e9, name))
    return found


class CostFit(BaseModel):
    """The fitted coefficients (seconds per unit of each term), their errors, and the setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    coefficients: dict[str, float] = Field(description="TERMS -> seconds per unit")
    stderr: dict[str, float] = Field(description="TERMS -> standard error of the coefficient")
    relative_rms: float = Field(description="sqrt(sum(r^2)/(n-k)), r = (predicted-measured)/measured")
    relative_max: float = Field(description="max |r| over the observations")
    observations: int
    n_batch: int
    n_ubatch: int
    residuals: dict[str, float] = Field(default_factory=dict, description="source -> r")


def fit_observations(observations: Sequence[Observation], n_batch: int, n_ubatch: int) -> CostFit:
    """Non-negative least squares on relative residuals; MeasurementError in one line when the
    observations cannot determine the five terms."""
    k = len(TERMS)
    if len(observations) <= k:
        raise MeasurementError(
            f"fitting cost curves needs more than {k} observations, got {len(observations)}",
            "give llama-batched-bench several -npp and -npl values (each row is two observations)",
        )
    bad = [o.source for o in observations if not (o.seconds > 0 and math.isfinite(o.seconds))]
    if bad:
        raise MeasurementError(f"cost curves need positive measured seconds; {bad[0]} has none")
    x = np.array([o.work.vector() for o in observations])
    y = np.array([o.seconds for o in observations])
    a = x / y[:, None]
    scale = np.linalg.norm(a, axis=0)
    if np.any(scale == 0) or np.linalg.matrix_rank(a / np.where(scale == 0, 1, scale)) < k:
        raise MeasurementError(
            "the rows cannot separate the five cost terms (fixed, prompt, decode, KV, attention)",
            "measure at least two prompt lengths and two sequence counts, with decode steps",
        )
    scaled_a = a / scale
    solution, _ = nnls(scaled_a, np.ones(len(y)))
    coefficients = solution / scale
    relative = a @ coefficients - 1.0
    rms = float(math.sqrt(float(relative @ relative) / (len(y) - k)))
    covariance = rms**2 * np.linalg.pinv(scaled_a.T @ scaled_a)
    stderr = np.sqrt(np.clip(np.diag(covariance), 0, None)) / scale
    return CostFit(
        coefficients={term: float(c) for term, c in zip(TERMS, coefficients, strict=True)},
        stderr={term: float(s) for term, s in zip(TERMS, stderr, strict=True)},
        relative_rms=rms,
        relative_max=float(np.max(np.abs(relative))),
        observations=len(y),
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        residuals={o.source: round(float(r), 6) for o, r in zip(observations, relative, strict=True)},
    )


@dataclass(frozen=True)
class CostCurves:
    """A BatchCost from fitted coefficients (seconds per unit of each of TERMS)."""

    coefficients: tuple[float, ...]
    n_batch: int
    n_ubatch: int
    relative_rms: float = 0.0

    @classmethod
    def from_fit(cls, fit: CostFit) -> CostCurves:
        return cls(
            tuple(fit.coefficients[term] for term in TERMS), fit.n_batch, fit.n_ubatch, fit.relative_rms
        )

    def work_s(self, work: Work) -> float:
        """Seconds of `work` (one call's, or several summed)."""
        return float(np.dot(self.coefficients, work.vector()))

    def batch_s(self, prompt_tokens: int, decode_tokens: int, kv_tokens: int) -> float:
        """Seconds of one llama_decode call (BatchCost). The prompt tokens are taken as one
        sequence's; with decoded tokens in the call, `kv_tokens` are the decoding sequences' (the
        usual batch: generating slots plus the start of one new prompt); without, the prompt's own
        sequence's (a later chunk of a long prompt). A simulator that knows more calls `work_s`."""
        tokens = prompt_tokens + decode_tokens
        if tokens <= 0:
            return 0.0
        held_by_prompt = kv_tokens if decode_tokens == 0 else 0
        return self.work_s(
            Work(
                ubatches=-(-tokens // self.n_ubatch),
                prompt_tokens=prompt_tokens,
                decode_tokens=decode_tokens,
                decode_kv_tokens=kv_tokens if decode_tokens > 0 else 0,
                prompt_pairs=prompt_pairs(prompt_tokens, held_by_prompt),
            )
        )

    def scaled(self, factor: float) -> CostCurves:
        """Every cost times `factor` (> 0)."""
        if not factor > 0:
            raise ValueError(f"a cost scale factor must be positive, got {factor}")
        return replace(self, coefficients=tuple(c * factor for c in self.coefficients))

    def bounds(self, confidence: float = 0.9) -> tuple[CostCurves, CostCurves]:
        """The (low, high) curves: this one scaled by 1 -/+ z x relative_rms, z the two-sided
        normal quantile of `confidence`; low never below 1 % of this curve."""
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
        spread = float(norm.ppf(0.5 + confidence / 2)) * self.relative_rms
        return self.scaled(max(0.01, 1 - spread)), self.scaled(1 + spread)


class CostsFile(BaseModel):
    """The whole costs.json: what was measured, on what, and the fit."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal["quantload.costs/1"] = Field(default=COSTS_SCHEMA, alias="schema")
    model_path: str
    model_size_bytes: int
    quant_type: str = Field(description="the file's general.file_type, e.g. Q4_K_M")
    n_threads: int
    n_batch: int
    n_ubatch: int
    build_number: int | None = Field(description="llama.cpp's build number, as its tools report it")
    llama_cpp: dict[str, Any] = Field(default_factory=dict, description="Toolchain.version_record()")
    batched_bench: BatchedBenchResult
    bench: list[BenchRecord] = Field(default_factory=list, description="llama-bench records used")
    fit: CostFit

    def curves(self) -> CostCurves:
        return CostCurves.from_fit(self.fit)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def _build_number(result: BatchedBenchResult, bench: Sequence[BenchRecord]) -> int | None:
    if bench:
        return bench[0].build_number
    found = _BUILD.search(str(result.llama_cpp.get("binary_version", "")))
    return int(found.group(1)) if found else None


def fit_costs(
    result: BatchedBenchResult, quant_type: str | None = None, bench: Sequence[BenchRecord] = ()
) -> CostsFile:
    """Fit cost curves to a llama-batched-bench run and, optionally, llama-bench records of the
    same -b/-ub and threads; `quant_type` None reads it from the model file."""
    settings = result.settings
    if not result.rows:
        raise MeasurementError("llama-batched-bench gave no rows to fit cost curves to")
    for record in bench:
        ours = (settings.n_batch, settings.n_ubatch, settings.n_threads)
        theirs = (record.n_batch, record.n_ubatch, record.n_threads)
        if theirs != ours:
            raise MeasurementError(
                f"a llama-bench record ran with -b/-ub/-t {theirs}, llama-batched-bench with {ours}",
                "fit curves to runs of one setting",
            )
    observations = batched_bench_observations(result.rows, settings.n_batch, settings.n_ubatch)
    observations += bench_observations(bench)
    fit = fit_observations(observations, settings.n_batch, settings.n_ubatch)
    if quant_type is None:
        quant_type = read_gguf(Path(result.model_path)).file_type
    return CostsFile(
        model_path=result.model_path,
        model_size_bytes=result.model_size_bytes,
        quant_type=quant_type,
        n_threads=settings.n_threads,
        n_batch=settings.n_batch,
        n_ubatch=settings.n_ubatch,
        build_number=_build_number(result, bench),
        llama_cpp=result.llama_cpp,
        batched_bench=result,
        bench=list(bench),
        fit=fit,
    )


def write_costs_file(path: Path, costs: CostsFile) -> None:
    """Write costs.json whole (a reader never sees half of it)."""
    write_json_atomic(path, costs.to_json())


def load_costs_file(path: Path) -> CostsFile:
    """Read a costs.json; ValueError (pydantic's ValidationError included) when it is not one."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return CostsFile.model_validate(data)
