"""Any number of files, in one order: the manifest's, largest first, whatever order the
configuration, the records or quality.json name them in; each file's importance matrix shown, the
same type with and without one as a row pair, and the sensitivity scan's section."""

from __future__ import annotations

import json
from pathlib import Path

from analysis_synthetic import write_quality, write_synthetic_run

from quantload.analysis import build_report
from quantload.analysis.run_data import load_run
from quantload.models.manifest import Manifest, ManifestEntry, save_manifest
from quantload.quality.sensitivity import Proposal, SensitivityFile, Variant
from quantload.rundir import MANIFEST_JSON, SENSITIVITY_JSON, write_json_atomic

SIZES = {"F16": 270, "Q8_0": 145, "Q6_K": 112, "Q5_K_M": 98, "Q4_K_M": 85, "Q4_K_M-imatrix": 84, "Q3_K_M": 72}
IMATRIX = {"file": "/cache/imatrix/abc.gguf", "dataset": "/data/calibration.txt", "entries_count": 210,
           "chunks_count": 40}  # fmt: skip
LOSSES = {
    "F16": {"f16": (0.0, 0.0)}, "Q8_0": {"f16": (0.0006, 0.00004)}, "Q6_K": {"f16": (0.002, 0.0001)},
    "Q5_K_M": {"f16": (0.006, 0.0003)}, "Q4_K_M": {"f16": (0.021, 0.001)},
    "Q4_K_M-imatrix": {"f16": (0.015, 0.0008)}, "Q3_K_M": {"f16": (0.08, 0.004)},
}  # fmt: skip


def _entry(label: str, mib: int) -> ManifestEntry:
    return ManifestEntry(
        quant=label, file=f"m-{label}.gguf", path=f"/models/m-{label}.gguf", size_bytes=mib << 20,
        sha256="0" * 64, n_params=1, tensor_bytes=1, architecture="llama",
        file_type=label.removesuffix("-imatrix"), made_from="F16 sha256:0", seconds=1.0,
        recipe=label, imatrix=IMATRIX if label.endswith("-imatrix") else None,
    )  # fmt: skip


def _manifest(folder: Path) -> None:
    files = {label: _entry(label, mib) for label, mib in SIZES.items()}
    save_manifest(folder / MANIFEST_JSON, Manifest(source={"name": "m"}, llama_cpp={}, files=files, reference="F16"))


def _variant(name: str, direction: str, group: str | None, kld: float, mib: float, per: float | None) -> Variant:
    return Variant(
        name=name, direction=direction, group=group, tensor_type="q8_0" if direction == "raise" else "q3_k",  # type: ignore[arg-type]
        tensors=30 if group else 0, size_bytes=round(mib * 2**20), kld_mean_nats=kld, kld_mean_error_nats=0.001,
        same_top_p_pct=90.0, ppl_change_pct=1.0, kld_change_nats=None if per is None else kld - 0.021,
        size_change_mib=None if per is None else mib - 85, kld_per_mib=per, seconds=12.0,
    )  # fmt: skip


def test_seven_files_are_shown_largest_first_everywhere(tmp_path: Path) -> None:
    scrambled = ("Q3_K_M", "Q4_K_M", "F16", "Q6_K", "Q4_K_M-imatrix", "Q8_0", "Q5_K_M")
    folder = write_synthetic_run(tmp_path / "run", quants=scrambled)  # config and records in this order
    write_quality(folder, LOSSES)
    _manifest(folder)
    scan = SensitivityFile(
        reference="m-F16.gguf", base_type="Q4_K_M", raise_to="q8_0", lower_to="q3_k", limit_kld_mean_nats=0.05,
        chunks_scored=10, base=_variant("base", "base", None, 0.021, 85, None),
        variants=(_variant("attn_v=q8_0", "raise", "attn_v", 0.017, 86, 0.004),
                  _variant("ffn_down=q3_k", "lower", "ffn_down", 0.03, 80, 0.0018)),
        proposal=Proposal(direction="lower", groups=("ffn_down",), overrides=(r"ffn_down\.weight$=q3_k",),
                          predicted_kld_mean_nats=0.03, predicted_size_bytes=80 << 20, meets_limit=True,
                          tensor_type_file="tensor-types-Q4_K_M.txt", why="the base is within the limit"),
        mix=_variant("Q4_K_M-mix", "mix", None, 0.029, 80, None), seconds=250.0,
    )  # fmt: skip
    write_json_atomic(folder / SENSITIVITY_JSON, scan.to_json())
    largest_first = list(SIZES)
    assert load_run(folder).quants() == largest_first
    paths = build_report(folder)
    summary = json.loads(paths.summary.read_text())
    assert summary["quants"] == largest_first
    assert [row["quant"] for row in summary["table"]] == largest_first
    assert [c["quant"] for c in summary["capacity"]] == largest_first
    assert [q["quant"] for q in summary["plan"]["quants"]] == largest_first
    assert [r["quant"] for r in summary["quality_loss"]["rows"]] == largest_first
    imatrix = {row["quant"]: row["imatrix"] for row in summary["table"]}
    assert imatrix["Q4_K_M"] == "no" and imatrix["Q4_K_M-imatrix"] == "abc.gguf (on calibration.txt, 40 chunks)"
    pairs = summary["imatrix_pairs"]
    assert [(p["pair"], p["quant"]) for p in pairs] == [(1, "Q4_K_M"), (1, "Q4_K_M-imatrix")]
    assert abs(pairs[1]["kld_change_frac"] - (0.015 / 0.021 - 1)) < 1e-9 and pairs[1]["beyond_uncertainty"] is True
    assert summary["sensitivity"]["proposal"]["groups"] == ["ffn_down"]
    markdown = paths.markdown.read_text()
    table = next(line for line in markdown.splitlines() if line.startswith("| quant | type | file size | imatrix"))
    assert table
    rows = [line.split("|")[1].strip() for line in markdown.splitlines() if line.startswith("| Q") or line.startswith("| F16")]
    assert [r for r in rows if r in SIZES][: len(SIZES)] == largest_first  # the big table, in order
    for text in ("## The tensors that resist (sensitivity scan)", "The importance matrix's effect",
                 "with base Q4_K_M and tensor_type_file tensor-types-Q4_K_M.txt"):
        assert text in markdown, text
    plots = {Path(p).name for p in summary["files"]["plots"]}
    assert {"quality_speed_size.png", "sensitivity.png"} <= plots


def test_without_a_reference_the_quality_section_says_perplexity_only(tmp_path: Path) -> None:
    folder = write_synthetic_run(tmp_path / "run", quants=("Q8_0", "Q4_K_M", "Q6_K", "Q5_K_M", "Q3_K_M"))
    given = ("Q8_0", "Q4_K_M", "Q6_K", "Q5_K_M", "Q3_K_M")
    files = {q: _entry(q, SIZES[q]).model_copy(update={"made_from": "given", "recipe": None}) for q in given}
    save_manifest(folder / MANIFEST_JSON, Manifest(source={"name": "m"}, llama_cpp={}, files=files))
    paths = build_report(folder)
    assert json.loads(paths.summary.read_text())["quants"] == ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M"]
    assert "Perplexity only: none of the run's files is F16, BF16 or F32" in paths.markdown.read_text()
