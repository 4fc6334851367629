"""`quality.json`: the perplexity of every model file of a run, and its KL divergence from F16.

Schema `quantload.quality/2` (a `quantload.quality/1` file, which has no `kld`, still reads)::

    {
      "schema": "quantload.quality/2",
      "results": {                       # one entry per quantization, keyed by its name
        "F16":  QualityResult,           # e.g. "F16", "Q8_0", "Q4_K_M" (the GGUF file type)
        "Q8_0": QualityResult
      },
      "kld": KldSet or null              # see quantload.quality.kld_results
    }

QualityResult (every field always present):
  quant, model_path, model_name, model_size_bytes   which file was measured
  dataset {name, path, size_bytes, sha256}          which text
  ctx_tokens, batch_tokens, chunks_requested        settings (chunks_requested 0 = every chunk)
  threads                                           llama-perplexity -t (0 = its default)
  chunks_scored, tokens_scored                      what the estimate rests on
  perplexity, perplexity_error                      final estimate and its +/- (one standard error)
  running_perplexity[]                              as printed after each chunk (cumulative)
  chunk_perplexity[]                                each chunk alone, derived from running values
  wall_time_s, command[], llama_cpp{}, measured_at  how and when it ran
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantload.errors import ConfigError
from quantload.quality.dataset import DatasetInfo
from quantload.quality.kld_results import KldBase, KldResult, KldSet
from quantload.rundir import read_json, write_json_atomic

QUALITY_SCHEMA: Final = "quantload.quality/2"


class QualityResult(BaseModel):
    """Perplexity of one model file on one text, with the settings it was measured under."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quant: str = Field(description="the file's quantization, e.g. Q4_K_M")
    model_path: str
    model_name: str
    model_size_bytes: int
    dataset: DatasetInfo
    ctx_tokens: int
    batch_tokens: int
    chunks_requested: int = Field(description="--chunks as asked; 0 = every chunk of the text")
    threads: int = Field(description="llama-perplexity -t; 0 = its default")
    chunks_scored: int
    tokens_scored: int = Field(description="chunks_scored x (ctx_tokens - ctx_tokens/2 - 1)")
    perplexity: float
    perplexity_error: float = Field(description="llama-perplexity's +/-: one standard error")
    running_perplexity: list[float] = Field(description="cumulative value after each chunk")
    chunk_perplexity: list[float] = Field(description="each chunk's own value (derived)")
    wall_time_s: float
    command: list[str]
    llama_cpp: dict[str, Any] = Field(description="Toolchain.version_record()")
    measured_at: str = Field(description="UTC time the run finished, ISO 8601")


class QualityFile(BaseModel):
    """The whole `quality.json`: perplexity keyed by quantization name, and the KLD set."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_id: Literal["quantload.quality/1", "quantload.quality/2"] = Field(
        default=QUALITY_SCHEMA, alias="schema"
    )
    results: dict[str, QualityResult] = Field(default_factory=dict)
    kld: KldSet | None = None

    def with_result(self, label: str, result: QualityResult) -> QualityFile:
        """A copy with `result` stored (or replaced) under `label`."""
        return self.model_copy(
            update={"results": {**self.results, label: result}, "schema_id": QUALITY_SCHEMA}
        )

    def with_kld_base(self, base: KldBase) -> QualityFile:
        """A copy whose KLD set rests on `base`: kept if it is the same base, else started anew."""
        kld = self.kld if self.kld is not None and self.kld.same_base(base) else None
        kld = KldSet(base=base, results=kld.results if kld else {})
        return self.model_copy(update={"kld": kld, "schema_id": QUALITY_SCHEMA})

    def with_kld_result(self, label: str, cache_type: str, result: KldResult) -> QualityFile:
        """A copy with one KLD result added to the current set (which must exist)."""
        if self.kld is None:
            raise ValueError("no KLD base recorded yet: store the base first")
        return self.model_copy(update={"kld": self.kld.with_result(label, cache_type, result)})

    def to_json(self) -> dict[str, Any]:
        """The JSON object as written to disk."""
        return self.model_dump(mode="json", by_alias=True)


def load_quality_file(path: Path) -> QualityFile:
    """Read and validate a quality.json; ConfigError if it is not one."""
    try:
        return QualityFile.model_validate(read_json(path))
    except (ValueError, ValidationError) as error:
        raise ConfigError(
            f"{path} is not a quantload.quality file ({str(error).splitlines()[0]})",
            "choose another output file, or delete this one",
        ) from None


def save_quality_result(path: Path, label: str, result: QualityResult) -> QualityFile:
    """Add `result` under `label` to the file at `path` (created if absent), atomically."""
    return _update(path, lambda current: current.with_result(label, result))


def _update(path: Path, change: Callable[[QualityFile], QualityFile]) -> QualityFile:
    current = load_quality_file(path) if path.exists() else QualityFile()
    updated = change(current)
    write_json_atomic(path, updated.to_json())
    return updated


def save_kld_base(path: Path, base: KldBase) -> QualityFile:
    """Record the KLD base in the file at `path` (results of another base are dropped)."""
    return _update(path, lambda current: current.with_kld_base(base))


def save_kld_result(path: Path, label: str, cache_type: str, result: KldResult) -> QualityFile:
    """Add one KLD result to the file at `path`, whose base is already recorded."""
    return _update(path, lambda current: current.with_kld_result(label, cache_type, result))
