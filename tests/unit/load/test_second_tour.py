"""The second bad-input tour's cases, each with its clear line: bounds said before a stage starts,
flags a workload does not read, a server wanting a key, lengths that cannot be drawn, batch sizes
llama-server refuses, text that is not text."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from quantload.cli.main import main
from quantload.config import LoadSettings, Settings, WorkloadSettings, load_config
from quantload.errors import ConfigError, MeasurementError, ServerError
from quantload.experiments.trace.stages import trace_plan
from quantload.llamacpp.perplexity import diagnose_failure
from quantload.llamacpp.tool_run import ToolRun
from quantload.load.lengths import parse_length_distribution
from quantload.load.plan import PlannedRequest
from quantload.load.synthetic import ServerTokenizer
from quantload.load.workload_builder import ignored_flags
from quantload.load.workloads import StageRequests
from quantload.quality.dataset import resolve_dataset
from quantload.served import ServedTarget
from quantload.stack import run_steps

CAPTURED = Path(__file__).resolve().parents[2] / "fixtures" / "llamacpp"
TARGET = ServedTarget(name="srv", quant="Q4_K_M", model="m", url="http://127.0.0.1:1")


def _trace_drawn(offsets: list[float]) -> StageRequests:
    requests = tuple(PlannedRequest(prompt_id=f"t{i}", offset_s=o, max_tokens=4) for i, o in enumerate(offsets))
    return StageRequests(requests, {r.prompt_id: "x" for r in requests}, "trace", True)


def test_a_trace_whose_replay_outlasts_the_stage_timeout_is_refused_before_it_starts() -> None:
    settings = Settings(load=LoadSettings(stage_timeout_s=3600))
    with pytest.raises(ConfigError) as caught:
        trace_plan(settings, TARGET, _trace_drawn([0.0, 1e12]), "run", "inv")
    assert "after load.stage_timeout_s = 3,600 s" in caught.value.one_line()
    assert "--speed" in caught.value.hint
    plan = trace_plan(settings, TARGET, _trace_drawn([0.0, 10.0]), "run", "inv")
    assert plan.stages[0].timeout_s == 3600  # bounded by the stated timeout, not stretched


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("normal:mean=inf,sd=10", "mean inf is not a finite number"),
        ("normal:mean=100,sd=nan", "sd nan is not a finite number"),
        ("fixed:100000000", "the length 100000000 is above 1,000,000"),
        ("uniform:1-1e300", "HIGH 1e300 is above 1,000,000"),
        ("lognormal:mean=500,spread=50", "spread 50 is above 5"),
    ],
)
def test_a_length_that_cannot_be_drawn_says_why_instead_of_being_clipped(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_length_distribution(text)


def test_the_largest_length_still_drawn_is_drawn_as_asked() -> None:
    assert parse_length_distribution("fixed:1000000").sample(2, 0) == [1_000_000, 1_000_000]


@pytest.mark.parametrize("pair", ["0/0", "512/0", "99999999999/512"])
def test_batch_sizes_llama_server_refuses_are_refused_in_one_line(pair: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, {}, {"mixed.batch_sizes": [pair]})
    assert "mixed.batch_sizes" in caught.value.one_line() and "\n" not in caught.value.one_line()


def test_a_limit_search_that_starts_above_its_most_is_refused_by_the_configuration(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"limit.max_users \(2\) is below limit.start_users \(4\)"):
        load_config(tmp_path, {}, {"limit.start_users": 4, "limit.max_users": 2})


@pytest.mark.parametrize("flag", ["--price-per-hour", "--target-rps", "--slo-ttft-p99"])
def test_a_plan_or_slo_flag_of_inf_is_refused_in_one_line(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path), flag, "inf"]) == 2
    err = capsys.readouterr().err
    assert "finite number" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_flags_the_workload_does_not_read_are_said(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    settings = Settings(workload=WorkloadSettings(kind="lengths"))
    (line,) = ignored_flags(settings, {"load.prompt_count": 5})
    assert "--prompt-count" in line and "workload.requests = 50" in line and "QUANTLOAD_WORKLOAD__REQUESTS" in line
    assert ignored_flags(Settings(), {"load.prompt_count": 5}) == []
    monkeypatch.setattr(run_steps, "run_experiment", _stop)
    main(["load", "--url", "http://127.0.0.1:9", "--out", str(tmp_path), "--workload", "lengths",
          "--prompt-count", "5"])  # fmt: skip
    assert "warning: --prompt-count sets a stage of the prompts workload" in capsys.readouterr().err


def _stop(*args: Any, **kwargs: Any) -> Any:
    raise ConfigError("stopped here")


@pytest.fixture
def refusing_server() -> Iterator[str]:
    """Answers every POST with 401, as llama-server started with --api-key does without one."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = b'{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}'
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("key", "says"), [(None, "wants an API key"), ("wrong", "refused the API key")])
def test_a_401_from_the_template_endpoint_names_the_api_key(refusing_server: str, key: str | None, says: str) -> None:
    with ServerTokenizer(refusing_server, key) as tokenizer, pytest.raises(ServerError) as caught:
        tokenizer.apply_template([{"role": "user", "content": "hi"}])
    line = caught.value.one_line()
    assert "HTTP 401" in line and says in line and "QUANTLOAD_SERVER__API_KEY" in line and "--api-key-env" in line


def test_a_binary_quality_text_is_refused_before_llama_perplexity_runs(tmp_path: Path) -> None:
    text = tmp_path / "binary.raw"
    text.write_bytes(b"some text\n" * 100 + bytes(range(128, 256)))
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(invalid start byte at byte 1,000\)"):
        resolve_dataset(text, tmp_path, {})


def test_llama_perplexity_dying_on_invalid_codepoint_is_not_called_out_of_memory() -> None:
    run = ToolRun(  # SIGABRT after the uncaught exception
        command=("llama-perplexity",), returncode=-6, wall_time_s=1.0, timed_out=False,
        stdout=(CAPTURED / "perplexity_not_text.stdout").read_text(encoding="utf-8"),
        stderr=(CAPTURED / "perplexity_not_text.stderr").read_text(encoding="utf-8"),
    )  # fmt: skip
    with pytest.raises(MeasurementError) as caught:
        diagnose_failure(run, Path("m/Q8_0.gguf"), Path("binary.raw"))
    line = caught.value.one_line()
    assert "could not tokenize binary.raw: it is not UTF-8 text (llama.cpp: invalid codepoint)" in line
    assert "out of memory" not in line
