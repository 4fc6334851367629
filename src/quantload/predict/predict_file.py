"""Reading `predict.json` (schema `quantload.predict/1`, written by quantload.predict.prediction):
the typed view the report reads, per quantization the predicted limit with its interval and each
level's predicted percentiles and where a request's time goes.

The reader is bounded: a file over MAX_PREDICT_BYTES is refused unread, and the JSON itself is
parsed within the bounds every reader keeps (quantload.json_input)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from quantload.predict.prediction import PREDICT_SCHEMA
from quantload.rundir import read_json

MAX_PREDICT_BYTES = 16 * 1024 * 1024  # levels of a few files; a real one is far smaller


class _Read(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class PredictedSlo(_Read):
    """The SLO the prediction judged its levels against."""

    ttft_s: float
    ttft_percentile: str
    tpot_s: float
    tpot_percentile: str


class PredictedLevel(_Read):
    """One predicted level (quantload.predict.limit.LevelPrediction)."""

    level: float
    ttft_s: float | None = None  # at the SLO's TTFT percentile
    tpot_s: float | None = None  # at the SLO's TPOT percentile
    ttft_p50_s: float | None = None
    tpot_p50_s: float | None = None
    queue_share: float = 0.0
    prefill_share: float = 0.0
    decode_share: float = 0.0
    meets: bool = False


class PredictedSearch(_Read):
    """The limit search predicted on the levels' verdicts (quantload.predict.search): the limit it
    shows, where its misses begin, its undecided levels and its simulated seconds."""

    limit: float | None = None
    lowest_miss: float | None = None
    undecided: tuple[float, ...] = ()
    ending: str = ""
    seconds: float = 0.0


class PredictedLimit(_Read):
    """The limit (None: not even the lowest level meets), its interval and every level under the
    point cost, the slowest cost (`levels_low`) and the fastest (`levels_high`); the predicted
    limit search under the same three costs where the prediction ran it."""

    slo: PredictedSlo
    arrival: str = "closed"
    limit: float | None = None
    limit_low: float | None = None
    limit_high: float | None = None
    levels: tuple[PredictedLevel, ...] = ()
    levels_low: tuple[PredictedLevel, ...] = ()
    levels_high: tuple[PredictedLevel, ...] = ()
    search: PredictedSearch | None = None
    search_low: PredictedSearch | None = None
    search_high: PredictedSearch | None = None


class PredictedFile(_Read):
    """One file's prediction and what it assumed."""

    label: str
    model_path: str = ""
    workload: str = ""
    requests_per_level: int = 0
    cost_error_rms: float = 0.0
    cost_confidence: float = 0.0
    limit: PredictedLimit


class PredictFile(_Read):
    """The whole predict.json: predictions by label (the quantization)."""

    schema_id: str = Field(alias="schema")
    predictions: dict[str, PredictedFile] = Field(default_factory=dict)


def load_predict_file(path: Path) -> PredictFile:
    """Read a predict.json; ValueError (pydantic's ValidationError included) when it is not one or
    is larger than MAX_PREDICT_BYTES."""
    size = path.stat().st_size
    if size > MAX_PREDICT_BYTES:
        raise ValueError(f"{size} bytes, more than the {MAX_PREDICT_BYTES} a predict.json may hold")
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("schema") != PREDICT_SCHEMA:
        raise ValueError(f"schema {data.get('schema')!r}, not {PREDICT_SCHEMA}")
    return PredictFile.model_validate(data)
