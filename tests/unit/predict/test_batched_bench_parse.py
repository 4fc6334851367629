"""Reading llama-batched-bench's output (captured real runs, tests/fixtures/llamacpp) and running it
through a fake runner: no process is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantload.errors import MeasurementError, QuantloadError
from quantload.llamacpp.batched_bench import (
    batched_bench_command,
    check_grid,
    context_for,
    fastest_of,
    parse_batched_bench,
    run_batched_bench,
)
from quantload.llamacpp.tool_run import OutputCutShort, ToolRun
from quantload.llamacpp.toolchain import BATCHED_BENCH_TOOL, Toolchain

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llamacpp"
JSONL = (FIXTURES / "batched_bench_jsonl.stdout").read_text()
MARKDOWN = (FIXTURES / "batched_bench_md.stdout").read_text()


def test_jsonl_rows_are_read_with_their_settings() -> None:
    output = parse_batched_bench(JSONL)
    assert [(r.prompt_tokens, r.gen_tokens, r.sequences) for r in output.rows] == [
        (16, 4, 1), (16, 4, 2), (32, 4, 1), (32, 4, 2),
    ]  # fmt: skip
    first = output.rows[0]
    assert first.kv_cells == 20 and first.prompt_s == pytest.approx(0.107845)
    assert first.gen_s == pytest.approx(0.062877) and not first.prompt_shared
    settings = output.settings
    assert (settings.n_kv_max, settings.n_batch, settings.n_ubatch, settings.n_threads) == (512, 2048, 512, 1)
    check_grid(output, [16, 32], [4], [1, 2])


def test_the_markdown_table_is_read_with_the_settings_line() -> None:
    output = parse_batched_bench(MARKDOWN)
    assert [(r.prompt_tokens, r.sequences, r.kv_cells) for r in output.rows] == [(16, 1, 20), (16, 2, 40)]
    assert output.rows[1].prompt_s == pytest.approx(0.215) and output.rows[1].gen_s == pytest.approx(0.116)
    assert output.settings.n_kv_max == 512 and output.settings.is_pp_shared == 0


def test_missing_or_garbled_rows_are_cut_short_in_one_line() -> None:
    with pytest.raises(OutputCutShort, match="no test rows"):
        parse_batched_bench("\n")
    lines = JSONL.strip().splitlines()
    with pytest.raises(OutputCutShort, match="JSONL line 4") as caught:
        parse_batched_bench("\n".join([*lines[:3], lines[3][:80]]))
    assert "\n" not in str(caught.value)
    with pytest.raises(OutputCutShort, match="3 of 4 tests"):
        check_grid(parse_batched_bench("\n".join(lines[:3])), [16, 32], [4], [1, 2])


def test_the_context_fits_every_test_in_its_stream() -> None:
    assert context_for([32, 128, 512], [32], [1, 2, 4, 8]) == 8 * 768
    command = batched_bench_command(Path("b"), Path("m.gguf"), [32, 512], [32], [1, 8], threads=2)
    assert command[command.index("-npp") + 1] == "32,512" and command[command.index("-c") + 1] == "6144"
    assert command[-4:] == ["--output-format", "jsonl", "-t", "2"]


def _toolchain() -> Toolchain:
    tools = {"llama-server": Path("/bin/llama-server"), BATCHED_BENCH_TOOL: Path("/bin/llama-batched-bench")}
    return Toolchain(tools, "cache", "version: 0.6.0-dev (build 0, commit unknown)")


def _run(stdout: str, returncode: int = 0, timed_out: bool = False, stderr: str = "") -> ToolRun:
    return ToolRun(("llama-batched-bench",), returncode, stdout, stderr, 1.5, timed_out)


def test_a_run_is_parsed_and_a_cut_short_one_is_run_again(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    outputs = ["\n".join(JSONL.splitlines()[:2]), JSONL]

    def runner(command: list[str], on_output: object, timeout_s: float | None) -> ToolRun:
        return _run(outputs.pop(0))

    result = run_batched_bench(_toolchain(), model, [16, 32], [4], [1, 2], threads=1, runner=runner)
    assert not outputs and len(result.rows) == 4 and result.model_size_bytes == 10
    assert result.settings.n_threads == 1 and result.llama_cpp["origin"] == "cache"


@pytest.mark.parametrize(
    ("run", "message"),
    [
        (_run("", timed_out=True), "did not finish within"),
        (_run("", returncode=-9), "killed by SIGKILL"),
        (_run("", returncode=1, stderr="main: error: unable to load model\n"), "could not load"),
    ],
)
def test_a_failed_run_is_one_line(tmp_path: Path, run: ToolRun, message: str) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    with pytest.raises(QuantloadError, match=message) as caught:  # ModelError for a load failure
        run_batched_bench(_toolchain(), model, [16], [4], [1], runner=lambda *a, **k: run)
    assert "\n" not in caught.value.one_line()


def test_bad_test_values_are_refused_before_running(tmp_path: Path) -> None:
    with pytest.raises(MeasurementError, match="positive -npl"):
        run_batched_bench(_toolchain(), tmp_path / "m.gguf", [16], [4], [], runner=lambda *a, **k: _run(""))


def test_several_runs_keep_each_tests_fastest_prefill_and_decode(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    slow = JSONL.replace('"t_pp": 0.107845', '"t_pp": 0.9').replace('"t_tg": 0.124340', '"t_tg": 0.1')
    outputs = [JSONL, slow]

    def runner(command: list[str], on_output: object, timeout_s: float | None) -> ToolRun:
        return _run(outputs.pop(0))

    runs = [run_batched_bench(_toolchain(), model, [16, 32], [4], [1, 2], runner=runner) for _ in range(2)]
    combined = fastest_of(runs)
    assert combined.runs == 2 and len(combined.run_rows) == 2 and combined.run_rows[1][0].prompt_s == 0.9
    assert combined.rows[0].prompt_s == pytest.approx(0.107845)  # the first run was faster
    assert combined.rows[3].gen_s == pytest.approx(0.1)  # the second run was
    assert fastest_of(runs[:1]) == runs[0].model_copy(update={"measured_at": runs[0].measured_at})
    other = runs[1].model_copy(update={"rows": runs[1].rows[:3]})
    with pytest.raises(MeasurementError, match="differ"):
        fastest_of([runs[0], other])
