"""The report from hostile or damaged run folders: labels and paths shown as text in Markdown as in
HTML, every damaged line of every run file counted and named, a folder it cannot write refused in
one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from analysis_synthetic import write_synthetic_run
from test_analysis_traffic import limit_line

from quantload.analysis.document import Document, Paragraph, Section, Table, render_markdown
from quantload.analysis.report import build_report
from quantload.analysis.run_data import load_run
from quantload.cli.main import main
from quantload.errors import ConfigError
from quantload.llamacpp.server import free_port

HOSTILE = '<img src=x onerror="alert(1)">'


def _no_prometheus() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_markdown_shows_hostile_labels_as_text_like_the_html() -> None:
    document = Document(
        title=f"run {HOSTILE}",
        subtitle="model /m/[x](javascript:alert(1)).gguf",
        sections=(
            Section("s", f"Quant {HOSTILE}", (
                Paragraph(f"label *{HOSTILE}* and `code`"),
                Table(("quant", "path"), ((HOSTILE, "/a|b/_c_.gguf"),)),
            )),
        ),
    )  # fmt: skip
    text = render_markdown(document)
    assert "<img" not in text and " [x](" not in text and "/[x](" not in text
    assert "/m/\\[x\\](javascript" in text  # the brackets shown, no link made
    assert "&lt;img src=x onerror=\"alert(1)\">" in text  # no tag can start; a lone ">" starts nothing
    assert "p < 0.05 and `quantload run --exclusive`" in render_markdown(
        Document("t", "s", (Section("k", "k", (Paragraph("p < 0.05 and `quantload run --exclusive`"),)),))
    )  # a "<" that starts no tag and a command in backquotes read as written
    assert "/a\\|b/\\_c\\_.gguf" in text  # the table cell stays one cell, the underscores literal
    assert "Q4_K_M" in render_markdown(Document("t", "s", (Section("k", "Q4_K_M"),)))  # words stay readable


def test_a_hostile_quant_label_and_model_path_never_reach_report_md_as_html(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run", quants=(f"Q4<b>{HOSTILE}</b>",))
    paths = build_report(run_dir, _no_prometheus())
    markdown = paths.markdown.read_text()
    assert "<img" not in markdown and "<b>" not in markdown
    assert "&lt;img" in markdown
    assert "<img src=x" not in paths.html.read_text()  # the page escapes it too


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda run: (run / "report.md").mkdir(), "is a folder, where the report writes its report.md"),
        (lambda run: (run / "plots").write_text("x"), "is a file, where the report keeps its plots"),
        (lambda run: (run / "summary.json").mkdir(), "is a folder, where the report writes its summary.json"),
    ],
    ids=["report.md a folder", "plots a file", "summary.json a folder"],
)
def test_a_report_folder_that_cannot_be_written_is_one_line_before_any_work(
    make: object, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = write_synthetic_run(tmp_path / "run")
    make(run_dir)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=needle):
        build_report(run_dir, _no_prometheus())
    assert main(["report", str(run_dir), "--prometheus", _no_prometheus()]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and needle in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err


def _damage(path: Path, line_numbers: set[int]) -> None:
    lines = path.read_text().splitlines()
    for number in line_numbers:
        lines[number - 1] = lines[number - 1][: len(lines[number - 1]) // 2]  # torn
    path.write_text("\n".join(lines) + "\n")


def test_every_damaged_line_of_every_run_file_is_counted_named_and_noted(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run")
    lines = [limit_line("Q8_0", 6.0, 7.0), limit_line("Q4_K_M", None, 1.0, "never_held")]
    (run_dir / "limits.jsonl").write_text("".join(line.model_dump_json(by_alias=True) + "\n" for line in lines))
    _damage(run_dir / "limits.jsonl", {2})
    _damage(run_dir / "records.jsonl", {3, 10})
    _damage(run_dir / "stages.jsonl", {1})
    notes = load_run(run_dir).reading_notes
    assert "1 line of limits.jsonl could not be read (torn, foreign or damaged: line 2) and were left out" in notes
    assert any(note.startswith("2 lines of records.jsonl") and "lines 3, 10" in note for note in notes), notes
    assert any(note.startswith("1 line of stages.jsonl") for note in notes), notes
    (run_dir / "variants.jsonl").write_text('{"run_id": "r", "experiment": "slo\n')  # torn
    (run_dir / "tune.jsonl").write_text('{"kind": "trial", "run_id": "r", "quant": "Q8_0", "server": "s"}\n')
    paths = build_report(run_dir, _no_prometheus())
    markdown = paths.markdown.read_text()
    assert "limits.jsonl could not be read" in markdown
    assert "1 line of variants.jsonl could not be read" in markdown
    assert "1 line of tune.jsonl could not be read" in markdown  # a trial line without its configuration
    summary = json.loads(paths.summary.read_text())
    assert [line["quant"] for line in summary["limits"]] == ["Q8_0"]


def test_a_run_file_line_nested_too_deep_is_one_more_bad_line(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run")
    with (run_dir / "stages.jsonl").open("a") as handle:
        handle.write('{"event": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    notes = load_run(run_dir).reading_notes
    assert any("stages.jsonl could not be read" in note for note in notes), notes
