"""Conversations beyond the slot: llama-server's 400 as its own error class with its two counts,
truncated and shifted replies, the client's history trim (server-counted), the context experiment
against fake servers (with and without control of the server), its bad input, and its report.

Its tests that start processes: tests/integration/load/test_context_overflow_processes.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from load_api import context, settings_context
from quantload.config import Settings, load_config
from quantload.errors import ConfigError
from quantload.experiments import registry
from quantload.experiments.base import ExperimentContext
from quantload.experiments.context.stages import run as run_context
from quantload.load.client import ConnectionPool, Endpoint, stream_request
from quantload.load.fakeserver import FakeScript, FakeServer, chat_prompt, count_tokens
from quantload.load.history_trim import HistoryTrimmer, TemplateCost, measure_template
from quantload.load.measure import build_record
from quantload.load.openai_chunks import context_exceeded
from quantload.load.plan import LoadPlan, RequestParams, StagePlan
from quantload.load.records import RequestRecord
from quantload.load.stream_result import StreamResult
from quantload.load.tickets import StageContext, StageTracker, Ticket, TurnTicket
from quantload.run_context import RunContext
from quantload.served import ServedTarget

REFUSAL = (
    b'{"error":{"code":400,"message":"request (259 tokens) exceeds the available context size (256 tokens),'
    b' try increasing it","type":"exceed_context_size_error","n_prompt_tokens":259,"n_ctx":256}}'
)
TARGET = ServedTarget(name="fake", quant="Q4_K_M", model="m", url="http://127.0.0.1:1")


def test_the_refusal_is_read_with_its_two_counts_and_nothing_else_is() -> None:
    refused = context_exceeded(400, REFUSAL)
    assert refused is not None and (refused.n_prompt_tokens, refused.n_ctx) == (259, 256)
    assert "exceeds the available context size" in refused.message
    flat = json.dumps({"type": "exceed_context_size_error", "message": "m", "n_prompt_tokens": 9, "n_ctx": 8})
    assert context_exceeded(400, flat.encode()) == type(refused)("m", 9, 8)
    assert context_exceeded(500, REFUSAL) is None  # only a 400 is a refusal
    assert context_exceeded(400, b'{"error":{"code":400,"type":"invalid_request_error"}}') is None
    assert context_exceeded(400, b"not json") is None
    assert context_exceeded(400, b'{"error":{"type":"exceed_context_size_error","n_ctx":"x"}}') == type(refused)(
        "the request exceeds the slot's context", None, None
    )


def test_the_client_records_a_refusal_as_context_exceeded_never_a_generic_4xx() -> None:
    script = FakeScript(ttft_ms=(1, 2), itl_ms=(1, 1), tokens=4, n_ctx=20, enforce_context=True)
    with FakeServer(script) as fake:
        pool = ConnectionPool(Endpoint.from_url(fake.url))
        body = {"messages": [{"role": "user", "content": "word " * 30}], "stream": True, "max_tokens": 4}
        request = pool.endpoint.request_bytes(json.dumps(body).encode())
        result = stream_request(pool, request, 10.0)
        assert result.error_class == "context_exceeded" and result.status == 400
        assert (result.n_prompt_tokens, result.n_ctx) == (count_tokens(chat_prompt(body["messages"])), 20)
        short = {**body, "messages": [{"role": "user", "content": "hi"}]}
        assert stream_request(pool, pool.endpoint.request_bytes(json.dumps(short).encode()), 10.0).ok


def _record(ticket: Ticket, prompt: int, completion: int, finish: str = "length") -> RequestRecord:
    result = StreamResult(sent_unix_s=1.0, end_s=0.5, finish_reason=finish, classified=True)
    result.usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    result.content_times_s = [0.1, 0.2]
    return build_record(ticket, result, 0.0, "w")


def test_a_reply_stopped_by_the_full_slot_is_truncated_and_one_past_it_is_shifted() -> None:
    plan = LoadPlan(
        run_id="r", invocation="i", target=TARGET, params=RequestParams(), prompts={"p": "x"},
        stages=(StagePlan(stage_id="i-0", index=0, experiment="context", users=1, cache_prompt=True,
                          requests=(), slot_context_tokens=100),),
    )  # fmt: skip
    stage = plan.stages[0]
    ticket = Ticket(stage=_context_of(plan, stage), seq=0, prompt_id="p", messages=[], max_tokens=10)
    truncated = _record(ticket, 93, 7)  # the slot filled at 100 tokens: llama-server stops there
    assert (truncated.truncated, truncated.context_shifted) == (True, False)
    shifted = _record(ticket, 95, 10)  # 105 tokens in a 100-token slot: the server shifted it
    assert (shifted.truncated, shifted.context_shifted) == (False, True)
    stopped = _record(ticket, 20, 3, finish="stop")
    assert (stopped.truncated, stopped.context_shifted) == (False, False)
    unknown = Ticket(stage=_context_of(plan, stage.model_copy(update={"slot_context_tokens": None})), seq=0,
                     prompt_id="p", messages=[], max_tokens=10)  # fmt: skip
    assert _record(unknown, 95, 10).context_shifted is None
    failed = build_record(ticket, StreamResult(sent_unix_s=1.0, error_class="context_exceeded", n_prompt_tokens=120,
                                               n_ctx=100, classified=True), 0.0, "w")  # fmt: skip
    assert (failed.truncated, failed.n_prompt_tokens, failed.n_ctx, failed.ok) == (None, 120, 100, False)


def _context_of(plan: LoadPlan, stage: StagePlan) -> StageContext:
    return StageContext.of(plan, stage)


class WordTokenizer:
    """The fake server's tokenizer and template, in-process: words and marks, `[role] text`."""

    def __init__(self) -> None:
        self.calls = 0

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        self.calls += 1
        return list(range(count_tokens(text)))

    def detokenize(self, tokens: Sequence[int]) -> str:
        return " ".join("w" for _ in tokens)

    def apply_template(self, messages: list[dict[str, str]]) -> str:
        return chat_prompt(messages)


