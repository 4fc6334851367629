"""Workloads: synthetic prompts of an exact token length (against the fake server's tokenizer and
chat template), length distributions, datasets, traces and sessions drawn as stage requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quantload.load.datasets import read_dataset
from quantload.load.fakeserver import FakeScript, FakeServer, chat_prompt, count_tokens
from quantload.load.lengths import parse_length_distribution
from quantload.load.prompts import Prompt
from quantload.load.synthetic import PromptMaker, ServerTokenizer, template_overhead
from quantload.load.trace import TraceRequest
from quantload.load.workloads import (
    DatasetWorkload,
    LengthsWorkload,
    PromptSetWorkload,
    SessionWorkload,
    TraceWorkload,
    cycle_prompts,
)


@pytest.fixture(scope="module")
def tokenizer() -> Iterator[ServerTokenizer]:
    with FakeServer(FakeScript(n_ctx=2048)) as server, ServerTokenizer(server.url) as found:
        yield found


@pytest.fixture(scope="module")
def maker(tokenizer: ServerTokenizer) -> PromptMaker:
    return PromptMaker(tokenizer)


def whole_prompt(text: str) -> int:
    """What the fake counts as usage.prompt_tokens for one user turn."""
    return count_tokens(chat_prompt([{"role": "user", "content": text}]))


def test_the_template_overhead_is_measured_with_apply_template(tokenizer: ServerTokenizer) -> None:
    # the fake's template: "[user] TEXT [assistant]" -> three tokens on each side
    assert template_overhead(tokenizer) == 6
    assert tokenizer.slots_and_context() == (4, 2048)


@pytest.mark.parametrize("tokens", [1, 2, 7, 8, 9, 50, 333, 1500])
def test_user_turns_have_the_exact_token_count(maker: PromptMaker, tokens: int) -> None:
    text, count = maker.user_text(tokens, index=3)
    assert count == tokens == count_tokens(text)


def test_whole_prompts_have_the_asked_length_and_differ(maker: PromptMaker) -> None:
    texts = set()
    for index, asked in enumerate([7, 20, 64, 400]):
        text, _ = maker.prompt(asked, index)
        assert whole_prompt(text) == asked
        texts.add(text)
    assert len(texts) == 4
    with pytest.raises(ValueError, match="chat template alone takes 6"):
        maker.prompt(6, 0)


def test_lengths_workload_draws_enforced_lengths_within_the_context(maker: PromptMaker) -> None:
    workload = LengthsWorkload(
        maker, parse_length_distribution("uniform:20-300"), parse_length_distribution("buckets:16x0.5,64x0.5"), 2048
    )
    drawn = workload.stage_requests(12, seed=5, tag="st-")
    assert drawn.ignore_eos is True and drawn.workload == "lengths" and drawn.template_overhead_tokens == 6
    assert {r.max_tokens for r in drawn.requests} <= {16, 64}
    for request in drawn.requests:
        assert request.prompt_tokens_asked is not None and 20 <= request.prompt_tokens_asked <= 300
        assert whole_prompt(drawn.texts[request.prompt_id]) == request.prompt_tokens_asked
    again = workload.stage_requests(12, seed=5, tag="other-")
    assert [r.prompt_tokens_asked for r in again.requests] == [r.prompt_tokens_asked for r in drawn.requests]
    assert not set(again.texts.values()) & set(drawn.texts.values())  # each stage its own texts


def test_lengths_beyond_the_slot_context_are_shortened_and_said(maker: PromptMaker) -> None:
    workload = LengthsWorkload(
        maker, parse_length_distribution("fixed:900"), parse_length_distribution("fixed:200"), 1024
    )
    drawn = workload.stage_requests(3, seed=1, tag="t-")
    assert all((r.prompt_tokens_asked or 0) + (r.max_tokens or 0) <= 1024 for r in drawn.requests)
    assert drawn.notes and "3 request(s) asked for more than the server's 1024-token slot context" in drawn.notes[0]


def test_a_prompt_set_beyond_its_size_is_cycled_and_said() -> None:
    prompts = [Prompt(f"p{i}", f"text {i}", 2) for i in range(3)]
    assert [p.id for p in cycle_prompts(prompts, 7)] == ["p0", "p1", "p2", "p0#2", "p1#2", "p2#2", "p0#3"]
    drawn = PromptSetWorkload(prompts, "builtin").stage_requests(7, seed=0, tag="x-")
    assert len(drawn.requests) == 7 and drawn.texts["p1#2"] == "text 1"
    assert "7 requests asked of the 3 prompts of builtin" in drawn.notes[0] and "cycled, 3 rounds" in drawn.notes[0]
    assert PromptSetWorkload(prompts).stage_requests(3, 0, "x-").notes == ()


def test_dataset_workload_asks_for_each_reply_length(tmp_path: Path) -> None:
    path = tmp_path / "sharegpt.json"
    path.write_text(
        '[{"id": "a", "conversations": [{"from": "human", "value": "one two three"},'
        ' {"from": "gpt", "value": "four five six seven eight"}]},\n'
        ' {"id": "b", "conversations": [{"from": "human", "value": "alone"}]}]'
    )
    workload = DatasetWorkload(read_dataset(path), count_tokens, 6, 1024, parse_length_distribution("fixed:9"))
    drawn = workload.stage_requests(3, seed=0, tag="d-")
    assert [r.max_tokens for r in drawn.requests] == [5, 9, 5]  # reply length; no reply: the fallback
    assert [r.prompt_tokens_asked for r in drawn.requests] == [9, 7, 9]
    assert drawn.texts["d-a"] == "one two three" and "d-a#2" in drawn.texts
    assert any("cycled" in note for note in drawn.notes)


def test_trace_workload_keeps_the_trace_lengths_and_its_pace(maker: PromptMaker) -> None:
    trace = [TraceRequest(0.0, 30, 8, 1), TraceRequest(1.0, 50, 4, 2), TraceRequest(4.0, 40, 2, 3)]
    workload = TraceWorkload(maker, trace, 2048, "t.jsonl")
    drawn = workload.stage_requests(3, seed=0, tag="tr-", speed=2.0)
    assert [r.offset_s for r in drawn.requests] == [0.0, 0.5, 2.0]
    assert [(r.prompt_tokens_asked, r.max_tokens) for r in drawn.requests] == [(30, 8), (50, 4), (40, 2)]
    assert workload.mean_rate_rps == pytest.approx(0.5)
    closed = workload.stage_requests(2, seed=0, tag="tr-")
    assert all(r.offset_s is None for r in closed.requests)


def test_synthetic_sessions_carry_their_turns_think_times_and_slots(maker: PromptMaker) -> None:
    workload = SessionWorkload(
        turns=4, think_time_s=2.0, reply_tokens=parse_length_distribution("fixed:12"), maker=maker,
        turn_tokens=parse_length_distribution("uniform:10-20"), count_tokens=count_tokens, slots=3,
        context_tokens=4096,
    )  # fmt: skip
    drawn = workload.stage_requests(5, seed=2, tag="s-")
    assert len(drawn.requests) == 5 and drawn.workload == "sessions"
    assert [r.id_slot for r in drawn.requests] == [0, 1, 2, 0, 1]
    for request in drawn.requests:
        assert request.session_id is not None and request.record_count == 4
        assert request.max_tokens == 12 and all(t.max_tokens == 12 for t in request.later_turns)
        assert all(1.0 <= t.think_s <= 3.0 for t in request.later_turns)
        ids = [request.prompt_id, *(t.prompt_id for t in request.later_turns)]
        assert all(10 <= count_tokens(drawn.texts[i]) <= 20 for i in ids)
    assert not drawn.notes


def test_sessions_that_would_outgrow_the_context_are_said(maker: PromptMaker) -> None:
    workload = SessionWorkload(
        turns=4, think_time_s=0.0, reply_tokens=parse_length_distribution("fixed:200"), maker=maker,
        turn_tokens=parse_length_distribution("fixed:100"), context_tokens=1024,
    )  # fmt: skip
    drawn = workload.stage_requests(1, seed=0, tag="s-")
    assert drawn.notes and "1024-token slot context" in drawn.notes[0]


def test_dataset_sessions_take_the_real_user_turns(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text(
        '{"messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "a b c"},'
        ' {"role": "user", "content": "and then"}, {"role": "assistant", "content": "d e"}]}\n'
    )
    workload = SessionWorkload(
        turns=4, think_time_s=0.0, reply_tokens=parse_length_distribution("fixed:7"),
        dataset=read_dataset(path), count_tokens=count_tokens,
    )  # fmt: skip
    drawn = workload.stage_requests(1, seed=0, tag="s-")
    request = drawn.requests[0]
    assert drawn.texts[request.prompt_id] == "hi there"
    assert [drawn.texts[t.prompt_id] for t in request.later_turns] == ["and then"]
    assert (request.max_tokens, request.later_turns[0].max_tokens) == (3, 2)
