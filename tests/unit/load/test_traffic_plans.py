"""The traffic experiments' plans and tickets: conversations turn by turn, the mixed stages, trials,
the crowding warning, and the ticket book counting records instead of tickets."""

from __future__ import annotations

import orjson
import pytest

from load_api import sweep_of
from quantload.config import (
    LimitSettings,
    LoadSettings,
    MixedSettings,
    SessionSettings,
    Settings,
    TraceSettings,
)
from quantload.experiments.limit_trials import trial_plan
from quantload.experiments.mixed.stages import interleave, long_request_count, mixed_plan
from quantload.experiments.open_loop.stages import open_loop_plan
from quantload.experiments.sessions.stages import sessions_plan
from quantload.experiments.sweep import sweep_plan
from quantload.experiments.trace.stages import trace_plan
from quantload.load.plan import LoadPlan, PlannedRequest, PlannedTurn
from quantload.load.prompts import Prompt
from quantload.load.tickets import StageContext, Ticket, TicketBook, stage_tickets
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget

TARGET = ServedTarget(name="srv", quant="Q4_K_M", model="m", url="http://127.0.0.1:1")
SETTINGS = LoadSettings(warmup_requests=1, repeats=2, users=(1, 4), seed=3)


def with_sessions(users: int) -> Settings:
    return Settings(load=SETTINGS, sessions=SessionSettings(users=users))


def conversation(index: int, turns: int = 3) -> tuple[PlannedRequest, dict[str, str]]:
    ids = [f"c{index}t{k}" for k in range(turns)]
    later = tuple(PlannedTurn(prompt_id=i, max_tokens=5 + k, think_s=0.5) for k, i in enumerate(ids[1:]))
    request = PlannedRequest(prompt_id=ids[0], max_tokens=4, session_id=f"c{index}", id_slot=index, later_turns=later)
    return request, {i: f"user text {i}" for i in ids}


def sessions_drawn(count: int) -> StageRequests:
    requests, texts = [], {}
    for index in range(count):
        request, more = conversation(index)
        requests.append(request)
        texts.update(more)
    return StageRequests(tuple(requests), texts, "sessions", True, 6)


def single_drawn(count: int, tag: str = "r") -> StageRequests:
    requests = tuple(PlannedRequest(prompt_id=f"{tag}{i}", max_tokens=10 + i, prompt_tokens_asked=40) for i in range(count))
    return StageRequests(requests, {r.prompt_id: f"text {r.prompt_id}" for r in requests}, "lengths", True, 6, ("a note",))


def test_sessions_plan_has_a_stage_per_cache_mode_and_counts_every_turn() -> None:
    plan = sessions_plan(with_sessions(2), TARGET, [(False, sessions_drawn(2)), (True, sessions_drawn(2))], "run", "inv")
    assert [(s.cache_prompt, s.phase, s.experiment) for s in plan.stages] == [
        (False, "cache off", "sessions"),
        (True, "cache on", "sessions"),
    ]
    assert plan.stages[0].measured_records == 6 and plan.total_requests == 12
    assert plan.stages[0].ignore_eos is True and plan.stages[0].template_overhead_tokens == 6
    assert LoadPlan.model_validate_json(plan.model_dump_json()) == plan
    event = plan.stage_event(plan.stages[0], "stage_start", 1.0)
    assert (event.requests_planned, event.workload, event.phase) == (6, "sessions", "cache off")


def test_a_conversation_ticket_sends_its_turns_with_the_servers_replies() -> None:
    plan = sessions_plan(with_sessions(1), TARGET, [(True, sessions_drawn(1))], "run", "inv")
    (ticket,) = stage_tickets(plan, plan.stages[0], warmup=False)
    assert (ticket.session_id, ticket.turn, ticket.record_count, ticket.asked_max_tokens) == ("c0", 0, 3, 4)
    body = orjson.loads(ticket.body())
    assert body["max_tokens"] == 4 and body["id_slot"] == 0 and body["ignore_eos"] is True
    second = ticket.next_turn("the first reply")
    assert second.messages == [
        {"role": "user", "content": "user text c0t0"},
        {"role": "assistant", "content": "the first reply"},
        {"role": "user", "content": "user text c0t1"},
    ]
    assert (second.turn, second.prompt_id, second.asked_max_tokens, second.record_count) == (1, "c0t1", 5, 2)
    third = second.next_turn("again")
    assert len(third.messages) == 5 and third.later_turns == () and third.turn == 2
    assert Ticket.from_wire(orjson.loads(orjson.dumps(ticket.to_wire()))) == ticket


def test_the_ticket_book_counts_the_records_its_tickets_yield() -> None:
    plan = sessions_plan(with_sessions(1), TARGET, [(True, sessions_drawn(2))], "run", "inv")
    tickets = stage_tickets(plan, plan.stages[0], warmup=False)
    delivered: list[Ticket | None] = []
    book: TicketBook[int] = TicketBook(lambda _, ticket: delivered.append(ticket))
    book.add(tickets)
    book.want(1)
    assert (book.handed_out, book.handed_records) == (1, 3)
    first = delivered[0]
    assert first is not None
    book.put_back(first)
    assert (book.handed_out, book.handed_records) == (0, 0)


def test_a_stage_with_more_users_than_requests_says_so_before_it_starts() -> None:
    prompts = [Prompt(f"p{i}", "x", 1) for i in range(3)]
    plan = sweep_of(LoadSettings(users=(2, 8), repeats=1), TARGET, prompts, "run", "inv")
    assert plan.stages[0].warning is None
    warning = plan.stages[1].warning
    assert warning is not None and "8 users but only 3 requests" in warning
    assert plan.warnings() == [f"stage inv-1: {warning}"]
    drawn = sweep_plan(LoadSettings(users=(5,), repeats=1), TARGET, sessions_drawn(2), "run", "inv2")
    assert "5 users but only 2 conversations" in (drawn.stages[0].warning or "")
    assert drawn.notes == ()