def _conversation(turns: int, words: int) -> Ticket:
    plan = LoadPlan(
        run_id="r", invocation="i", target=TARGET, params=RequestParams(), prompts={},
        stages=(StagePlan(stage_id="i-0", index=0, experiment="context", users=1, cache_prompt=True,
                          requests=(), slot_context_tokens=100, context_policy="trim"),),
    )  # fmt: skip
    later = tuple(TurnTicket(f"u{k}", "word " * words, 10, 0.0) for k in range(1, turns))
    return Ticket(
        stage=_context_of(plan, plan.stages[0]), seq=0, prompt_id="u0", max_tokens=10, session_id="s", turn=0,
        messages=[{"role": "system", "content": "sys " * 5}, {"role": "user", "content": "word " * words}],
        later_turns=later, trimmed_turns=0, trimmed_tokens=0,
    )  # fmt: skip


def test_the_template_cost_is_measured_from_the_server_s_own_counts() -> None:
    cost = measure_template(WordTokenizer())
    messages = [{"role": "system", "content": "a b c"}, {"role": "user", "content": "d e"}]
    assert cost.estimate([3, 2]) == count_tokens(chat_prompt(messages))  # "[role]" is 3 tokens, "[assistant]" 3


def test_the_trim_keeps_the_system_prompt_and_the_latest_turns_that_fit() -> None:
    tokenizer = WordTokenizer()
    trimmer = HistoryTrimmer(tokenizer)
    ticket = _conversation(turns=6, words=12)
    for turn in range(1, 6):
        ticket = trimmer.next_turn(ticket, "word " * 10, 10)
        fitted = trimmer.fit(ticket, budget_tokens=80)
        whole = count_tokens(chat_prompt(fitted.ticket.messages))
        assert whole <= 80, turn
        assert fitted.ticket.messages[0]["role"] == "system"  # always kept
        assert fitted.ticket.messages[-1]["content"] == "word " * 12  # the new user turn always sent
        assert [m["role"] for m in fitted.ticket.messages[1:]] == ["user", "assistant"] * (
            (len(fitted.ticket.messages) - 2) // 2
        ) + ["user"]
        ticket = fitted.ticket
    # 5 turns of 12 + 10 words (+ 3 template tokens each) cannot all fit in 80: the earliest went
    assert (ticket.trimmed_turns or 0) >= 3 and ticket.trimmed_tokens == (ticket.trimmed_turns or 0) * (15 + 13)
    assert len(ticket.history_tokens) == len(ticket.messages)


def test_a_history_that_fits_is_sent_whole_and_counted_without_asking_again() -> None:
    tokenizer = WordTokenizer()
    trimmer = HistoryTrimmer(tokenizer, TemplateCost(per_message_tokens=3, base_tokens=3))
    ticket = trimmer.next_turn(_conversation(turns=2, words=3), "a b", 2)
    calls = tokenizer.calls
    fitted = trimmer.fit(ticket, budget_tokens=1000)
    assert fitted.ticket.messages == ticket.messages and fitted.prompt_tokens_counted is None
    assert tokenizer.calls == calls and fitted.ticket.trimmed_turns == 0


def test_a_trim_that_cannot_keep_even_the_newest_turn_sends_it_as_it_is() -> None:
    trimmer = HistoryTrimmer(WordTokenizer())
    ticket = trimmer.next_turn(_conversation(turns=2, words=40), "a", 1)
    fitted = trimmer.fit(ticket, budget_tokens=20)
    assert fitted.ticket.messages[0]["role"] == "system" and len(fitted.ticket.messages) == 2  # what is left
    assert fitted.prompt_tokens_counted is not None and fitted.prompt_tokens_counted > 20  # the server decides


