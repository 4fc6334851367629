"""Every quantization a user would choose, on the tiny model with the real tools: types from the
binary's own list, the importance matrix each one needs (checked against llama-quantize's own
--dry-run), mixes, a computed and cached importance matrix read back from each file's metadata,
files of different models refused, and the sensitivity scan with the mix it proposes, built."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

from quantload.config import (
    MixSettings,
    PrepareSettings,
    QualitySettings,
    SensitivitySettings,
    ToolchainSettings,
)
from quantload.errors import ConfigError
from quantload.llamacpp.quant_types import NEEDS_IMATRIX, NOT_A_FILE_TYPE, REFERENCE_TYPES, quant_types
from quantload.llamacpp.quantize import dry_run
from quantload.llamacpp.toolchain import Toolchain, ensure_llama_source
from quantload.models.given_files import adopt_files
from quantload.models.prepare import prepare_models
from quantload.models.synthetic import TinyShape, write_tiny_model
from quantload.paths import cache_root
from quantload.quality.sensitivity import load_sensitivity_file, scan_sensitivity
from quantload.rundir import SENSITIVITY_JSON
from support import clean_env, run_quantload

pytestmark = pytest.mark.integration


def _prepare(
    out: Path, toolchain: Toolchain, prepare: PrepareSettings, scored: Path | None = None, cache: Path | None = None
) -> object:
    return prepare_models(
        "tiny", out, toolchain, cache or cache_root(None, os.environ), os.environ,
        functools.partial(ensure_llama_source, ToolchainSettings(), os.environ), prepare=prepare,
        scored_text=scored,
    )  # fmt: skip


def test_the_types_said_to_need_an_imatrix_are_the_ones_llama_quantize_says(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    types = quant_types(toolchain)
    assert {"Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M", "IQ2_XS", "TQ1_0"} <= set(types.file_types)
    needs = {}
    for kind in types.file_types:
        if kind in NOT_A_FILE_TYPE or kind in REFERENCE_TYPES or kind in ("Q3_K", "Q4_K", "Q5_K"):
            continue
        needs[kind] = dry_run(toolchain, tiny_models["F16"], kind, tmp_path / f"{kind}.log").needs_imatrix
    assert {kind for kind, needed in needs.items() if needed} == NEEDS_IMATRIX & set(needs)


def test_types_mixes_and_a_computed_importance_matrix(
    toolchain: Toolchain, tmp_path: Path, wikitext_test_raw: Path
) -> None:
    calibration = tmp_path / "calibration.txt"
    calibration.write_bytes(wikitext_test_raw.read_bytes()[-200_000:])  # not the scored opening
    out = tmp_path / "files"
    with pytest.raises(ConfigError, match="IQ2_XS needs an importance matrix"):
        _prepare(out, toolchain, PrepareSettings(quants=("F16", "IQ2_XS")))
    with pytest.raises(ConfigError, match="is not a type this llama-quantize knows"):
        _prepare(out, toolchain, PrepareSettings(quants=("F16", "Q4_K_X")))
    with pytest.raises(ConfigError, match="holds the text quality is scored on"):
        _prepare(out, toolchain, PrepareSettings(quants=("Q4_K_M-imatrix",), imatrix="computed",
                 calibration=str(wikitext_test_raw)), scored=wikitext_test_raw)  # fmt: skip
    assert not out.exists()  # every refusal came before any work
    mix = MixSettings(name="Q4_K_M-attnv8", base="Q4_K_M", tensor_types=("attn_v=q8_0",))
    prepare = PrepareSettings(
        quants=("F16", "Q6_K", "Q4_K_M", "Q4_K_M-imatrix", "IQ2_XS"), mixes=(mix,), imatrix="computed",
        calibration=str(calibration), imatrix_chunks=2, imatrix_ctx=128,
    )  # fmt: skip
    cache = tmp_path / "cache"  # its own: an importance matrix an earlier run cached would be reused
    manifest = _prepare(out, toolchain, prepare, scored=wikitext_test_raw, cache=cache)
    labels = manifest.ordered_labels()  # type: ignore[attr-defined]
    files = manifest.files  # type: ignore[attr-defined]
    assert set(labels) == {"F16", "Q6_K", "Q4_K_M", "Q4_K_M-imatrix", "IQ2_XS-imatrix", "Q4_K_M-attnv8"}
    assert [files[label].size_bytes for label in labels] == sorted((f.size_bytes for f in files.values()), reverse=True)
    on_disk = json.loads((out / "manifest.json").read_text())
    assert list(on_disk["files"]) == labels and on_disk["reference"] == "F16"
    for label in ("Q4_K_M-imatrix", "IQ2_XS-imatrix"):
        assert files[label].imatrix["chunks_count"] == 2 and files[label].imatrix["dataset"].endswith("calibration.txt")
    assert files["Q4_K_M"].imatrix is None and files["Q4_K_M-attnv8"].imatrix is None
    assert files["Q4_K_M-attnv8"].recipe == "Q4_K_M --tensor-type attn_v=q8_0"
    assert files["Q4_K_M-attnv8"].size_bytes > files["Q4_K_M"].size_bytes
    assert files["IQ2_XS-imatrix"].file_type == "IQ2_XS"
    record = manifest.imatrix  # type: ignore[attr-defined]
    assert record["mode"] == "computed" and record["seconds"] > 0 and not record["reused"]
    again = _prepare(out, toolchain, prepare, scored=wikitext_test_raw, cache=cache)  # nothing is made twice
    assert again.imatrix["reused"] is True  # type: ignore[attr-defined]
    assert {k: e.sha256 for k, e in again.files.items()} == {k: e.sha256 for k, e in files.items()}  # type: ignore[attr-defined]
    # the same files, given as they are, read back the same from their own metadata
    given = adopt_files(PrepareSettings(files=(str(out),)), tmp_path, {}, {})
    assert set(given.files) >= {"F16", "Q6_K", "Q4_K_M-imatrix", "IQ2_XS-imatrix"}


def test_files_of_different_models_are_refused_in_one_line(
    tiny_models: dict[str, Path], tmp_path: Path, toolchain: Toolchain
) -> None:
    wider = write_tiny_model(
        ensure_llama_source(ToolchainSettings(), os.environ), tmp_path / "wider-F16.gguf",
        shape=TinyShape(feed_forward=768),
    )  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        adopt_files(PrepareSettings(files=(str(tiny_models["Q8_0"]), str(wider))), tmp_path, {}, {})
    line = caught.value.one_line()
    assert "are not one model: tensor shapes differ" in line and "ffn" in line and "\n" not in line


@pytest.mark.long  # a KLD scan of every tensor group, about a minute: `make test-long`
def test_the_sensitivity_scan_ranks_groups_and_builds_the_mix_it_proposes(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path, wikitext_test_raw: Path
) -> None:
    settings = SensitivitySettings(groups=("attn_v", "ffn_down", "output"), raise_to="q8_0", lower_to="q3_k")
    quality = QualitySettings(ctx=128, kld_chunks=2)
    scan = scan_sensitivity(
        toolchain, tiny_models["F16"], wikitext_test_raw, cache_root(None, os.environ), quality, settings,
        0.5, quant_types(toolchain), tmp_path,
    )  # fmt: skip
    assert scan.base is not None and scan.base.name == "base" and scan.base_type == "Q4_K_M"
    assert scan.skipped_groups == ("output",) or "output" in {v.group for v in scan.variants}
    raised, lowered = scan.ranking("raise"), scan.ranking("lower")
    assert {v.group for v in raised} == {v.group for v in lowered} >= {"attn_v", "ffn_down"}
    assert all(v.size_change_mib and v.size_change_mib > 0 for v in raised)
    assert all(v.size_change_mib and v.size_change_mib < 0 for v in lowered)
    per_mib = [v.kld_per_mib or 0.0 for v in raised]
    assert per_mib == sorted(per_mib, reverse=True)
    proposal = scan.proposal
    assert proposal is not None and proposal.direction == "lower" and proposal.meets_limit  # 0.5 nats admits it
    mix_file = Path(str(proposal.tensor_type_file))
    assert mix_file.read_text().split() == list(proposal.overrides) and proposal.overrides
    assert scan.mix is not None and scan.mix.size_bytes < scan.base.size_bytes
    assert load_sensitivity_file(tmp_path / SENSITIVITY_JSON) == scan
    assert not list(tmp_path.glob("sensitivity-work/*.gguf"))  # variants removed after measuring
    # the proposed file builds as a mix like any other file
    built = _prepare(tmp_path / "mix", toolchain, PrepareSettings(
        quants=("F16",), mixes=(MixSettings(name="scan-mix", base="Q4_K_M", tensor_type_file=mix_file),),
    ))  # fmt: skip
    assert built.files["scan-mix"].size_bytes == pytest.approx(scan.mix.size_bytes, rel=0.01)  # type: ignore[attr-defined]


def test_run_refuses_bad_choices_in_one_line_before_any_work(
    tiny_models: dict[str, Path], tmp_path: Path, toolchain: Toolchain
) -> None:
    wider = write_tiny_model(
        ensure_llama_source(ToolchainSettings(), os.environ), tmp_path / "wider-F16.gguf",
        shape=TinyShape(embedding=512),
    )  # fmt: skip
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    cases = [
        ({"QUANTLOAD_PREPARE__QUANTS": "F16,Q4_KM"}, [], "'Q4_KM' is not a type this llama-quantize knows"),
        ({"QUANTLOAD_PREPARE__QUANTS": "F16,IQ2_XS"}, [], "IQ2_XS needs an importance matrix"),
        ({"QUANTLOAD_PREPARE__QUANTS": "Q4_K_M-imatrix", "QUANTLOAD_PREPARE__IMATRIX": "computed",
          "QUANTLOAD_PREPARE__CALIBRATION": str(empty)}, [], "is empty"),
        ({}, ["--files", str(tiny_models["Q8_0"]), str(wider)], "are not one model"),
        ({}, ["--files", str(tmp_path / "m-00001-of-00002.gguf")], "does not exist"),
    ]  # fmt: skip
    for extra_env, args, expected in cases:
        out = tmp_path / "runs"
        result = run_quantload(
            ["run", "--model", "tiny", "--profile", "ci", "--out", str(out), *args], cwd=tmp_path,
            env={**clean_env(), **extra_env}, timeout_s=120,
        )  # fmt: skip
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode != 0 and any(expected in line for line in lines), (expected, result.stderr[-800:])
        assert not out.exists() or not any(out.iterdir()), expected  # no run directory: no work began
