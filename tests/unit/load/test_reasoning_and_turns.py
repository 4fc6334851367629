"""Reasoning chunks count as generated text, answer content is told apart, a conversation's reply is
read back for its next turn, and the records of turns never sent say why."""

from __future__ import annotations

from quantload.config import LoadSettings, SessionSettings, Settings
from quantload.experiments.sessions.stages import sessions_plan
from quantload.load.measure import build_record, cut_turn_records
from quantload.load.openai_chunks import answer_text, classify_payload, classify_stream
from quantload.load.plan import PlannedRequest, PlannedTurn
from quantload.load.stream_result import StreamResult
from quantload.load.tickets import stage_tickets
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget

THINK = b'{"choices":[{"delta":{"reasoning_content":"let me see"}}]}'
ANSWER = b'{"choices":[{"delta":{"content":"Paris"}}]}'
BOTH = b'{"choices":[{"delta":{"reasoning_content":"so","content":"it is"}}]}'
ROLE = b'{"choices":[{"delta":{"role":"assistant","content":null}}]}'
END = b'{"choices":[{"delta":{},"finish_reason":"length"}]}'
USAGE = b'{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4},"timings":{"cache_n":3}}'


def test_a_reasoning_chunk_is_generated_text_of_its_own_kind() -> None:
    think, answer, both = classify_payload(THINK), classify_payload(ANSWER), classify_payload(BOTH)
    assert (think.kind, think.text_chars, think.reasoning_chars) == ("content", 10, 10)
    assert (answer.kind, answer.reasoning_chars) == ("content", 0)
    assert (both.text_chars, both.reasoning_chars) == (7, 2)


def stream(*payloads: bytes) -> StreamResult:
    result = StreamResult(events=[((i + 1) / 10, p) for i, p in enumerate(payloads)])
    return classify_stream(result)


def test_ttft_counts_reasoning_and_the_first_answer_is_kept_apart() -> None:
    result = stream(ROLE, THINK, THINK, ANSWER, ANSWER, END, USAGE, b"[DONE]")
    assert result.ok and result.content_times_s == [0.2, 0.3, 0.4, 0.5]
    assert result.ttft_s == 0.2 and result.answer_s == 0.4 and result.reasoning_chunks == 2
    plain = stream(ROLE, ANSWER, END, b"[DONE]")
    assert plain.ttft_s == plain.answer_s == 0.2 and plain.reasoning_chunks == 0
    only_thinking = stream(THINK, END, b"[DONE]")
    assert only_thinking.ttft_s == 0.1 and only_thinking.answer_s is None


def test_the_reply_sent_back_is_the_answer_without_the_reasoning() -> None:
    assert answer_text([ROLE, THINK, ANSWER, b": comment", BOTH, END, b"[DONE]", b"{broken"]) == "Parisit is"


def session_ticket_plan() -> tuple[object, object]:
    request = PlannedRequest(
        prompt_id="t0", max_tokens=4, session_id="s", later_turns=(PlannedTurn(prompt_id="t1"), PlannedTurn(prompt_id="t2"))
    )
    drawn = StageRequests((request,), {"t0": "a", "t1": "b", "t2": "c"}, "sessions", True)
    target = ServedTarget(name="srv", quant="Q8_0", model="m", url="http://127.0.0.1:1")
    settings = Settings(load=LoadSettings(max_tokens=9), sessions=SessionSettings(users=1))
    plan = sessions_plan(settings, target, [(True, drawn)], "run", "inv")
    return plan, plan.stages[0]


def test_records_carry_the_session_turn_and_both_first_token_times() -> None:
    plan, stage = session_ticket_plan()
    (ticket,) = stage_tickets(plan, stage, warmup=False)  # type: ignore[arg-type]
    result = stream(ROLE, THINK, ANSWER, END, USAGE, b"[DONE]")
    result.end_s = 0.7
    record = build_record(ticket, result, 0.0, "h:1")
    assert (record.session_id, record.turn, record.workload, record.max_tokens) == ("s", 0, "sessions", 4)
    assert (record.ttft_s, record.ttft_content_s, record.reasoning_chunks) == (0.2, 0.3, 1)
    later = build_record(ticket.next_turn("x"), result, 0.0, "h:1")
    assert (later.turn, later.max_tokens, later.prompt_id) == (1, 9, "t1")  # no turn length: the plan's


def test_turns_after_a_failed_one_are_recorded_as_cut() -> None:
    plan, stage = session_ticket_plan()
    (ticket,) = stage_tickets(plan, stage, warmup=False)  # type: ignore[arg-type]
    cut = cut_turn_records(ticket, "h:1", 5.0, "turn 0 failed (http_5xx)")
    assert [(r.turn, r.prompt_id, r.error_class, r.ok) for r in cut] == [
        (1, "t1", "session_cut", False),
        (2, "t2", "session_cut", False),
    ]
    assert all(r.error == "turn 0 failed (http_5xx)" and r.session_id == "s" for r in cut)
