"""The third bad-input tour's cases around files and reports, each with its clear line: COPY,
`--quants ''`, the scored text as calibration, a mix override that matches nothing or does not
compile, a draft model that is no GGUF, the soak's memory source, a comparison of unrelated runs,
the advice to install Prometheus, and CSV cells a spreadsheet would run."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from quantload.analysis import prometheus_source
from quantload.analysis.compare import unrelated
from quantload.analysis.csv_file import write_csv
from quantload.cli.main import main
from quantload.config import MixSettings, PrepareSettings, Settings
from quantload.errors import ConfigError
from quantload.experiments.soak.chapter import _memory_sentence
from quantload.experiments.speculation.stages import check_draft
from quantload.llamacpp.quant_types import QuantTypes, ggml_tensor_types
from quantload.models.calibration import check_calibration_file
from quantload.models.file_plan import check_overrides_match, plan_files

TYPES = QuantTypes(("Q4_K_M", "Q8_0", "F16", "COPY"), ggml_tensor_types())
TENSORS = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight", "output.weight"]


def test_copy_is_said_to_be_a_copy_not_an_unknown_type() -> None:
    with pytest.raises(ConfigError) as caught:
        plan_files(PrepareSettings(quants=("COPY",)), TYPES)
    line = caught.value.one_line()
    assert "copy of the source's tensors" in line and "not a type this llama-quantize knows" not in line


@pytest.mark.parametrize("command", [["prepare", "--out", "OUT"], ["tune", "--out", "OUT"]])
def test_an_empty_quants_flag_is_refused_not_taken_as_the_defaults(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [part.replace("OUT", str(tmp_path / "o")) for part in command]
    assert main([*argv, "--quants", " , "]) == 2
    err = capsys.readouterr().err
    assert "--quants ' , ' names no quantization" in err and len(err.strip().splitlines()) == 1


def test_the_scored_wikitext_is_known_as_calibration_even_before_it_is_downloaded(tmp_path: Path) -> None:
    copied = tmp_path / "my-calibration.txt"
    copied.write_bytes(
        b" \n = Robert Boulter = \n \n Robert Boulter is an English film , television and theatre actor ."
        + b" filler words" * 200
    )
    with pytest.raises(ConfigError, match=r"holds the text quality is scored on \(WikiText-2's test split"):
        check_calibration_file(copied, 128, None)
    other = tmp_path / "other.txt"
    other.write_bytes(b"an unrelated text " * 200)
    check_calibration_file(other, 128, None)


def test_a_mix_override_that_matches_no_tensor_is_refused_before_it_makes_a_copy_of_its_base() -> None:
    mix = MixSettings(name="attn8", base="Q4_K_M", tensor_types=("attn_vv=q8_0",))
    plan = plan_files(PrepareSettings(quants=(), mixes=(mix,)), TYPES)
    with pytest.raises(ConfigError) as caught:
        check_overrides_match(plan, TENSORS)
    line = caught.value.one_line()
    assert "prepare.mixes attn8: attn_vv=q8_0 matches none of the model's tensors" in line
    assert "its base type Q4_K_M" in line
    fine = MixSettings(name="attn8", base="Q4_K_M", tensor_types=("attn_v=q8_0", r"blk\.0\.ffn_down=q6_k"))
    check_overrides_match(plan_files(PrepareSettings(quants=(), mixes=(fine,)), TYPES), TENSORS)


def test_a_tensor_pattern_llama_quantize_cannot_read_is_refused_with_the_reason() -> None:
    mix = MixSettings(name="broken", base="Q4_K_M", tensor_types=("attn_[v=q8_0",))
    with pytest.raises(ConfigError) as caught:
        plan_files(PrepareSettings(quants=(), mixes=(mix,)), TYPES)
    line = caught.value.one_line()
    assert "'attn_[v' is not a pattern llama-quantize can read" in line and "unterminated" in line


def test_a_draft_model_that_is_no_gguf_is_named_as_speculation_draft_model(tmp_path: Path) -> None:
    draft = tmp_path / "draft.gguf"
    draft.write_text("not a model")
    settings = Settings.model_validate({"speculation": {"draft_model": str(draft)}})
    for models in ({"Q8_0": tmp_path / "target.gguf"}, None):
        with pytest.raises(ConfigError) as caught:
            check_draft(settings, (), models)
        line = caught.value.one_line()
        assert line.startswith("speculation.draft_model: ") and "is not a GGUF file" in line


def test_the_soak_says_where_server_memory_came_from_or_why_it_did_not() -> None:
    unread = SimpleNamespace(memory_source=None, memory_missing="the server is not a process quantload started")
    said = _memory_sentence(unread)  # type: ignore[arg-type]
    assert said == "Server memory not measured: the server is not a process quantload started."
    assert "nowhere" not in _memory_sentence(SimpleNamespace(memory_source=None, memory_missing=None))  # type: ignore[arg-type]
    read = SimpleNamespace(memory_source="/proc/42/status", memory_missing=None)
    assert _memory_sentence(read) == "Server memory read from /proc/42/status."  # type: ignore[arg-type]


def _analysis(model: str, quants: tuple[str, ...]) -> SimpleNamespace:
    return SimpleNamespace(header=SimpleNamespace(model=model), quants=quants)


def test_a_comparison_of_unrelated_runs_says_so() -> None:
    said = unrelated(_analysis("qwen2.5-0.5b", ("Q8_0",)), _analysis("tiny", ("Q4_K_M",)))  # type: ignore[arg-type]
    assert len(said) == 2 and "different models" in said[0] and "share no quantization" in said[1]
    assert unrelated(_analysis("tiny", ("Q8_0",)), _analysis("tiny", ("Q8_0", "F16"))) == []  # type: ignore[arg-type]


def test_installing_prometheus_is_advised_only_where_it_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus_source.shutil, "which", lambda name: "/usr/bin/prometheus")
    assert "install" not in prometheus_source.prometheus_how()
    monkeypatch.setattr(prometheus_source.shutil, "which", lambda name: None)
    assert "apt-get install prometheus" in prometheus_source.prometheus_how()


def test_a_label_a_spreadsheet_would_run_is_written_as_text(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {"quant": ['=HYPERLINK("http://x","y")', "+1", "@SUM(A1)", "Q8_0"], "ttft_p99_s": [0.5, -0.25, 1.0, 2.0]}
    )
    path = tmp_path / "table.csv"
    write_csv(frame, path)
    rows = list(csv.DictReader(path.read_text(encoding="utf-8").splitlines()))
    assert [row["quant"] for row in rows] == ['\'=HYPERLINK("http://x","y")', "'+1", "'@SUM(A1)", "Q8_0"]
    assert [row["ttft_p99_s"] for row in rows] == ["0.5", "-0.25", "1", "2"]  # numbers stay numbers
