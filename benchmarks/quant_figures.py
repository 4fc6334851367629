"""The quality of every quantization a user would choose, with and without an importance matrix:
SmolLM2-135M (the wheel's F16 reconstruction) prepared by quantload, each file's mean KLD from the
F16 (± the larger standard error), same top token, perplexity (from the same llama-perplexity run)
and size; the importance matrix's cost. Written to benchmarks/figures/ as markdown and JSON.

    nice .venv/bin/python benchmarks/quant_figures.py --calibration CALIB.txt --kld-chunks 10

The calibration text must not be the scored text (quantload refuses it): the figures in the
repository used the last 600,000 bytes of the WikiText-2 test file, disjoint from the chunks
llama-perplexity scores (its opening), as this machine cannot reach WikiText-2's train split.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from quantload.config import PrepareSettings, QualitySettings, ToolchainSettings
from quantload.llamacpp.toolchain import ensure_llama_source, ensure_toolchain
from quantload.models.prepare import prepare_models
from quantload.models.prepared import prepared_folder
from quantload.paths import cache_root
from quantload.quality.kld_measure import KldFile, measure_kld_set
from quantload.quality.kld_results import FLOOR_CACHE_TYPE, mean_error_nats

HERE = Path(__file__).resolve().parent
MIB = float(1 << 20)
DEFAULT_TEXT = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"
WIDE = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS-imatrix", "Q3_K_M")
WITH_IMATRIX = ("Q6_K-imatrix", "Q5_K_M-imatrix", "Q4_K_M-imatrix", "Q3_K_M-imatrix")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--calibration", type=Path, required=True)
    parser.add_argument("--dataset", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--kld-chunks", type=int, default=10)
    parser.add_argument("--imatrix-chunks", type=int, default=40)
    args = parser.parse_args()
    environ = dict(os.environ)
    cache = cache_root(None, environ)
    toolchain = ensure_toolchain(ToolchainSettings(), environ)
    prepare = PrepareSettings(
        quants=WIDE + WITH_IMATRIX, imatrix="computed", calibration=str(args.calibration),
        imatrix_chunks=args.imatrix_chunks,
    )  # fmt: skip
    folder = prepared_folder(cache, args.model)
    started = time.monotonic()
    manifest = prepare_models(
        args.model, folder, toolchain, cache, environ,
        functools.partial(ensure_llama_source, ToolchainSettings(), environ), prepare=prepare,
        scored_text=args.dataset,
    )  # fmt: skip
    prepare_s = time.monotonic() - started
    quality = QualitySettings(kld_chunks=args.kld_chunks, kld_cache_types=("f16",))
    reference = manifest.reference_label()
    assert reference is not None
    files = [KldFile(label, Path(manifest.files[label].path)) for label in manifest.ordered_labels()]
    started = time.monotonic()
    kld = measure_kld_set(
        toolchain, Path(manifest.files[reference].path), files, args.dataset, cache, quality,
        source_note=str(manifest.source.get("note") or "") or None,
    )  # fmt: skip
    kld_s = time.monotonic() - started
    assert kld is not None
    results = kld.for_cache_type(FLOOR_CACHE_TYPE)
    rows = []
    for label in manifest.ordered_labels():
        entry, result = manifest.files[label], results.get(label)
        rows.append({
            "quant": label, "size_bytes": entry.size_bytes, "imatrix": bool(entry.imatrix),
            "kld_mean_nats": result.kld_mean_nats if result else None,
            "kld_mean_error_nats": mean_error_nats(result) if result else None,
            "same_top_p_pct": result.same_top_p_pct if result else None,
            "perplexity": result.ppl_q if result else None,
            "perplexity_error": result.ppl_q_error if result else None,
            "kld_seconds": result.wall_time_s if result else None,
        })  # fmt: skip
    imatrix = dict(manifest.imatrix or {})
    if "path" in imatrix:
        imatrix["path"] = Path(str(imatrix["path"])).name  # file names only, no machine paths
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
    record = {
        "model": args.model, "source_note": manifest.source.get("note"), "dataset": args.dataset.name,
        "kld_chunks": args.kld_chunks, "ctx": quality.ctx, "calibration": args.calibration.name,
        "imatrix": imatrix, "prepare_seconds": round(prepare_s, 1), "kld_seconds": round(kld_s, 1),
        "rows": rows, "measured_at": stamp,
    }  # fmt: skip
    out = HERE / "figures" / f"quant-types-{args.model}-{stamp}"
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [
        f"# Quantizations of {args.model}, with and without an importance matrix ({stamp})", "",
        "Command: `nice .venv/bin/python benchmarks/quant_figures.py"
        f" --calibration {args.calibration.name} --kld-chunks {args.kld_chunks}"
        f" --imatrix-chunks {args.imatrix_chunks}`", "",
        f"KLD from the F16 on {kld.base.chunks_scored} chunks of {kld.base.ctx_tokens} tokens of"
        f" {kld.base.dataset.name} ({kld.base.tokens_scored:,} tokens); {manifest.source.get('note')}.", "",
        f"Importance matrix: llama-imatrix on {imatrix.get('calibration')} ({imatrix.get('chunks')} chunks"
        f" of {imatrix.get('ctx_tokens')} tokens): {imatrix.get('seconds')} s"
        + (" (reused from the cache: its first computation)" if imatrix.get("reused") else ""),
        "",
        "| quant | size MiB | imatrix | mean KLD ± s.e. (nats) | same top token % | perplexity ± s.e. |",
        "|---|---:|---|---:|---:|---:|",
    ]  # fmt: skip
    for row in rows:
        kld_text = "–" if row["kld_mean_nats"] is None else (
            f"{row['kld_mean_nats']:.6f} ± {row['kld_mean_error_nats'] or 0:.6f}"
        )
        same = "–" if row["same_top_p_pct"] is None else f"{row['same_top_p_pct']:.2f}"
        ppl = "–"
        if row["perplexity"] is not None:
            ppl = f"{row['perplexity']:.3f} ± {row['perplexity_error'] or 0:.3f}"
        lines.append(
            f"| {row['quant']} | {row['size_bytes'] / 2**20:.1f} | {'yes' if row['imatrix'] else 'no'} |"
            f" {kld_text} | {same} | {ppl} |"
        )
    lines += ["", f"Prepare (all files, the imatrix included): {prepare_s:.0f} s; KLD of all: {kld_s:.0f} s."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