def test_expected_refusals_never_trip_the_breaker_but_other_failures_do() -> None:
    tracker = StageTracker("s", 100, False, 3, ("context_exceeded", "session_cut"))
    for _ in range(30):
        tracker.observe("s", False, False, "session_cut")
    assert not tracker.tripped
    for _ in range(3):
        tracker.observe("s", False, False, "http_5xx")
    assert tracker.tripped


def test_bad_context_settings_are_one_line_before_any_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"context.keep_tokens 1024 is not shorter than the 1024-token slot"):
        load_config(tmp_path, {}, {"context.keep_tokens": 1024})
    with pytest.raises(ConfigError, match="the trim policy cannot keep even the system prompt"):
        load_config(tmp_path, {}, {"context.system_prompt_tokens": 1000, "context.reply_tokens": "fixed:64"})
    # without the trim policy a long system prompt is allowed: only trim must keep it
    load_config(tmp_path, {}, {"context.system_prompt_tokens": 1000, "context.policies": ["fail"]})
    with pytest.raises(ConfigError, match="lists fail more than once"):
        load_config(tmp_path, {}, {"context.policies": ["fail", "fail"]})


def _settings(tmp_path: Path, **changes: object) -> RunContext:
    load = {"warmup_requests": 1, "request_timeout_s": 10, "first_round_jitter_s": 0.0, "metrics_port": 0,
            "max_consecutive_errors": 2}  # fmt: skip
    values = {"conversations": 4, "users": 2, "slots": 2, "ctx_per_slot": 256, "turns": 8,
              "system_prompt_tokens": 16, "turn_tokens": "fixed:20", "reply_tokens": "fixed:12", **changes}  # fmt: skip
    return settings_context(tmp_path, Settings.model_validate({"load": load, "context": values}))


def test_a_slot_too_small_for_the_system_prompt_is_refused_before_any_load(tmp_path: Path) -> None:
    run = _settings(tmp_path, system_prompt_tokens=200, reply_tokens="fixed:40", ctx_per_slot=256)
    script = FakeScript(n_ctx=256, enforce_context=True)
    with FakeServer(script) as fake, pytest.raises(ConfigError, match="cannot keep even the system prompt"):
        run_context(ExperimentContext(run, TARGET.model_copy(update={"url": fake.url})))
    assert not (tmp_path / "records.jsonl").exists()


def test_the_run_plans_the_context_experiment_unless_it_has_no_conversations(tmp_path: Path) -> None:
    assert "context" in [e.name for e in registry.planned(load_config(tmp_path, {}).settings)]
    assert registry.missing_input("context", context(tmp_path, context={"conversations": 0}).settings) == (
        "context.conversations is 0"
    )
    registry.against_any_server(["context"])  # optional: `quantload load` runs fail and trim as they are


def test_a_history_that_cannot_be_counted_fails_its_turn_in_one_line() -> None:
    from types import SimpleNamespace

    from quantload.load.in_locust.runtime import LoadRuntime
    from quantload.load.metrics import LoadMetrics

    sunk: list[RequestRecord] = []
    runtime = LoadRuntime(
        SimpleNamespace(events=None),  # type: ignore[arg-type]
        SimpleNamespace(take=lambda done=None: None),  # type: ignore[arg-type]
        SimpleNamespace(put=sunk.append),  # type: ignore[arg-type]
        LoadMetrics(),
        None,
    )
    ticket = _conversation(turns=2, words=3)  # its server, 127.0.0.1:1, does not answer /tokenize
    reply = StreamResult(sent_unix_s=1.0, usage={"completion_tokens": 2}, classified=True)
    failed = runtime._trimmed_turn(ticket, "a b", reply)
    assert isinstance(failed, StreamResult) and failed.error_class == "connect_error"
    assert (failed.error or "").startswith("the history trim could not count tokens: cannot reach")
    assert "\n" not in (failed.error or "") and failed.end_s == 0.0


def test_a_conversation_needs_its_longest_turn_and_what_a_trim_left_out() -> None:
    import pandas as pd

    from quantload.analysis.capacity_plan import conversation_lengths

    def row(session: str, turn: int, prompt: float, reply: float, trimmed: float | None, ok: bool = True) -> dict:  # type: ignore[type-arg]
        return {"stage_id": "st", "warmup": False, "session_id": session, "turn": turn, "ok": ok,
                "prompt_tokens": prompt, "completion_tokens": reply, "trimmed_tokens": trimmed}  # fmt: skip

    records = pd.DataFrame(
        [row("a", 0, 100, 20, None), row("a", 1, 300, 20, None),  # whole: 320
         row("b", 0, 100, 20, 0), row("b", 1, 150, 20, 400),  # trimmed 400 away: 570
         row("c", 0, 900, 20, None), row("c", 1, float("nan"), float("nan"), None, ok=False)]  # refused: out
    )  # fmt: skip
    stages = pd.DataFrame([{"stage_id": "st", "experiment": "context", "status": "ok"}])
    assert sorted(conversation_lengths(records, stages)) == [320, 570]
    other = stages.assign(experiment="sweep")
    assert conversation_lengths(records, other) == []
