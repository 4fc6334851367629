"""Plans, tickets, the ticket book and stage bookkeeping."""

from __future__ import annotations

import itertools
import json
import statistics

import pytest

from load_api import open_loop_of, sweep_of
from quantload.config import LoadSettings
from quantload.experiments.prefix_cache.stages import SYSTEM_PROMPT_ID, prefix_cache_plan
from quantload.load.client_health import ClientHealth
from quantload.load.plan import LoadPlan, poisson_offsets
from quantload.load.prompts import WARMUP_PROMPT_ID, Prompt
from quantload.load.tickets import (
    StageTracker,
    Ticket,
    TicketBook,
    stage_tickets,
)
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget
from quantload.stats import percentile

TARGET = ServedTarget(name="srv", quant="Q8_0", model="m", url="http://127.0.0.1:1")
PROMPTS = [Prompt(f"p{i}", f"prompt {i}", 3) for i in range(5)]


def test_sweep_runs_every_prompt_at_each_user_level_repeat_major() -> None:
    settings = LoadSettings(users=(1, 2, 4), repeats=2, warmup_requests=2, cache_prompt=False)
    plan = sweep_of(settings, TARGET, PROMPTS, "run", "inv")
    assert [(s.users, s.repeat) for s in plan.stages] == [(1, 0), (2, 0), (4, 0), (1, 1), (2, 1), (4, 1)]
    assert [s.stage_id for s in plan.stages] == [f"inv-{i}" for i in range(6)]
    for stage in plan.stages:
        assert [r.prompt_id for r in stage.requests] == [p.id for p in PROMPTS]
        assert [r.prompt_id for r in stage.warmup] == [WARMUP_PROMPT_ID] * 2
        assert stage.cache_prompt is False and stage.experiment == "sweep"
    assert plan.total_requests == 30
    assert LoadPlan.model_validate_json(plan.model_dump_json()) == plan


def test_poisson_offsets_are_seeded_and_have_the_asked_rate() -> None:
    offsets = poisson_offsets(4.0, 4000, seed=1)
    assert offsets == poisson_offsets(4.0, 4000, seed=1)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.05)


def test_open_loop_has_one_stage_per_rate_with_absolute_intended_times() -> None:
    settings = LoadSettings(open_loop_requests=7, open_loop_users=16, warmup_requests=0)
    plan = open_loop_of(settings, TARGET, PROMPTS, [1.0, 2.5], "run", "inv")
    assert [(s.rate_rps, s.users, len(s.requests)) for s in plan.stages] == [(1.0, 16, 7), (2.5, 16, 7)]
    assert {s.arrival for s in plan.stages} == {"poisson"} and {s.first_round_jitter_s for s in plan.stages} == {0.0}
    tickets = stage_tickets(plan, plan.stages[1], warmup=False, start_unix_s=1000.0)
    offsets = [r.offset_s for r in plan.stages[1].requests]
    assert [t.intended_unix_s for t in tickets] == [1000.0 + (o or 0.0) for o in offsets]
    assert [t.prompt_id for t in tickets] == ["p0", "p1", "p2", "p3", "p4", "p0", "p1"]


def test_prefix_plan_alternates_cache_off_then_on_and_primes_the_on_stage() -> None:
    settings = LoadSettings(prefix_requests=4, prefix_users=2, repeats=2)
    turns = StageRequests.of_prompts(PROMPTS[:4])
    plan = prefix_cache_plan(settings, TARGET, turns, "SYSTEM", 1500, "run", "inv", "2 slots erased")
    assert [(s.cache_prompt, s.repeat) for s in plan.stages] == [(False, 0), (True, 0), (False, 1), (True, 1)]
    off, on = plan.stages[0], plan.stages[1]
    assert off.warmup == () and len(on.warmup) == 2
    assert on.server_state == "2 slots erased" and on.prefix_tokens == 1500
    tickets = stage_tickets(plan, on, warmup=False)
    assert all(t.messages[0] == {"role": "system", "content": "SYSTEM"} for t in tickets)
    assert plan.prompts[SYSTEM_PROMPT_ID] == "SYSTEM"
    assert all(t.stage.cache_prompt for t in tickets)


def test_ticket_body_is_the_streaming_request() -> None:
    settings = LoadSettings(max_tokens=17, ignore_eos=True, seed=5, cache_prompt=True)
    plan = sweep_of(settings, TARGET, PROMPTS, "run", "inv")
    ticket = stage_tickets(plan, plan.stages[0], warmup=False)[0]
    sent = json.loads(ticket.body())
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert (sent["max_tokens"], sent["seed"], sent["temperature"]) == (17, 5, 0.0)
    assert sent["ignore_eos"] is True and sent["cache_prompt"] is True
    assert sent["messages"] == [{"role": "user", "content": "prompt 0"}]
    assert Ticket.from_wire(ticket.to_wire()) == ticket


def make_tickets(n: int) -> list[Ticket]:
    plan = sweep_of(LoadSettings(), TARGET, PROMPTS * 4, "run", "inv")
    return stage_tickets(plan, plan.stages[0], warmup=False)[:n]


def test_ticket_book_serves_first_come_first_served() -> None:
    delivered: list[tuple[str, str | None]] = []
    book: TicketBook[str] = TicketBook(lambda w, t: delivered.append((w, t.prompt_id if t else None)))
    book.want("a")
    book.want("b")
    assert book.waiting == 2 and delivered == []
    tickets = make_tickets(3)
    book.add(tickets)
    assert delivered == [("a", "p0"), ("b", "p1")] and book.pending == 1
    book.want("c")
    assert delivered[-1] == ("c", "p2") and book.handed_out == 3
    book.want("d")
    assert book.withdraw("d") and not book.withdraw("d")
    book.put_back(tickets[0])
    book.want("e")
    assert delivered[-1] == ("e", "p0")
    book.want("f")
    book.close()
    book.want("g")
    assert delivered[-2:] == [("f", None), ("g", None)]


def test_ticket_book_cancel_drops_only_pending_tickets() -> None:
    book: TicketBook[str] = TicketBook(lambda w, t: None)
    book.add(make_tickets(5))
    book.want("a")
    assert book.cancel_pending() == 4 and book.pending == 0 and book.handed_out == 1


def test_stage_tracker_counts_its_own_phase_and_trips_after_consecutive_errors() -> None:
    tracker = StageTracker("s1", planned=10, warmup=False, max_consecutive_errors=3)
    assert not tracker.observe("s0", False, True, None)
    assert not tracker.observe("s1", True, True, None)
    tracker.observe("s1", False, False, "http_5xx")
    tracker.observe("s1", False, True, None)
    tracker.observe("s1", False, False, "timeout")
    tracker.observe("s1", False, False, "timeout")
    assert not tracker.tripped
    tracker.observe("s1", False, False, "timeout")
    assert tracker.tripped and tracker.done == 5 and tracker.ok == 1 and tracker.last_error == "timeout"


def test_percentile_and_client_health() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    health = ClientHealth()
    assert health.saturated(0.9, 0.02) is None
    health.add("w1", 0.2, 1.0, [0.001] * 100)
    health.add("w2", 0.95, 1.0, [0.001] * 100)
    assert health.cpu_frac() == pytest.approx(0.95)
    assert health.saturated(0.9, 0.02) is True
    calm = ClientHealth()
    calm.add("w1", 0.3, 1.0, [0.001] * 99 + [0.2])
    assert calm.saturated(0.9, 0.02) is False and calm.lag_max_s() == 0.2