def test_workload_plans_carry_the_per_request_lengths_and_notes() -> None:
    plan = sweep_plan(SETTINGS, TARGET, single_drawn(4), "run", "inv")
    assert [s.users for s in plan.stages] == [1, 4, 1, 4] and plan.notes == ("a note",)
    tickets = stage_tickets(plan, plan.stages[0], warmup=False)
    assert [t.asked_max_tokens for t in tickets] == [10, 11, 12, 13]
    assert all(t.prompt_tokens_asked == 40 and t.stage.workload == "lengths" and t.stage.ignore_eos for t in tickets)
    open_loop = open_loop_plan(SETTINGS, TARGET, single_drawn(5), "run", "inv", [2.0])
    offsets = [r.offset_s for r in open_loop.stages[0].requests]
    assert offsets[0] == 0.0 and offsets == sorted(offsets) and open_loop.stages[0].rate_rps == 2.0
    assert open_loop.stages[0].arrival == "poisson" and plan.stages[0].arrival == "closed"


def test_trace_plan_replays_the_offsets_as_one_open_loop_stage() -> None:
    drawn = single_drawn(3)
    timed = StageRequests(
        tuple(r.model_copy(update={"offset_s": o}) for r, o in zip(drawn.requests, (0.0, 1.0, 4.0), strict=True)),
        drawn.texts, "trace", True,
    )  # fmt: skip
    plan = trace_plan(Settings(load=SETTINGS, trace=TraceSettings(speed=2.0)), TARGET, timed, "run", "inv")
    (stage,) = plan.stages
    assert stage.experiment == "trace" and stage.rate_rps == pytest.approx(0.5) and stage.phase == "speed x2"
    assert stage.arrival == "trace"  # open loop: judged from the intended send time
    tickets = stage_tickets(plan, stage, warmup=False, start_unix_s=100.0)
    assert [t.intended_unix_s for t in tickets] == [100.0, 101.0, 104.0]
    assert stage.timeout_s >= 4.0 + SETTINGS.request_timeout_s


def test_long_prompts_are_spread_among_the_decode_requests() -> None:
    decode = [PlannedRequest(prompt_id=f"d{i}") for i in range(6)]
    long = [PlannedRequest(prompt_id=f"l{i}") for i in range(2)]
    order = [r.prompt_id for r in interleave(decode, long)]
    assert sorted(order) == sorted(r.prompt_id for r in decode + long)
    assert order[0].startswith("d") and order.index("l0") < order.index("l1")
    assert abs(order.index("l1") - order.index("l0")) >= 3
    assert long_request_count(MixedSettings(decode_requests=12, long_fraction=0.25)) == 4


def test_mixed_plan_runs_decode_alone_then_with_long_prompts() -> None:
    mixed = MixedSettings(users=3, decode_requests=4, long_fraction=0.34, repeats=1)
    settings = Settings(load=SETTINGS, mixed=mixed)
    plan = mixed_plan(settings, TARGET, single_drawn(4, "d"), single_drawn(2, "l"), "-b 256 -ub 256", "run", "inv")
    alone, together = plan.stages
    assert (alone.phase, together.phase) == ("alone", "mixed")
    assert {r.request_class for r in alone.requests} == {"decode"} and len(alone.requests) == 4
    assert [r.request_class for r in together.requests].count("long_prompt") == 2
    assert all(s.server_args == "-b 256 -ub 256" and s.users == 3 and not s.cache_prompt for s in plan.stages)
    tickets = stage_tickets(plan, together, warmup=False)
    assert {t.request_class for t in tickets} == {"decode", "long_prompt"}


def test_trials_are_one_stage_at_their_level() -> None:
    settings = Settings(load=SETTINGS, limit=LimitSettings(trial_timeout_s=60.0))
    users = trial_plan(settings, TARGET, single_drawn(8), "limit_users", 4.0, "run", "inv", 2)
    (stage,) = users.stages
    assert (stage.experiment, stage.users, stage.rate_rps, stage.timeout_s, stage.phase) == (
        "limit_users", 4, None, 60.0 + settings.slo.level_max_s, "trial 2"
    )  # its own bound for the planned requests, and the level's budget for deciding
    assert stage.decision is not None and stage.decision.level == "inv" and stage.decision.min_requests == 4
    rate = trial_plan(settings, TARGET, single_drawn(8), "limit_rate", 3.0, "run", "inv", 0)
    offsets = [r.offset_s for r in rate.stages[0].requests]
    assert rate.stages[0].rate_rps == 3.0 and offsets[0] == 0.0 and offsets == sorted(offsets)
    assert rate.stages[0].warning is None  # open loop: the user pool is not a crowding problem
    assert (stage.arrival, rate.stages[0].arrival) == ("closed", "poisson")


def test_stage_context_keeps_the_stages_own_ignore_eos() -> None:
    plan = sweep_plan(LoadSettings(ignore_eos=False, users=(1,), repeats=1), TARGET, single_drawn(1), "r", "i")
    assert StageContext.of(plan, plan.stages[0]).ignore_eos is True
    prompts = [Prompt("p", "x", 1)]
    plain = sweep_of(LoadSettings(ignore_eos=False, users=(1,), repeats=1), TARGET, prompts, "r", "i")
    assert StageContext.of(plain, plain.stages[0]).ignore_eos is False
