"""llama-perplexity's KL-divergence output: parsing real captured runs, and refusing broken ones."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from quality_captured import captured_run

from quantload.errors import MeasurementError, ModelError
from quantload.llamacpp.kld import (
    base_command,
    compare_command,
    diagnose_kld_failure,
    parse_chunk_rows,
    parse_kld_output,
    run_base,
    run_compare,
)
from quantload.llamacpp.kld_base import base_file_size_bytes
from quantload.llamacpp.perplexity import diagnose_failure
from quantload.llamacpp.tool_run import ToolRun
from quantload.llamacpp.toolchain import Toolchain

MODEL = Path("m/Q8_0.gguf")
BASE = Path("cache/kld/base.logits")
TEXT = Path("wiki.test.raw")


def output_of(name: str) -> tuple[str, str]:
    run = captured_run(name)
    return run.stdout, run.stderr


def test_smollm2_q4_k_m_statistics_are_read() -> None:
    output = parse_kld_output(*output_of("kld_smollm2_q4_k_m"))
    stats = output.statistics
    assert (output.n_chunks, output.ctx_tokens, output.batch_tokens, output.n_seq) == (4, 512, 512, 1)
    assert output.tokens_scored == 4 * 255
    assert (stats.kld_mean.value, stats.kld_mean.error) == (0.056713, 0.002277)
    assert stats.kld_quantiles["median"] == 0.038787
    assert stats.kld_quantiles["p99"] == 0.340295
    assert stats.kld_quantiles["min"] == 0.000002
    assert stats.kld_quantiles["p99_9"] == 0.808371
    assert stats.kld_quantiles["max"] == 0.811854
    assert set(stats.kld_quantiles) == {
        "p99_9", "p99", "p95", "p90", "median", "p10", "p5", "p1", "p0_1", "max", "min",
    }  # fmt: skip
    assert (stats.same_top_p_pct.value, stats.same_top_p_pct.error) == (85.196, 1.113)
    assert (stats.delta_p_rms_pct.value, stats.delta_p_rms_pct.error) == (5.577, 0.368)
    assert (stats.ln_ppl_ratio.value, stats.ln_ppl_ratio.error) == (0.045933, 0.012185)
    assert (stats.ppl_ratio.value, stats.ppl_ratio.error) == (1.047005, 0.012758)
    assert stats.ppl_q.value == pytest.approx(24.935261)
    assert stats.ppl_base.value == pytest.approx(23.81581)
    assert stats.delta_p_quantiles_pct["p75"] < stats.delta_p_quantiles_pct["max"]
    assert 0 < stats.ln_ppl_correlation_pct <= 100
    assert [row.chunk for row in output.rows] == [1, 2, 3, 4]
    assert output.rows[-1].kld_mean == pytest.approx(stats.kld_mean.value, abs=1e-5)


def test_captured_values_match_the_printed_lines() -> None:
    stdout, _ = output_of("kld_smollm2_q4_k_m")
    assert "Mean    KLD:   0.056713 ±   0.002277" in stdout
    assert "Median  KLD:   0.038787" in stdout
    assert "99.0%   KLD:   0.340295" in stdout


def test_tiny_run_with_a_quantized_kv_cache_is_read() -> None:
    output = parse_kld_output(*output_of("kld_tiny_f16_kv_q8_0"))
    assert output.n_chunks == 3 and output.ctx_tokens == 128
    assert output.statistics.kld_mean.value == 0.000001
    assert output.statistics.same_top_p_pct.value == 99.471


def test_rows_are_read_as_printed() -> None:
    rows = parse_chunk_rows(output_of("kld_tiny_q8_0")[0])
    assert len(rows) == 3
    first = rows[0]
    assert (first.perplexity, first.perplexity_error) == (137380.6897, 6978.7169)
    assert (first.ln_ppl_ratio, first.kld_mean, first.same_top_p_pct) == (0.001, 0.00002, 98.413)


def test_killed_run_names_the_signal_and_the_chunks_done() -> None:
    run = captured_run("kld_killed", returncode=-9)
    with pytest.raises(MeasurementError, match=r"killed by SIGKILL after 3 chunks"):
        diagnose_kld_failure(run, MODEL, BASE)
    with pytest.raises(MeasurementError, match=r"planned 12 KLD chunks but printed rows for 3"):
        parse_kld_output(run.stdout, run.stderr)


def test_truncated_output_exiting_0_is_refused() -> None:
    run = captured_run("kld_truncated")
    diagnose_kld_failure(run, MODEL, BASE)  # nothing on stderr explains it
    with pytest.raises(MeasurementError, match=r"statistics are incomplete .*first 'Mean KLD'.*truncated"):
        parse_kld_output(run.stdout, run.stderr)


def test_base_of_another_vocabulary_is_named_even_when_the_tool_aborts() -> None:
    run = captured_run("kld_vocab_mismatch_abort", returncode=-6)
    expected = r"151,936-token vocabulary; m/Q8_0\.gguf has 49,152: the base is from another model"
    with pytest.raises(MeasurementError, match=expected):
        diagnose_kld_failure(run, MODEL, BASE)


def test_base_of_another_vocabulary_is_refused_although_numbers_were_printed() -> None:
    run = captured_run("kld_vocab_mismatch_larger")
    assert "Same top p" in run.stdout  # the tool went on and printed garbage
    with pytest.raises(MeasurementError, match=r"49,152-token vocabulary; .* has 151,936"):
        diagnose_kld_failure(run, MODEL, BASE)


def test_base_of_a_larger_context_is_named_with_the_fix() -> None:
    run = captured_run("kld_ctx_mismatch")
    with pytest.raises(MeasurementError, match=r"context of 512 tokens; this run used 256") as error:
        diagnose_kld_failure(run, MODEL, BASE)
    assert "compare with --ctx 512" in error.value.one_line()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("kld_base_cut", r"cut short: it ends before chunk 2"),
        ("kld_not_a_base", r"is not a llama-perplexity base logits file"),
    ],
)
def test_broken_base_files_are_named(name: str, expected: str) -> None:
    with pytest.raises(MeasurementError, match=expected):
        diagnose_kld_failure(captured_run(name), MODEL, BASE)


def test_too_few_tokens_for_statistics_says_how_many_are_needed() -> None:
    run = captured_run("kld_too_few_tokens")
    diagnose_kld_failure(run, MODEL, BASE)
    with pytest.raises(MeasurementError, match=r"63 tokens were scored and it needs at least 100"):
        parse_kld_output(run.stdout, run.stderr)


def test_base_run_on_a_too_short_text_is_a_clear_error() -> None:
    with pytest.raises(MeasurementError, match=r"only 74 tokens; a context of 128 needs at least 256"):
        diagnose_failure(captured_run("kld_base_too_short"), MODEL, TEXT)


def test_base_run_that_cannot_write_its_file_says_so() -> None:
    run = captured_run("kld_base_cannot_write")
    with pytest.raises(MeasurementError, match=r"cannot write the logits file /nonexistent/dir/base\.bin"):
        diagnose_failure(run, MODEL, TEXT)


def test_killed_base_run_is_named() -> None:
    run = captured_run("kld_base_killed", returncode=-9)
    with pytest.raises(MeasurementError, match=r"killed by SIGKILL after 2 chunks"):
        diagnose_failure(run, MODEL, TEXT)


def test_a_model_that_does_not_load_is_a_model_error() -> None:
    run = captured_run("perplexity_load_failure", returncode=1)
    with pytest.raises(ModelError, match=r"could not load m/Q8_0\.gguf"):
        diagnose_kld_failure(run, MODEL, BASE)


def test_a_last_row_that_disagrees_with_the_mean_is_garbled() -> None:
    stdout, stderr = output_of("kld_smollm2_q4_k_m")
    edited = stdout.replace("Mean    KLD:   0.056713", "Mean    KLD:   0.066713")
    with pytest.raises(MeasurementError, match=r"differs from its mean KLD"):
        parse_kld_output(edited, stderr)


def test_nan_uncertainties_are_kept_as_nan_and_a_nan_mean_is_refused() -> None:
    stdout, stderr = output_of("kld_tiny_q8_0")
    with_nan = stdout.replace(" 99.99%", "   -nan%").replace("-0.000300 ±   0.000397", "-0.000300 ±       nan")
    stats = parse_kld_output(with_nan, stderr).statistics
    assert math.isnan(stats.ln_ppl_correlation_pct) and math.isnan(stats.ln_ppl_ratio.error)
    broken = stdout.replace("Mean    KLD:   0.000015", "Mean    KLD:        nan")
    with pytest.raises(MeasurementError, match=r"mean KLD = nan"):
        parse_kld_output(broken, stderr)


def test_compare_command_passes_the_cache_type_and_flash_attention_where_needed() -> None:
    binary = Path("bin/llama-perplexity")
    plain = compare_command(binary, MODEL, BASE, 512)
    assert plain == [
        "bin/llama-perplexity", "-m", "m/Q8_0.gguf", "-c", "512", "-b", "512",
        "--kl-divergence-base", "cache/kld/base.logits", "--kl-divergence",
    ]  # fmt: skip
    assert "-f" not in plain  # the tokens come from the base file
    quantized = compare_command(binary, MODEL, BASE, 512, "q4_0", threads=2)
    assert quantized[-8:] == ["-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on", "-t", "2"]
    assert compare_command(binary, MODEL, BASE, 512, "bf16")[-4:] == ["-ctk", "bf16", "-ctv", "bf16"]


def test_base_command_scores_the_text_and_names_the_file() -> None:
    command = base_command(Path("llama-perplexity"), MODEL, TEXT, BASE, 512, 40)
    assert command[command.index("--chunks") + 1] == "40"
    assert command[command.index("-f") + 1] == "wiki.test.raw"
    assert command[-2:] == ["--kl-divergence-base", "cache/kld/base.logits"]


class StreamingRunner:
    """Plays a captured run back through on_output in pieces, as a real run would arrive."""

    def __init__(self, name: str, write_base: int | None = None) -> None:
        self.name = name
        self.write_base = write_base  # bytes of base file to create where the command says
        self.commands: list[list[str]] = []

    def __call__(self, command: list[str], on_output: Any, timeout_s: float | None = None) -> ToolRun:
        self.commands.append(command)
        run = captured_run(self.name)
        if self.write_base is not None:
            target = Path(command[command.index("--kl-divergence-base") + 1])
            with target.open("wb") as handle:
                handle.write(b"_logits_" + (128).to_bytes(4, "little") + (151936).to_bytes(4, "little"))
                handle.write((3).to_bytes(4, "little"))
                handle.truncate(self.write_base)
        on_output("stderr", run.stderr)
        for line in run.stdout.splitlines(keepends=True):
            half = len(line) // 2
            on_output("stdout", line[:half])
            on_output("stdout", line[half:])
        return run


def test_compare_progress_follows_the_rows(fake_toolchain: Toolchain) -> None:
    calls: list[tuple[float, float | None]] = []
    run = run_compare(
        fake_toolchain, MODEL, BASE, 128, progress=lambda done, total, note="": calls.append((done, total)),
        runner=StreamingRunner("kld_tiny_q8_0"),
    )
    assert run.output.statistics.kld_mean.value == 0.000015
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]


def test_base_run_leaves_a_checked_file_under_its_final_name(fake_toolchain: Toolchain, tmp_path: Path) -> None:
    target = tmp_path / "kld" / "base.logits"
    runner = StreamingRunner("kld_base_tiny", write_base=base_file_size_bytes(151936, 128, 3))
    run, header = run_base(fake_toolchain, MODEL, TEXT, target, 128, 3, runner=runner)
    assert (header.ctx_tokens, header.n_vocab, header.n_chunks) == (128, 151936, 3)
    assert target.stat().st_size == 57_434_876
    assert run.output.perplexity == pytest.approx(143866.7920)
    assert list(target.parent.iterdir()) == [target]  # no partial file left


def test_a_short_base_file_is_refused_and_removed(fake_toolchain: Toolchain, tmp_path: Path) -> None:
    target = tmp_path / "base.logits"
    runner = StreamingRunner("kld_base_tiny", write_base=1_000_000)  # as a full disk leaves it
    with pytest.raises(MeasurementError, match=r"has 1,000,000 bytes, but 3 chunks .* need 57,434,876"):
        run_base(fake_toolchain, MODEL, TEXT, target, 128, 3, runner=runner)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_base_run_leaves_nothing_behind(fake_toolchain: Toolchain, tmp_path: Path) -> None:
    runner = StreamingRunner("kld_base_too_short", write_base=12)
    with pytest.raises(MeasurementError, match=r"tokenizes to only 74 tokens"):
        run_base(fake_toolchain, MODEL, TEXT, tmp_path / "base.logits", 128, 3, runner=runner)
    assert list(tmp_path.iterdir()) == []
