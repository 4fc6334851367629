"""Measuring every file's KL divergence from the F16 of its set: the step `quality` and `run` call.

One base run on the reference (F16) file writes its token distributions to a file in the cache;
then each file, the reference itself included (the floor), is compared with it, first with the
f16 KV cache (the weights' own loss), then with each other KV-cache type in
`quality.kld_cache_types` (the cache's added loss). Results are appended to `quality.json` as
each run ends. The base file is removed at the end unless `quality.kld_keep_base` is set; a kept
file is reused by a later measurement of the same file, text and settings.
"""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, TypeVar

from pydantic import ValidationError

from quantload.config import QualitySettings
from quantload.errors import ConfigError, MeasurementError, ModelError
from quantload.llamacpp.kld import (
    MIN_TOKENS_FOR_STATISTICS,
    KldRun,
    needs_flash_attention,
    run_base,
    run_compare,
)
from quantload.llamacpp.kld_base import (
    base_file_size_bytes,
    check_base_file,
    check_free_space,
    owner_tag,
    remove_orphans,
)
from quantload.llamacpp.perplexity import tokens_scored_per_chunk
from quantload.llamacpp.tool_run import ToolRun, run_tool
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.gguf_meta import read_gguf
from quantload.models.gguf_scan import scan_gguf
from quantload.models.manifest import Manifest, load_manifest, sha256_of
from quantload.progress import ProgressCallback, no_progress
from quantload.quality.dataset import describe_dataset
from quantload.quality.kld_results import (
    FLOOR_CACHE_TYPE,
    KldBase,
    KldResult,
    KldSet,
    chunk_standard_error,
    finite_or_none,
)
from quantload.quality.results import save_kld_base, save_kld_result
from quantload.rundir.handle import RunDir

BASE_FOLDER = "kld"
REFERENCE_QUANT = "F16"
NO_REFERENCE = "no F16, BF16 or F32 file among the run's files to measure KLD against"
LOWER_CHUNKS_WITH = "quality.kld_chunks (--kld-chunks)"

T = TypeVar("T")


class RunAttempt(Protocol):
    """Runs the body of one llama-perplexity run, titled, for one file label (None: the base).

    It hands the body a progress callback and returns the body's result, or None when the body
    failed and the attempt recorded the failure (an attempt that records nothing lets it through).
    """

    def __call__(self, title: str, label: str | None, body: Callable[[ProgressCallback], T]) -> T | None: ...


def attempt_quietly(title: str, label: str | None, body: Callable[[ProgressCallback], T]) -> T | None:
    """A RunAttempt that shows nothing and lets every error through."""
    return body(no_progress)


@dataclass(frozen=True)
class KldFile:
    """One file to compare with the reference, under the label its results are filed by."""

    label: str
    path: Path


def vocabulary_size(model: Path) -> int:
    """Rows of the token embedding: the vocabulary llama.cpp scores (ModelError if unknown)."""
    scan = scan_gguf(model)
    architecture = str(scan.metadata.get("general.architecture", ""))
    embedding = scan.metadata.get(f"{architecture}.embedding_length")
    tensor = scan.tensors.get("token_embd.weight")
    if tensor is not None and isinstance(embedding, int) and embedding > 0:
        return tensor.n_elements // embedding
    declared = scan.metadata.get(f"{architecture}.vocab_size")
    if isinstance(declared, int) and declared > 0:
        return declared
    raise ModelError(
        f"{model}: cannot tell its vocabulary size (no token_embd.weight, no vocab_size)",
        "set quality.kld = false for this model",
    )


