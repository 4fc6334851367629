"""The sensitivity scan on SmolLM2-135M (the wheel's F16 reconstruction): the ranking of the tensor
groups by KLD per MiB, what the scan costs, and the mix it proposes against its base type (KLD and
size, measured after building it). Written to benchmarks/figures/ as markdown and JSON.

    nice .venv/bin/python benchmarks/sensitivity_figures.py --kld-chunks 10 --max-kld 0.05

Needs the prepared F16 (`quantload prepare --model smollm2-135m`, or benchmarks/quant_figures.py).
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime
from pathlib import Path

from quantload.config import QualitySettings, SensitivitySettings, ToolchainSettings
from quantload.llamacpp.quant_types import quant_types
from quantload.llamacpp.toolchain import ensure_toolchain
from quantload.models.manifest import load_manifest
from quantload.models.prepared import prepared_folder
from quantload.paths import cache_root
from quantload.quality.sensitivity import load_sensitivity_file, scan_sensitivity
from quantload.rundir import MANIFEST_JSON

HERE = Path(__file__).resolve().parent
MIB = float(1 << 20)
DEFAULT_TEXT = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"


def _signed(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:+.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dataset", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--kld-chunks", type=int, default=10)
    parser.add_argument("--max-kld", type=float, default=0.05)
    parser.add_argument("--base", default="Q4_K_M")
    parser.add_argument("--out", type=Path, default=Path("/tmp/quantload-sensitivity"))
    parser.add_argument("--from", dest="done", type=Path, help="a sensitivity.json measured before")
    args = parser.parse_args()
    environ = dict(os.environ)
    cache = cache_root(None, environ)
    folder = prepared_folder(cache, args.model)
    manifest = load_manifest(folder / MANIFEST_JSON)
    if manifest is None or manifest.reference_label() is None:
        raise SystemExit(f"no prepared reference in {folder}: run 'quantload prepare --model {args.model}'")
    reference = folder / manifest.files[str(manifest.reference_label())].file
    if args.done is not None:
        scan = load_sensitivity_file(args.done)
        stamp = datetime.fromisoformat(scan.measured_at).strftime("%Y%m%dT%H%MZ")
    else:
        toolchain = ensure_toolchain(ToolchainSettings(), environ)
        scan = scan_sensitivity(
            toolchain, reference, args.dataset, cache, QualitySettings(kld_chunks=args.kld_chunks),
            SensitivitySettings(base=args.base), args.max_kld, quant_types(toolchain), args.out,
        )  # fmt: skip
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
    out = HERE / "figures" / f"sensitivity-{args.model}-{stamp}"
    recorded = scan.to_json()
    proposal_file = scan.proposal.tensor_type_file if scan.proposal else None
    if proposal_file and isinstance(recorded.get("proposal"), dict):
        recorded["proposal"]["tensor_type_file"] = Path(proposal_file).name  # type: ignore[index]
    out.with_suffix(".json").write_text(json.dumps(recorded, indent=2) + "\n")
    base = scan.base
    assert base is not None
    lines = [
        f"# Sensitivity scan of {args.model} from {scan.base_type} ({stamp})", "",
        "Command: `nice .venv/bin/python benchmarks/sensitivity_figures.py"
        f" --kld-chunks {args.kld_chunks} --max-kld {args.max_kld} --base {args.base}`", "",
        f"Reference: {reference.name} ({manifest.source.get('note')}); {scan.chunks_scored} chunks of 512"
        f" tokens of {args.dataset.name}; raised to {scan.raise_to}, lowered to {scan.lower_to};"
        f" skipped (no tensor): {', '.join(scan.skipped_groups) or 'none'}. The scan took"
        f" {scan.seconds:.0f} s ({len(scan.variants) + 1 + (1 if scan.mix else 0)} files quantized and"
        " compared).", "",
        "| variant | size MiB | mean KLD ± s.e. (nats) | same top % | Δ KLD | Δ MiB | KLD per MiB | s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for v in [base, *scan.ranking("raise"), *scan.ranking("lower"), *([scan.mix] if scan.mix else [])]:
        lines.append(
            f"| {v.name} | {v.size_bytes / MIB:.2f} |"
            f" {v.kld_mean_nats:.6f} ± {v.kld_mean_error_nats or 0:.6f} |"
            f" {v.same_top_p_pct:.2f} | {_signed(v.kld_change_nats, 6)} | {_signed(v.size_change_mib, 2)} |"
            f" {'' if v.kld_per_mib is None else f'{v.kld_per_mib:.6f}'} | {v.seconds:.0f} |"
        )
    proposal = scan.proposal
    if proposal is not None:
        groups = ", ".join(proposal.groups) or "none"
        lines += [
            "", f"Proposal within {args.max_kld} nats: {proposal.why}; groups {groups}; predicted"
            f" {proposal.predicted_kld_mean_nats:.6f} nats at {proposal.predicted_size_bytes / MIB:.2f} MiB;"
            f" tensor-type file lines: {', '.join(proposal.overrides) or 'none'}.",
        ]  # fmt: skip
    if scan.mix is not None:
        mix = scan.mix
        lines += [
            "", f"Built and measured: {mix.kld_mean_nats:.6f} ± {mix.kld_mean_error_nats or 0:.6f} nats at"
            f" {mix.size_bytes / MIB:.2f} MiB, against {scan.base_type}: {base.kld_mean_nats:.6f} nats at"
            f" {base.size_bytes / MIB:.2f} MiB.",
        ]  # fmt: skip
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
