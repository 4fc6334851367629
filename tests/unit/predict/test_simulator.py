"""The scheduler model on hand-worked cases: every number here is worked out by hand and must hold
exactly (costs are dyadic fractions, so float sums are exact)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from quantload.predict.simulator import (
    ClientTiming,
    ClosedLoop,
    FixedShape,
    OpenLoop,
    RequestShape,
    SampledShapes,
    ServerModel,
    ThinkTime,
    simulate,
    trace,
)


class StepCost:
    """Every batch takes `step_s`; every call is kept as (prompt, decode, kv)."""

    def __init__(self, step_s: float = 1.0) -> None:
        self.step_s = step_s
        self.calls: list[tuple[int, int, int]] = []

    def batch_s(self, prompt_tokens: int, decode_tokens: int, kv_tokens: int) -> float:
        self.calls.append((prompt_tokens, decode_tokens, kv_tokens))
        return self.step_s


class LinearCost:
    """fixed + per prompt token + per decode token + per KV token."""

    def __init__(self, fixed_s: float, prompt_s: float, decode_s: float = 0.0, kv_s: float = 0.0) -> None:
        self.fixed_s, self.prompt_s, self.decode_s, self.kv_s = fixed_s, prompt_s, decode_s, kv_s

    def batch_s(self, prompt_tokens: int, decode_tokens: int, kv_tokens: int) -> float:
        return (
            self.fixed_s
            + self.prompt_s * prompt_tokens
            + self.decode_s * decode_tokens
            + self.kv_s * kv_tokens
        )


def one_slot(n_batch: int = 2048, ctx: int = 4096, continuous: bool = True) -> ServerModel:
    return ServerModel(
        n_slots=1, ctx_per_slot_tokens=ctx, n_batch_tokens=n_batch, continuous_batching=continuous
    )


def test_a_lone_request_waits_for_nothing_and_its_ttft_is_its_prefill() -> None:
    cost = LinearCost(fixed_s=0.25, prompt_s=2**-7, decode_s=2**-3)
    result = simulate(one_slot(), cost, trace([(2.0, RequestShape(128, 5))]))
    (record,) = result.records
    assert record.queue_s == 0.0
    assert record.start_s == 2.0
    assert record.prefill_s == 0.25 + 1.0  # one batch of 128 prompt tokens
    assert record.ttft_s == record.prefill_s == 1.25
    assert record.tpot_s == 0.375  # 0.25 + one decode token
    assert record.e2e_s == 1.25 + 4 * 0.375
    assert record.output_tokens == 5
    assert result.iterations == 5


def test_the_second_of_two_requests_at_one_slot_queues_for_the_whole_first() -> None:
    cost = LinearCost(fixed_s=0.5, prompt_s=2**-8, decode_s=0.0, kv_s=2**-10)
    shape = RequestShape(256, 8)
    first, second = simulate(one_slot(), cost, trace([(0.0, shape), (0.0, shape)])).records
    assert first.queue_s == 0.0
    assert second.queue_s == first.e2e_s
    # 1.5 s of prefill, then 7 decode steps of 0.5 + kv/1024 with kv = 256 .. 262
    assert first.e2e_s == 1.5 + sum(0.5 + kv / 1024 for kv in range(256, 263))
    assert second.e2e_s == 2 * first.e2e_s


def test_constant_batch_cost_gives_tpot_equal_to_the_step() -> None:
    shapes = SampledShapes(tuple(RequestShape(p, o) for p, o in [(10, 2), (300, 17), (1000, 64), (50, 9)]))
    server = ServerModel(n_slots=3, ctx_per_slot_tokens=4096, n_batch_tokens=256)
    result = simulate(server, StepCost(0.125), ClosedLoop(5, shapes, max_requests=200), seed=3)
    assert len(result.records) == 200
    for record in result.records:
        assert record.tpot_s == 0.125
        assert record.e2e_s == record.queue_s + record.prefill_s + (record.output_tokens - 1) * 0.125


def test_a_prompt_longer_than_n_batch_is_split_over_iterations() -> None:
    cost = StepCost(1.0)
    (record,) = simulate(one_slot(n_batch=256), cost, trace([(0.0, RequestShape(1000, 3))])).records
    assert cost.calls[:4] == [(256, 0, 0), (256, 0, 256), (256, 0, 512), (232, 0, 768)]
    assert record.first_token_s == 4.0
    assert record.prefill_s == 4.0
    assert cost.calls[4:] == [(0, 1, 1000), (0, 1, 1001)]
    assert record.end_s == 6.0


def test_a_decode_step_and_a_prompt_share_one_batch() -> None:
    cost = StepCost(1.0)
    server = ServerModel(n_slots=2, ctx_per_slot_tokens=4096, n_batch_tokens=256)
    a, b = simulate(server, cost, trace([(0.0, RequestShape(10, 10)), (0.5, RequestShape(300, 2))])).records
    # 1: A's prompt; 2: A's decode token first, then 255 of B's prompt; 3: the same, B's last 45
    assert cost.calls[:3] == [(10, 0, 0), (255, 1, 10), (45, 1, 11 + 255)]
    assert b.start_s == 1.0  # arrived mid-iteration, taken at the next one
    assert b.queue_s == 0.5
    assert b.first_token_s == 3.0
    assert b.ttft_s == 2.5
    assert cost.calls[3] == (0, 2, 12 + 300)  # both decode together
    assert b.end_s == 4.0
    assert a.end_s == 10.0
    assert a.tpot_s == 1.0


def test_an_arrival_during_a_stretch_of_decode_is_taken_at_the_next_iteration() -> None:
    cost = StepCost(1.0)
    server = ServerModel(n_slots=2, ctx_per_slot_tokens=4096, n_batch_tokens=2048)
    a, b = simulate(server, cost, trace([(0.0, RequestShape(4, 100)), (2.5, RequestShape(4, 3))])).records
    assert b.start_s == 3.0
    assert cost.calls[3] == (4, 1, 6)
    assert b.first_token_s == 4.0
    assert b.end_s == 6.0
    assert a.end_s == 100.0
    assert len(cost.calls) == 100


def test_without_continuous_batching_prompts_wait_until_no_slot_generates() -> None:
    cost = StepCost(1.0)
    server = ServerModel(n_slots=2, ctx_per_slot_tokens=4096, n_batch_tokens=256, continuous_batching=False)
    a, b = simulate(server, cost, trace([(0.0, RequestShape(10, 10)), (0.5, RequestShape(300, 2))])).records
    assert a.end_s == 10.0  # 1 prompt iteration + 9 decode iterations, alone
    assert cost.calls[1:10] == [(0, 1, kv) for kv in range(10, 19)]
    assert cost.calls[10:12] == [(256, 0, 0), (44, 0, 256)]
    assert b.start_s == 10.0
    assert b.queue_s == 9.5
    assert b.first_token_s == 12.0


def test_without_continuous_batching_prompts_still_share_the_batch_that_starts_them() -> None:
    cost = StepCost(1.0)
    server = ServerModel(n_slots=2, ctx_per_slot_tokens=4096, n_batch_tokens=256, continuous_batching=False)
    a, b = simulate(server, cost, trace([(0.0, RequestShape(200, 4)), (0.0, RequestShape(200, 2))])).records
    # A's whole prompt and 56 of B's share iteration 1; A then generates, so B's rest waits for A
    assert cost.calls == [(256, 0, 0), (0, 1, 200), (0, 1, 201), (0, 1, 202), (144, 0, 56), (0, 1, 200)]
    assert a.end_s == 4.0
    assert b.start_s == 0.0
    assert b.first_token_s == 5.0
    assert b.end_s == 6.0
    with_cb = StepCost(1.0)
    cb = ServerModel(n_slots=2, ctx_per_slot_tokens=4096, n_batch_tokens=256)
    simulate(cb, with_cb, trace([(0.0, RequestShape(200, 4)), (0.0, RequestShape(200, 2))]))
    assert with_cb.calls[1] == (144, 1, 200 + 56)


def test_a_cached_prefix_skips_prefill_but_one_token_is_always_evaluated() -> None:
    cost = StepCost(1.0)
    simulate(one_slot(), cost, trace([(0.0, RequestShape(300, 2, cached_prefix_tokens=200))]))
    assert cost.calls == [(100, 0, 200), (0, 1, 300)]
    whole = StepCost(1.0)
    (record,) = simulate(
        one_slot(), whole, trace([(0.0, RequestShape(300, 1, cached_prefix_tokens=300))])
    ).records
    assert whole.calls == [(1, 0, 299)]
    assert record.cached_prefix_tokens == 299
    assert record.tpot_s is None


def test_the_slot_context_truncates_generation_and_refuses_a_prompt_that_fills_it() -> None:
    cost = StepCost(1.0)
    too_long, cut = simulate(
        one_slot(ctx=100), cost, trace([(0.0, RequestShape(100, 5)), (0.0, RequestShape(90, 50))])
    ).records
    assert too_long.failed and too_long.output_tokens == 0 and too_long.e2e_s == 0.0
    assert not cut.failed and cut.truncated
    assert cut.output_tokens == 10
    assert cut.queue_s == 0.0
    assert cut.end_s == 10.0


def test_closed_loop_users_keep_one_request_each_in_flight_littles_law() -> None:
    rng = np.random.default_rng(7)
    shapes = SampledShapes(
        tuple(
            RequestShape(int(p), int(o))
            for p, o in zip(rng.integers(20, 900, 50), rng.integers(2, 200, 50), strict=True)
        )
    )
    server = ServerModel(n_slots=4, ctx_per_slot_tokens=2048, n_batch_tokens=256)
    cost = LinearCost(fixed_s=0.01, prompt_s=1e-4, decode_s=1e-3, kv_s=1e-7)
    # six users at four slots queue; exponential think times average their mean over 3000 requests
    cases: list[tuple[int, float, ThinkTime]] = [
        (6, 0.0, "constant"),
        (3, 0.25, "constant"),
        (5, 0.5, "exponential"),
    ]
    for users, think_s, think in cases:
        workload = ClosedLoop(users, shapes, max_requests=3000, think_s=think_s, think=think)
        result = simulate(server, cost, workload, seed=1)
        throughput = result.throughput_rps
        mean_e2e = float(np.mean([record.e2e_s for record in result.records]))
        in_flight_or_thinking = throughput * (mean_e2e + think_s)
        assert abs(in_flight_or_thinking - users) / users < 0.01, (users, in_flight_or_thinking)


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    shapes = SampledShapes((RequestShape(100, 10), RequestShape(500, 40), RequestShape(30, 90)))
    server = ServerModel(n_slots=4, ctx_per_slot_tokens=2048, n_batch_tokens=512)
    cost = LinearCost(0.02, 1e-4, 1e-3)
    one = simulate(server, cost, OpenLoop(5.0, shapes, max_requests=300), seed=11)
    two = simulate(server, cost, OpenLoop(5.0, shapes, max_requests=300), seed=11)
    other = simulate(server, cost, OpenLoop(5.0, shapes, max_requests=300), seed=12)
    assert one.records == two.records
    assert one.records != other.records


def test_open_loop_arrivals_are_poisson_at_the_rate_and_stop_at_the_bounds() -> None:
    shape = FixedShape(RequestShape(10, 2))
    server = ServerModel(n_slots=8, ctx_per_slot_tokens=512)
    result = simulate(server, StepCost(2**-10), OpenLoop(20.0, shape, max_requests=20_000), seed=5)
    arrivals = np.array([record.arrival_s for record in result.records])
    assert len(arrivals) == 20_000
    assert abs(np.mean(np.diff(arrivals)) * 20.0 - 1.0) < 0.03
    bounded = simulate(
        server, StepCost(2**-10), OpenLoop(20.0, shape, max_requests=20_000, max_duration_s=10.0), seed=5
    )
    assert 150 < len(bounded.records) < 250
    assert max(record.arrival_s for record in bounded.records) <= 10.0
    assert all(
        record.end_s >= record.first_token_s >= record.start_s >= record.arrival_s
        for record in bounded.records
    )


def test_closed_loop_stops_sending_at_its_bounds() -> None:
    shape = FixedShape(RequestShape(8, 4))
    server = ServerModel(n_slots=2, ctx_per_slot_tokens=512)
    assert len(simulate(server, StepCost(1.0), ClosedLoop(3, shape, max_requests=10)).records) == 10
    timed = simulate(server, StepCost(1.0), ClosedLoop(2, shape, max_requests=1000, max_duration_s=20.0))
    # two users in lockstep, 4 iterations a request, the next sent at 0, 4, ..., 20
    assert len(timed.records) == 12
    assert timed.end_s == 24.0


@pytest.mark.parametrize("requests", [10_000])
def test_ten_thousand_requests_at_eight_slots_simulate_in_well_under_two_seconds(requests: int) -> None:
    rng = np.random.default_rng(1)
    shapes = SampledShapes(
        tuple(
            RequestShape(int(p), int(o))
            for p, o in zip(rng.integers(50, 1000, 200), rng.integers(16, 256, 200), strict=True)
        )
    )
    server = ServerModel(n_slots=8, ctx_per_slot_tokens=4096, n_batch_tokens=512)
    cost = LinearCost(0.01, 1e-4, 5e-4, 1e-7)
    started = time.process_time()
    result = simulate(server, cost, ClosedLoop(8, shapes, max_requests=requests), seed=0)
    assert time.process_time() - started < 2.0
    assert len(result.records) == requests


class PromptOrDecode:
    """A batch holding a prompt takes `prompt_s` whatever else it holds; a decode-only batch `decode_s`."""

    def __init__(self, prompt_s: float, decode_s: float) -> None:
        self.prompt_s, self.decode_s = prompt_s, decode_s

    def batch_s(self, prompt_tokens: int, decode_tokens: int, kv_tokens: int) -> float:
        return self.prompt_s if prompt_tokens else self.decode_s


def test_users_in_lockstep_share_every_prompt_batch_and_a_client_turnaround_parts_them() -> None:
    # Two users, two slots, 11 tokens a reply: a prompt batch takes 0.5 s, a decode batch 0.05 s.
    server = ServerModel(n_slots=2, ctx_per_slot_tokens=4096)
    cost = PromptOrDecode(prompt_s=0.5, decode_s=0.05)
    shapes = FixedShape(RequestShape(100, 11))
    lockstep = simulate(server, cost, ClosedLoop(2, shapes, max_requests=200)).records
    # in lockstep both prompts always share one batch: TTFT 0.5 s, then 10 decode batches
    assert {round(r.ttft_s, 9) for r in lockstep} == {0.5} and {round(r.e2e_s, 9) for r in lockstep} == {1.0}
    same = ClosedLoop(2, shapes, max_requests=200, client=ClientTiming(0.0, 0.0))
    assert simulate(server, cost, same).records == lockstep  # no spread and no turnaround: lockstep
    client = ClientTiming(first_spread_s=0.1, turnaround_s=0.003)
    parted = simulate(server, cost, ClosedLoop(2, shapes, max_requests=200, client=client)).records
    first_two = sorted(r.arrival_s for r in parted[:2])
    assert 0 < first_two[0] < first_two[1] <= 0.1
    # apart, a prompt lands among the other slot's decode tokens: that reply's TPOT holds a 0.5 s
    # batch in place of a 0.05 s one, (9 x 0.05 + 0.5) / 10 = 0.095 s
    tpots = [r.tpot_s for r in parted[10:]]
    assert max(tpots) == pytest.approx(0.095) and min(tpots) == pytest.approx(0.05)
    assert sum(t == pytest.approx(0.095) for t in tpots) >= len(tpots) / 3  # in lockstep: none
    for earlier, later in zip(
        parted, parted[2:], strict=False
    ):  # each user's next request waits its turnaround
        if earlier.user == later.user:
            assert 0 <= later.arrival_s - earlier.end_s <= 0.006
