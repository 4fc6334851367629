"""Measuring one model file's perplexity; `measure_file_quality` is the quality step that
`quantload quality` and `quantload run` (through RunSteps) call."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from quantload.config import QualitySettings
from quantload.llamacpp.perplexity import run_perplexity
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.gguf_meta import read_gguf
from quantload.progress import ProgressCallback, no_progress
from quantload.quality.dataset import describe_dataset
from quantload.quality.results import QualityResult, save_quality_result


def measure_file_quality(
    toolchain: Toolchain,
    model_path: Path,
    text: Path,
    settings: QualitySettings,
    label: str,
    progress: ProgressCallback = no_progress,
    out: Path | None = None,
    log_path: Path | None = None,
) -> QualityResult:
    """The quality step: perplexity of `model_path` on `text` with llama-perplexity and the
    [quality] settings (`ctx`, `chunks` (0 = all), `threads`, `timeout_s`); with `out`, added to
    that quality.json under `label`.

    Raises ModelError for a file that is not a loadable GGUF, MeasurementError for a run that did
    not produce a complete, consistent result (too-short text, killed, timed out, truncated).
    With `log_path`, llama-perplexity's output is appended there as it comes.
    """
    summary = read_gguf(model_path)
    dataset = describe_dataset(text)
    run = run_perplexity(
        toolchain, model_path, text, settings.ctx, settings.chunks, settings.threads, progress,
        settings.timeout_s, log_path=log_path,
    )  # fmt: skip
    output = run.output
    result = QualityResult(
        quant=summary.file_type,
        model_path=str(model_path),
        model_name=summary.name,
        model_size_bytes=summary.size_bytes,
        dataset=dataset,
        ctx_tokens=output.ctx_tokens,
        batch_tokens=output.batch_tokens,
        chunks_requested=settings.chunks,
        threads=settings.threads,
        chunks_scored=output.n_chunks,
        tokens_scored=output.tokens_scored,
        perplexity=output.perplexity,
        perplexity_error=output.perplexity_error,
        running_perplexity=list(output.running_perplexity),
        chunk_perplexity=[round(value, 4) for value in output.chunk_perplexity()],
        wall_time_s=round(run.wall_time_s, 3),
        command=list(run.command),
        llama_cpp=toolchain.version_record(),
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    if out is not None:
        save_quality_result(out, label, result)
    return result
