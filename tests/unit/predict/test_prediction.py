"""`quantload predict` without measuring: the server's flags it reads, the workload's shapes, the
costs' match to the server, the prediction from measured SmolLM2 curves, and the command itself."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from quantload.cli.main import build_app
from quantload.config import Settings
from quantload.errors import ConfigError
from quantload.predict.costs import load_costs_file
from quantload.predict.measure import measuring_grid
from quantload.predict.prediction import (
    PREDICT_SCHEMA,
    ServerFlagsUsed,
    check_costs_match,
    predict_file,
    server_flags_used,
)
from quantload.predict.search import SIMULATION_ENDED
from quantload.predict.workload_shapes import TEMPLATE_TOKENS, workload_shapes
from quantload.slo import Slo

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SMOLLM2_COSTS = FIXTURES / "predict" / "smollm2-q4_k_m-costs.json"


def settings_of(**sections: dict[str, object]) -> Settings:
    return Settings.model_validate(sections)


def test_the_flags_come_from_the_server_settings_and_its_extra_args() -> None:
    plain = server_flags_used(settings_of(server={"slots": 4, "ctx_per_slot": 2048, "threads": 1}))
    assert plain == ServerFlagsUsed(4, 2048, 2048, 512, 1, True)
    given = server_flags_used(settings_of(server={"extra_args": ["-b", "256", "--ubatch-size=1024", "-nocb"]}))
    assert (given.n_batch, given.n_ubatch, given.continuous_batching) == (256, 256, False)  # -ub <= -b
    with pytest.raises(ConfigError, match="-b 'lots'"):
        server_flags_used(settings_of(server={"extra_args": ["-b", "lots"]}))


def test_curves_measured_with_other_flags_are_refused_with_what_to_do() -> None:
    costs = load_costs_file(SMOLLM2_COSTS)
    flags = ServerFlagsUsed(8, 4096, costs.n_batch, costs.n_ubatch, costs.n_threads, True)
    check_costs_match(costs, flags, "Q4_K_M")
    with pytest.raises(ConfigError, match="-t 1, the server runs with -b 2048 -ub 512 -t 2") as caught:
        check_costs_match(costs, ServerFlagsUsed(8, 4096, 2048, 512, 2, True), "Q4_K_M")
    assert "measure them again" in str(caught.value.hint)


def test_length_workloads_are_their_token_counts_clipped_to_the_slot() -> None:
    settings = settings_of(
        workload={"kind": "lengths", "input_lengths": "fixed:300", "output_lengths": "uniform:10-20"},
        server={"ctx_per_slot": 256},
    )
    shapes = workload_shapes(settings)
    outputs = {shape.output_tokens for shape in shapes.shapes.shapes}
    assert outputs <= set(range(10, 21)) and len(outputs) > 5
    # 300 prompt tokens do not fit a 256-token slot with the output: the prompt is cut to fit
    assert all(s.prompt_tokens + s.output_tokens == 255 for s in shapes.shapes.shapes)
    assert shapes.source == "lengths: fixed:300 -> uniform:10-20" and shapes.notes == ()


def test_prompt_workloads_add_the_template_and_say_their_outputs_are_the_longest() -> None:
    settings = settings_of(load={"max_prompt_tokens": 200, "max_tokens": 64})
    shapes = workload_shapes(settings)
    assert all(s.output_tokens == 64 for s in shapes.shapes.shapes)
    assert max(s.prompt_tokens for s in shapes.shapes.shapes) <= 200 + TEMPLATE_TOKENS
    assert min(s.prompt_tokens for s in shapes.shapes.shapes) > TEMPLATE_TOKENS
    assert any("longest replies" in note for note in shapes.notes)
    with pytest.raises(ConfigError, match=r"workload\.kind = sessions is not predicted"):
        workload_shapes(settings_of(workload={"kind": "sessions"}))


def test_dataset_workloads_are_planned_as_the_load_plans_them(tmp_path: Path) -> None:
    # two ShareGPT conversations: a 400-character first turn with a 40-character reply, and a
    # 80-character one whose reply is longer than workload.max_output_tokens allows
    rows = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": "w" * 400}, {"from": "gpt", "value": "r" * 40}],
        },
        {
            "id": "b",
            "conversations": [{"from": "human", "value": "w" * 80}, {"from": "gpt", "value": "r" * 4000}],
        },
    ]
    (tmp_path / "chats.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    settings = settings_of(workload={"kind": "dataset", "dataset": "chats.jsonl", "max_output_tokens": 300})
    shapes = workload_shapes(settings, cwd=tmp_path)
    found = {(s.prompt_tokens, s.output_tokens) for s in shapes.shapes.shapes}
    assert found == {(100 + TEMPLATE_TOKENS, 10), (20 + TEMPLATE_TOKENS, 300)}  # about 4 characters a token
    assert shapes.source == "dataset: chats.jsonl (2 conversations)"
    assert any("four characters a token" in note for note in shapes.notes)
    assert any("cycl" in note for note in shapes.notes)  # 4000 requests from 2 conversations
    with pytest.raises(ConfigError, match=r"no dataset given for this workload \(workload\.dataset is unset\)"):
        workload_shapes(settings_of(workload={"kind": "dataset"}))


def test_the_grid_spans_the_workload_prompts_and_the_slots() -> None:
    settings = settings_of(workload={"kind": "lengths", "input_lengths": "uniform:100-1000"})
    npp, npl = measuring_grid(workload_shapes(settings), ServerFlagsUsed(6, 4096, 2048, 512, 1, True))
    assert npp[0] == 32 and 450 <= npp[1] <= 650 and 850 <= npp[2] <= 1000
    assert npl == [1, 2, 4, 6]


def test_smollm2_curves_predict_a_limit_inside_its_interval_and_the_same_each_time() -> None:
    costs = load_costs_file(SMOLLM2_COSTS)
    settings = settings_of(load={"max_prompt_tokens": 200}, server={"threads": 1})
    slo = Slo(3.0, 0.2, "p90", "p90")
    shapes = workload_shapes(settings)
    flags = server_flags_used(settings)
    first = predict_file("Q4_K_M", costs, flags, shapes, slo, max_users=16, requests_per_level=400)
    again = predict_file("Q4_K_M", costs, flags, shapes, slo, max_users=16, requests_per_level=400)
    assert first == again
    found = first.limit
    assert found.limit is not None and found.limit_low is not None and found.limit_high is not None
    assert 1 <= found.limit_low <= found.limit <= found.limit_high < 16
    # each sweep stops two misses past its limit, and the TTFT grows with the users
    assert [level.meets for level in found.levels][-2:] == [False, False]
    ttfts = [level.ttft_s for level in found.levels]
    assert all(a is not None and b is not None and a < b for a, b in itertools.pairwise(ttfts))
    shares = np.array([[lv.queue_share, lv.prefill_share, lv.decode_share] for lv in found.levels])
    assert np.allclose(shares.sum(axis=1), 1.0)
    assert "predicted limit" in first.sentence() and "interval" in first.sentence()


def write_small_gguf(path: Path) -> Path:
    """A GGUF with a Q4_K_M file type and one small tensor: enough for the command's checks."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.ones((16, 8), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_command_predicts_from_given_curves_and_writes_predict_json(tmp_path: Path) -> None:
    model = write_small_gguf(tmp_path / "model.gguf")
    out = tmp_path / "out"
    args = [
        "predict", str(model), "--costs", str(SMOLLM2_COSTS), "--threads", "1", "--slo-ttft", "3",
        "--slo-tpot", "0.2", "--slo-ttft-percentile", "p90", "--slo-tpot-percentile", "p90",
        "--max-users", "12", "--requests", "200", "--out", str(out),
    ]  # fmt: skip
    env = {"COLUMNS": "200", "QUANTLOAD_LOAD__MAX_PROMPT_TOKENS": "200", "QUANTLOAD_SLO__MAX_FAILED_FRAC": "0.1"}
    shown = CliRunner().invoke(build_app(), args, env=env)
    assert shown.exit_code == 0, shown.output
    assert "predicted limit" in shown.output and "interval" in shown.output
    written = json.loads((out / "predict.json").read_text())
    assert written["schema"] == PREDICT_SCHEMA
    (prediction,) = written["predictions"].values()
    assert prediction["flags"]["threads"] == 1 and prediction["limit"]["limit"] >= 1
    # the limit search a load would run with these settings, predicted on the same levels
    search = prediction["limit"]["search"]
    assert 1 <= search["limit"] <= prediction["limit"]["limit"] and search["trials"]
    assert "a limit search of up to 600 s a level is predicted to show" in shown.output
    # at the default 1 % failed allowance a level needs 380 requests: 200 simulated cannot decide it
    few = CliRunner().invoke(build_app(), [*args, "--json"], env={**env, "QUANTLOAD_SLO__MAX_FAILED_FRAC": "0.01"})
    (short,) = json.loads(few.output)["predictions"].values()
    assert short["limit"]["search"]["limit"] is None
    assert {trial["why"] for trial in short["limit"]["search"]["trials"]} >= {SIMULATION_ENDED}
    twice = ["predict", str(model), "--costs", str(SMOLLM2_COSTS), "--costs", "x"]
    wrong = CliRunner().invoke(build_app(), twice)
    # the error reaches the CLI's edge (quantload.cli.main turns it into its one line)
    assert isinstance(wrong.exception, ConfigError) and "2 --costs file(s) for 1 model file(s)" in str(wrong.exception)


def test_a_server_at_llama_cpps_default_threads_takes_the_count_the_tool_used() -> None:
    costs = load_costs_file(SMOLLM2_COSTS)  # measured with -t 1
    settings = settings_of(load={"max_prompt_tokens": 200})  # server.threads = 0: llama.cpp decides
    flags = server_flags_used(settings)
    assert flags.threads == 0
    found = predict_file("Q4_K_M", costs, flags, workload_shapes(settings), Slo(3.0, 0.2, "p90", "p90"), 4, 100)
    assert found.flags.threads == costs.n_threads == 1
