"""The KL-divergence figures of one model's prepared files: what the KLD step finds and costs.

Runs `quantload quality` on the F16, Q8_0 and Q4_K_M files of a prepared model (the files
`quantload prepare` or `quantload run` left in the cache) with a profile's chunk counts, or reads
a quality.json written before (`--from`), and prints, per file and KV-cache type: mean KLD with
llama-perplexity's per-token and the per-chunk standard error, same-top-p, Δppl, the wall time of
each llama-perplexity run and how busy the other processes kept the CPUs meanwhile; then the base
file's size, the time the KLD step adds, and how many standard errors apart Q8_0 and Q4_K_M are.
The table is also written under benchmarks/figures/ (file names only, no machine paths).

    .venv/bin/python benchmarks/kld_figures.py --model smollm2-135m --profile quick   # ~1-2 min
    .venv/bin/python benchmarks/kld_figures.py --model smollm2-135m --profile seed    # ~10 min
    .venv/bin/python benchmarks/kld_figures.py --from results/RUN/quality.json
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from quantload.config import load_config
from quantload.llamacpp.kld_base import format_bytes
from quantload.models.manifest import load_manifest
from quantload.paths import cache_root
from quantload.quality.kld_results import KldResult, KldSet
from quantload.quality.results import load_quality_file
from quantload.rundir import MANIFEST_JSON

HERE = Path(__file__).resolve().parent
QUANTS = ("F16", "Q8_0", "Q4_K_M")
DEFAULT_TEXT = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"


def measure(model: str, profile: str, dataset: Path, out: Path) -> float:
    """Run `quantload quality` on the prepared files with the profile's settings; its wall time."""
    folder = cache_root(None, os.environ) / "prepared" / model
    manifest = load_manifest(folder / MANIFEST_JSON)
    if manifest is None:
        raise SystemExit(f"no prepared files in {folder}: run 'quantload prepare --model {model} --out DIR'")
    quality = load_config(Path.cwd(), {}, {"run.profile": profile}).settings.quality
    files = [str(manifest.path_of(quant, folder)) for quant in QUANTS if quant in manifest.files]
    command = [
        sys.executable, "-m", "quantload.cli.main", "quality", *files, "--dataset", str(dataset),
        "--ctx", str(quality.ctx), "--chunks", "1", "--kld-chunks", str(quality.kld_chunks),
        "--kv-types", ",".join(quality.kld_cache_types), "--out", str(out),
    ]  # fmt: skip
    started = time.monotonic()
    subprocess.run(command, check=True)
    return time.monotonic() - started


def _pm(value: float, error: float | None, digits: int) -> str:
    return f"{value:.{digits}f}" + ("" if error is None else f" ± {error:.{digits}f}")


def _share(fraction: float | None) -> str:
    return "?" if fraction is None else f"{fraction:.0%}"


def _ratio(gap: float, error: float) -> str:
    return f"{gap / error:.1f}" if error > 0 else "n/a"


def _sigmas(a: KldResult, b: KldResult) -> tuple[str, str]:
    """How many (per-token, per-chunk) standard errors apart two mean KLDs are, errors combined
    as independent (conservative: both runs score the same tokens)."""
    token = math.hypot(a.kld_mean_error_nats or 0.0, b.kld_mean_error_nats or 0.0)
    chunk = math.hypot(a.kld_mean_chunk_error_nats or 0.0, b.kld_mean_chunk_error_nats or 0.0)
    gap = abs(a.kld_mean_nats - b.kld_mean_nats)
    return _ratio(gap, token), _ratio(gap, chunk)


def _row(label: str, cache_type: str, result: KldResult) -> str:
    chunk = result.kld_mean_chunk_error_nats
    cells = [
        label + (" (floor)" if result.is_floor else ""),
        cache_type,
        _pm(result.kld_mean_nats, result.kld_mean_error_nats, 6),
        "n/a" if chunk is None else f"{chunk:.6f}",
        f"{result.kld_median_nats:.6f}",
        f"{result.kld_p99_nats:.5f}",
        f"{result.kld_p99_9_nats:.5f}",
        _pm(result.same_top_p_pct, result.same_top_p_error_pct, 2),
        f"{result.delta_p_rms_pct:.3f}",
        _pm(result.ppl_change_pct, result.ppl_change_error_pct, 2),
        f"{result.wall_time_s:.1f}",
        _share(result.other_cpu_frac),
    ]
    return "| " + " | ".join(cells) + " |"


def table(kld: KldSet) -> list[str]:
    """The Markdown lines of the figures."""
    base = kld.base
    lines = [
        f"reference: {Path(base.model_path).name} ({base.model_name}); {base.chunks_scored} chunks of"
        f" {base.ctx_tokens} tokens, {base.tokens_scored:,} tokens scored; vocabulary {base.n_vocab:,}",
        f"source note: {base.source_note or 'none'}",
        f"base logits file: {base.file_size_bytes:,} bytes ({format_bytes(base.file_size_bytes)}),"
        f" predicted {base.predicted_size_bytes:,}; written in {base.wall_time_s:.1f} s"
        f" (other processes used {_share(base.other_cpu_frac)} of the CPUs)",
        "",
        "| quant | KV | mean KLD ± per-token se | per-chunk se | median | p99 | p99.9 | same top % |"
        " RMS Δp % | Δppl % | seconds | others' CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    total_s = base.wall_time_s
    for label, per_type in kld.results.items():
        for cache_type, result in per_type.items():
            total_s += result.wall_time_s
            lines.append(_row(label, cache_type, result))
    runs = sum(map(len, kld.results.values()))
    lines += ["", f"KLD step: {total_s:.1f} s of llama-perplexity runs (the base and {runs} comparisons)"]
    weights = kld.for_cache_type("f16")
    if "Q8_0" in weights and "Q4_K_M" in weights:
        token, chunk = _sigmas(weights["Q8_0"], weights["Q4_K_M"])
        lines.append(f"Q8_0 vs Q4_K_M mean KLD: {token} per-token or {chunk} per-chunk standard errors apart")
    for label, result in kld.for_cache_type("q8_0").items():
        if label in weights:
            token, chunk = _sigmas(weights[label], result)
            lines.append(
                f"{label}: q8_0 KV adds {result.kld_mean_nats - weights[label].kld_mean_nats:+.6f} nats"
                f" ({token} per-token / {chunk} per-chunk standard errors)"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m", help="prepared folder name in the cache")
    parser.add_argument("--profile", default="quick", choices=("quick", "seed", "ci"))
    parser.add_argument("--dataset", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--from", dest="source", type=Path, help="read this quality.json, measure nothing")
    parser.add_argument("--label", help="names the figures (default: MODEL-PROFILE)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        source = args.source or Path(tmp) / "quality.json"
        wall_s = None if args.source else measure(args.model, args.profile, args.dataset, source)
        kld = load_quality_file(source).kld
    if kld is None:
        raise SystemExit(f"{source} holds no KLD results")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
    label = args.label or f"{args.model}-{args.profile}"
    name = f"kld-{label}-{stamp}"
    when = (
        f"measured now; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f};"
        f" `quantload quality` wall time {wall_s:.0f} s"
        if wall_s is not None
        else f"read from a quality.json measured at {kld.base.measured_at}"
    )
    header = [f"# KL divergence figures, {label}", "", f"{stamp}; {when}", ""]
    lines = header + table(kld)
    print("\n".join(lines))
    figures = HERE / "figures"
    figures.mkdir(exist_ok=True)
    (figures / f"{name}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"\nwritten to {figures / name}.md")


if __name__ == "__main__":
    main()