def planned_chunks(quality: QualitySettings, text_bytes: int) -> int:
    """Chunks the base will hold: quality.kld_chunks, or at most one per ctx bytes of text (0 = all).

    With 0 the count is an upper bound: a token is at least one byte of text.
    """
    if quality.kld_chunks > 0:
        return quality.kld_chunks
    return max(1, text_bytes // quality.ctx)


def check_enough_tokens(quality: QualitySettings) -> None:
    """ConfigError when the chunks asked for score too few tokens for llama-perplexity's statistics."""
    if quality.kld_chunks == 0:
        return
    scored = quality.kld_chunks * tokens_scored_per_chunk(quality.ctx)
    if scored < MIN_TOKENS_FOR_STATISTICS:
        raise ConfigError(
            f"quality.kld_chunks = {quality.kld_chunks} chunks of quality.ctx = {quality.ctx} tokens"
            f" score {scored} tokens; llama-perplexity prints KLD statistics from"
            f" {MIN_TOKENS_FOR_STATISTICS} on",
            "raise quality.kld_chunks (--kld-chunks) or quality.ctx",
        )


def _base_key(model_sha256: str, dataset_sha256: str, quality: QualitySettings, llama: str) -> str:
    identity = json.dumps([model_sha256, dataset_sha256, quality.ctx, quality.kld_chunks, llama])
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _kept_base(path: Path, record: Path) -> KldBase | None:
    """The record of a kept base whose file is whole, or None."""
    if not (path.is_file() and record.is_file()):
        return None
    try:
        base = KldBase.model_validate_json(record.read_text(encoding="utf-8"))
        header = check_base_file(path)
    except (ValidationError, ValueError, MeasurementError):
        return None
    if header.expected_size_bytes != base.file_size_bytes:
        return None
    return base.model_copy(update={"reused": True, "kept": True, "file_path": str(path)})


@dataclass(frozen=True)
class PreparedBase:
    """A base logits file ready to compare against, and whether to remove it after use."""

    record: KldBase
    path: Path
    remove_after_use: bool


def prepare_base(
    toolchain: Toolchain,
    reference: Path,
    dataset: Path,
    cache_dir: Path,
    quality: QualitySettings,
    source_note: str | None = None,
    progress: ProgressCallback = no_progress,
    log_path: Path | None = None,
    runner: Callable[..., ToolRun] = run_tool,
) -> PreparedBase:
    """Write (or, when kept from before, reuse) the reference's base logits file in the cache.

    The file's size is computed first and the free disk checked against it (ConfigError naming
    the size and quality.kld_chunks). A failed run leaves no file behind.
    """
    check_enough_tokens(quality)
    summary = read_gguf(reference)
    dataset_info = describe_dataset(dataset)
    model_sha256 = sha256_of(reference)
    n_vocab = vocabulary_size(reference)
    folder = cache_dir / BASE_FOLDER
    key = _base_key(model_sha256, dataset_info.sha256, quality, toolchain.label)
    kept_path, record_path = folder / f"{key}.logits", folder / f"{key}.json"
    if quality.kld_keep_base and (kept := _kept_base(kept_path, record_path)) is not None:
        return PreparedBase(kept, kept_path, remove_after_use=False)
    remove_orphans(folder)  # what killed runs left behind counts against the free space
    predicted = base_file_size_bytes(n_vocab, quality.ctx, planned_chunks(quality, dataset_info.size_bytes))
    check_free_space(folder, predicted, LOWER_CHUNKS_WITH)
    # A base used once gets a name of its own, so two measurements at once never share a file.
    own_name = f"{key}-{owner_tag()}-{secrets.token_hex(4)}.logits"
    path = kept_path if quality.kld_keep_base else folder / own_name
    run, header = run_base(
        toolchain, reference, dataset, path, quality.ctx, quality.kld_chunks, quality.threads,
        progress, quality.timeout_s, runner, log_path,
    )  # fmt: skip
    if header.n_vocab != n_vocab:
        path.unlink(missing_ok=True)
        raise MeasurementError(
            f"{reference}: llama-perplexity scored a vocabulary of {header.n_vocab:,} tokens, the file's"
            f" embedding has {n_vocab:,} rows",
            "report this as a quantload bug",
        )
    record = KldBase(
        quant=summary.file_type,
        model_path=str(reference),
        model_name=summary.name,
        model_size_bytes=summary.size_bytes,
        model_sha256=model_sha256,
        source_note=source_note,
        dataset=dataset_info,
        ctx_tokens=header.ctx_tokens,
        chunks_requested=quality.kld_chunks,
        chunks_scored=header.n_chunks,
        tokens_scored=header.tokens_scored,
        n_vocab=header.n_vocab,
        predicted_size_bytes=predicted,
        file_size_bytes=path.stat().st_size,
        file_path=str(path),
        kept=quality.kld_keep_base,
        reused=False,
        perplexity=run.output.perplexity,
        perplexity_error=run.output.perplexity_error,
        wall_time_s=round(run.wall_time_s, 3),
        other_cpu_frac=run.other_cpu_frac,
        command=list(run.command),
        llama_cpp=toolchain.version_record(),
        measured_at=_now(),
    )
    if quality.kld_keep_base:
        record_path.write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return PreparedBase(record, path, remove_after_use=not quality.kld_keep_base)


def _result(
    run: KldRun, base: KldBase, file: KldFile, cache_type: str, reference: Path, toolchain: Toolchain
) -> KldResult:
    stats = run.output.statistics
    quantiles = dict(stats.kld_quantiles)
    # PPL(Q) against the reference's own perplexity, both from full-precision logits on the same
    # tokens; the uncertainty is the paired one of ln(PPL(Q)/PPL(base)).
    ratio = stats.ppl_q.value / base.perplexity
    return KldResult(
        quant=file.label,
        model_path=str(file.path),
        model_size_bytes=file.path.stat().st_size,
        cache_type_k=cache_type,
        cache_type_v=cache_type,
        flash_attn="on" if needs_flash_attention(cache_type) else "auto",
        is_floor=file.path.resolve() == reference.resolve() and cache_type == base.cache_type,
        chunks_scored=run.output.n_chunks,
        tokens_scored=run.output.tokens_scored,
        kld_mean_nats=stats.kld_mean.value,
        kld_mean_error_nats=finite_or_none(stats.kld_mean.error),
        kld_mean_chunk_error_nats=chunk_standard_error([row.kld_mean for row in run.output.rows]),
        kld_median_nats=quantiles["median"],
        kld_p99_nats=quantiles["p99"],
        kld_p99_9_nats=quantiles["p99_9"],
        kld_max_nats=quantiles["max"],
        kld_quantiles_nats=quantiles,
        same_top_p_pct=stats.same_top_p_pct.value,
        same_top_p_error_pct=finite_or_none(stats.same_top_p_pct.error),
        delta_p_rms_pct=stats.delta_p_rms_pct.value,
        delta_p_rms_error_pct=finite_or_none(stats.delta_p_rms_pct.error),
        delta_p_mean_pct=stats.delta_p_mean_pct.value,
        delta_p_mean_error_pct=finite_or_none(stats.delta_p_mean_pct.error),
        delta_p_quantiles_pct=dict(stats.delta_p_quantiles_pct),
        ln_ppl_ratio=stats.ln_ppl_ratio.value,
        ln_ppl_ratio_error=finite_or_none(stats.ln_ppl_ratio.error),
        ppl_ratio=stats.ppl_ratio.value,
        ppl_ratio_error=finite_or_none(stats.ppl_ratio.error),
        ppl_change_pct=round(100.0 * (ratio - 1.0), 6),
        ppl_change_error_pct=finite_or_none(round(100.0 * ratio * stats.ln_ppl_ratio.error, 6)),
        ppl_q=stats.ppl_q.value,
        ppl_q_error=finite_or_none(stats.ppl_q.error),
        ppl_base=stats.ppl_base.value,
        ppl_base_error=finite_or_none(stats.ppl_base.error),
        ppl_diff=stats.ppl_diff.value,
        ppl_diff_error=finite_or_none(stats.ppl_diff.error),
        ln_ppl_correlation_pct=finite_or_none(stats.ln_ppl_correlation_pct),
        running_kld_mean_nats=[row.kld_mean for row in run.output.rows],
        wall_time_s=round(run.wall_time_s, 3),
        other_cpu_frac=run.other_cpu_frac,
        command=list(run.command),
        llama_cpp=toolchain.version_record(),
        measured_at=_now(),
    )


def compare_file(
    toolchain: Toolchain,
    prepared: PreparedBase,
    file: KldFile,
    cache_type: str,
    reference: Path,
    quality: QualitySettings,
    progress: ProgressCallback = no_progress,
    log_path: Path | None = None,
    runner: Callable[..., ToolRun] = run_tool,
) -> KldResult:
    """One file, with one KV-cache type, against the base; MeasurementError if it does not fit."""
    base = prepared.record
    n_vocab = vocabulary_size(file.path)
    if n_vocab != base.n_vocab:
        raise MeasurementError(
            f"{file.path} has a {n_vocab:,}-token vocabulary, the KLD base ({base.model_path}) has"
            f" {base.n_vocab:,}: they are not one model",
            "compare files of one model only",
        )
    run = run_compare(
        toolchain, file.path, prepared.path, base.ctx_tokens, cache_type, quality.threads, progress,
        quality.timeout_s, runner, log_path,
    )  # fmt: skip
    if (run.output.ctx_tokens, run.output.n_chunks) != (base.ctx_tokens, base.chunks_scored):
        raise MeasurementError(
            f"llama-perplexity compared {run.output.n_chunks} chunks of {run.output.ctx_tokens}"
            f" tokens; the base holds {base.chunks_scored} of {base.ctx_tokens}",
            "report this as a quantload bug",
        )
    return _result(run, base, file, cache_type, reference, toolchain)


def with_floor(reference: Path, files: Sequence[KldFile], label: str = REFERENCE_QUANT) -> list[KldFile]:
    """`files`, with the reference first (it is the floor); added under `label` when missing."""
    resolved = reference.resolve()
    ordered = [file for file in files if file.path.resolve() == resolved][:1]
    if not ordered:
        ordered = [KldFile(label, reference)]
    return ordered + [file for file in files if file.path.resolve() != resolved]


def _log(log_dir: Path | None, name: str) -> Path | None:
    return None if log_dir is None else log_dir / f"llama-perplexity-kld-{name}.log"


def measure_kld_set(
    toolchain: Toolchain,
    reference: Path,
    files: Sequence[KldFile],
    dataset: Path,
    cache_dir: Path,
    quality: QualitySettings,
    out_path: Path | None = None,
    source_note: str | None = None,
    attempt: RunAttempt = attempt_quietly,
    log_dir: Path | None = None,
    runner: Callable[..., ToolRun] = run_tool,
) -> KldSet | None:
    """KLD of every file (and the floor) against `reference`, per KV-cache type in `quality`.

    Each llama-perplexity run is one `attempt`; results go to `out_path` (quality.json) as each
    run ends. Returns the set, or None when the base could not be made (an attempt that records
    failures). The base file is removed at the end unless quality.kld_keep_base.
    """

    def base_run(progress: ProgressCallback) -> PreparedBase:
        return prepare_base(
            toolchain, reference, dataset, cache_dir, quality, source_note, progress,
            _log(log_dir, "base"), runner,
        )  # fmt: skip

    prepared = attempt(f"KLD base {reference.name}", None, base_run)
    if prepared is None:
        return None
    kld = KldSet(base=prepared.record)
    try:
        if out_path is not None:
            save_kld_base(out_path, prepared.record)
        for cache_type in quality.kld_cache_types or (FLOOR_CACHE_TYPE,):
            for file in with_floor(reference, files, prepared.record.quant):
                # called with the attempt's progress callback
                compare_run = functools.partial(
                    compare_file, toolchain, prepared, file, cache_type, reference, quality,
                    log_path=_log(log_dir, f"{file.label}-{cache_type}"), runner=runner,
                )  # fmt: skip
                title = f"KLD {file.label}" + (f" KV {cache_type}" if cache_type != FLOOR_CACHE_TYPE else "")
                result = attempt(title, file.label, compare_run)
                if result is None:
                    continue
                kld = kld.with_result(file.label, cache_type, result)
                if out_path is not None:
                    save_kld_result(out_path, file.label, cache_type, result)
    finally:
        if prepared.remove_after_use:
            prepared.path.unlink(missing_ok=True)
    return kld


def measure_manifest_kld(
    toolchain: Toolchain,
    manifest: Manifest,
    quants: Sequence[str],
    dataset: Path,
    cache_dir: Path,
    quality: QualitySettings,
    out_path: Path | None = None,
    attempt: RunAttempt = attempt_quietly,
    log_dir: Path | None = None,
) -> KldSet | None:
    """`measure_kld_set` for a prepared model: its reference (the F16, BF16 or F32 file) is the
    base, `quants` are compared.

    The manifest's source note (e.g. SmolLM2's F16 rebuilt from Q4_1) is carried into the base
    record: every KLD measures loss relative to that file. No reference is a ConfigError raised
    inside the base's attempt (an attempt that records failures makes this return None).
    """
    reference = manifest.reference_label()
    if reference is None:

        def no_reference(progress: ProgressCallback) -> None:
            raise ConfigError(
                f"{NO_REFERENCE}: quality is perplexity only",
                "add F16 to prepare.quants, give prepare.reference (--reference), or set quality.kld = false",
            )

        attempt("KLD base", None, no_reference)
        return None
    files = [KldFile(quant, Path(manifest.files[quant].path)) for quant in quants if quant in manifest.files]
    note = manifest.source.get("note")
    return measure_kld_set(
        toolchain, Path(manifest.files[reference].path), files, dataset, cache_dir, quality,
        out_path, str(note) if note else None, attempt, log_dir,
    )  # fmt: skip


def find_reference(models: Sequence[Path], file_types: Sequence[str], explicit: Path | None) -> Path | None:
    """The reference to compare `models` with: `explicit`, else the best precision among them
    (F32, BF16, then F16), else the reference the manifest beside one of them lists; None when
    there is none."""
    if explicit is not None:
        return explicit
    for kind in ("F32", "BF16", REFERENCE_QUANT):
        for model, file_type in zip(models, file_types, strict=True):
            if file_type == kind:
                return model
    for model in models:
        manifest = load_manifest(RunDir(model.parent).manifest_path)
        label = manifest.reference_label() if manifest is not None else None
        if manifest is not None and label is not None:
            candidate = manifest.path_of(label, model.parent)
            if candidate.is_file():
                return candidate
    return None
