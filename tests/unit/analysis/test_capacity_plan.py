"""The capacity plan's arithmetic on hand-made run figures: servers, memory, cost, request limits,
and the scale-out signal."""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest

from quantload.analysis.capacity import CapacityVerdict, LevelCheck
from quantload.analysis.capacity_plan import (
    GIB,
    MeasuredLimit,
    RequestSample,
    ServerMemory,
    build_plan,
    costs,
    length_limit,
    limits_from_capacity,
    missing_inputs,
    plan_view,
    servers_for,
)
from quantload.analysis.scale_out import scale_out_signals

MIB = 2**20


def _searched(quant: str, users: int | None, goodput: float | None, **searched: float | None) -> CapacityVerdict:
    return CapacityVerdict(quant, users, (1, 2, 4, 8), 30.0, goodput, "", (), **searched)  # type: ignore[arg-type]


def test_the_plan_takes_the_limit_search_over_the_sweep_where_the_run_searched() -> None:
    swept, by_users, by_trials, by_both = limits_from_capacity([
        _searched("F16", 4, 1.2),
        _searched("Q8_0", 4, 1.3, searched_users=6.0),
        _searched("Q8_0", None, None, searched_users=2.0, searched_goodput_rps=0.9, searched_output_tok_s=40.0),
        _searched("Q4_K_M", 4, 1.4, searched_users=7.0, searched_rate_rps=2.5),
    ])  # fmt: skip
    assert (swept.users, swept.rps, swept.source) == (4, 1.2, "the concurrency sweep")
    assert (by_users.users, by_users.rps) == (6, 1.3)  # the sweep's goodput: a lower bound at 6 users
    assert by_users.source == "the limit search for users; requests/s from the sweep"
    # the sweep held no level, the search 2 users: its trials at 2 users give requests/s
    assert (by_trials.users, by_trials.rps, by_trials.output_tok_s) == (2, 0.9, 40.0)
    assert (by_both.users, by_both.rps, by_both.source) == (7, 2.5, "the limit search, users and rate")


def test_servers_keep_the_headroom() -> None:
    count = servers_for(20.0, 0.48, 0.3, "requests/s")
    assert count is not None
    assert count.servers == 60  # 20 / (0.48 x 0.7) = 59.5
    assert count.utilisation == pytest.approx(20 / (60 * 0.48))
    assert count.utilisation <= 0.7
    users = servers_for(16.0, 6.0, 0.3, "users")
    assert users is not None and users.servers == 4 and users.utilisation == pytest.approx(16 / 24)
    exact = servers_for(7.0, 10.0, 0.3, "requests/s")
    assert exact is not None and exact.servers == 1 and exact.utilisation == pytest.approx(0.7)
    assert servers_for(20.0, None, 0.3, "requests/s") is None
    assert servers_for(20.0, 0.0, 0.3, "requests/s") is None


def test_memory_against_a_budget() -> None:
    kv = 720 * MIB  # SmolLM2 at 8 x 4096, f16
    memory = ServerMemory(
        weights_bytes=100 * MIB, kv_bytes=kv, buffers_bytes=12 * MIB, slots=8, ctx_per_slot=4096,
        kv_bytes_per_cell=kv / 32768, budget_bytes=512 * MIB,
    )
    assert memory.total_bytes == 832 * MIB and memory.fits is False
    per_cell = kv / 32768  # 23,040 bytes
    assert memory.max_cells == math.floor((512 - 100 - 12) * MIB / per_cell)
    assert memory.max_slots_at_ctx == 4  # 18,204 cells // 4,096
    assert memory.max_ctx_at_slots == 2048  # 18,204 // 8 = 2,275, down to a multiple of 256
    unlimited = ServerMemory(100 * MIB, kv, 12 * MIB, 8, 4096, per_cell, None)
    assert unlimited.fits is None and unlimited.max_cells is None


def test_a_model_over_one_hosts_budget_is_planned_over_several_hosts() -> None:
    kv = 720 * MIB
    # 100 MiB weights + 720 MiB KV over hosts of 512 MiB, each holding its own 12 MiB of buffers
    split = ServerMemory(100 * MIB, kv, 12 * MIB, 8, 4096, kv / 32768, 512 * MIB)
    assert split.fits is False and split.hosts_per_model == 2  # ceil(820 / 500)
    assert ServerMemory(100 * MIB, kv, 12 * MIB, 8, 4096, kv / 32768, 1024 * MIB).hosts_per_model == 1
    assert ServerMemory(100 * MIB, kv, 12 * MIB, 8, 4096, kv / 32768, 280 * MIB).hosts_per_model == 4
    assert ServerMemory(100 * MIB, kv, 12 * MIB, 8, 4096, kv / 32768, 10 * MIB).hosts_per_model is None
    assert ServerMemory(100 * MIB, kv, 12 * MIB, 8, 4096, kv / 32768, None).hosts_per_model is None


def test_costs_at_the_limit_and_at_the_plan() -> None:
    limit = MeasuredLimit("Q4_K_M", users=1, rps=0.48, output_tok_s=30.0, source="sweep")
    plan = servers_for(20.0, limit.rps, 0.3, "requests/s")
    priced = costs(1.0, limit, plan)
    assert priced.per_request_at_limit == pytest.approx(1 / (0.48 * 3600))
    assert priced.per_million_output_at_limit == pytest.approx(1 / (30 * 3600) * 1e6)
    assert priced.per_hour_planned == 60.0
    assert priced.per_request_planned == pytest.approx(60 / (20 * 3600))
    tokens_per_request = 30 / 0.48
    assert priced.per_million_output_planned == pytest.approx(60 / (20 * 3600) / tokens_per_request * 1e6)
    by_users = costs(2.0, limit, servers_for(3.0, 1.0, 0.3, "users"))
    assert by_users.per_hour_planned == 10.0  # 5 servers
    assert by_users.per_request_planned == pytest.approx(10 / (5 * (3 / 5) * 0.48 * 3600))


def test_the_longest_prompt_within_the_ttft_slo() -> None:
    rng = random.Random(3)
    prompts = [rng.randint(50, 1500) for _ in range(200)]
    ttft = [0.1 + 0.0004 * p + rng.uniform(0, 0.05) for p in prompts]
    limit = length_limit(prompts, ttft, slo_s=1.0, cap_tokens=4095)
    assert limit.tokens is not None and 2000 <= limit.tokens <= 2150  # (1 - 0.1 - ~0.05) / 0.0004
    assert "extrapolated" in limit.why and limit.measured_up_to <= 1500
    assert limit.slope_s_per_1k_tokens == pytest.approx(0.4, abs=0.02)
    inside = length_limit(prompts, ttft, slo_s=0.5, cap_tokens=4095)
    assert inside.tokens is not None and inside.tokens < 1000 and inside.why == "fitted"
    assert length_limit(prompts[:5], ttft[:5], 1.0, 4095).tokens is None
    assert length_limit([100] * 20, [0.2] * 20, 1.0, 4095).why == "every request had the same length"
    flat = length_limit(prompts, [0.2] * 200, 1.0, 4095)
    assert flat.tokens == 4095 and "did not grow" in flat.why
    assert length_limit(prompts, [2.0 + p for p in ttft], 1.0, 4095).tokens is None


def test_a_plan_without_inputs_says_which_keys_add_them() -> None:
    inputs = plan_view(None, None, 0.3, None, "", None)
    lines = missing_inputs(inputs)
    assert len(lines) == 3
    assert any("plan.target_rps" in line for line in lines)
    assert any("plan.price_per_hour" in line for line in lines)
    assert any("plan.memory_budget_gib" in line for line in lines)
    assert missing_inputs(plan_view(5, None, 0.3, 1.0, "USD", 8)) == ()
    assert plan_view(None, None, 0.3, None, "", 1.5).memory_budget_bytes == round(1.5 * GIB)


def test_the_plan_picks_the_quantization_needing_fewest_servers() -> None:
    limits = [
        MeasuredLimit("F16", 1, 0.5, 25.0, "sweep"),
        MeasuredLimit("Q8_0", 2, 0.9, 40.0, "sweep"),
        MeasuredLimit("Q4_K_M", None, None, None, "sweep"),
    ]
    big = ServerMemory(300 * MIB, 720 * MIB, 10 * MIB, 8, 4096, 720 * MIB / 32768, 600 * MIB)
    small = ServerMemory(150 * MIB, 360 * MIB, 10 * MIB, 8, 4096, 360 * MIB / 32768, 600 * MIB)
    plan = build_plan(limits, {"F16": big, "Q8_0": small}, {}, plan_view(20, None, 0.3, 1.0, "", 600 / 1024), 1.0, 0.1)
    by_quant = {q.quant: q for q in plan.quants}
    assert by_quant["F16"].servers == 58 and by_quant["Q8_0"].servers == 32
    assert by_quant["Q4_K_M"].servers is None
    assert by_quant["F16"].memory is not None and by_quant["F16"].memory.fits is False
    best = plan.cheapest()
    assert best is not None and best.quant == "Q8_0"
    data = plan.to_dict()
    assert data["fewest_servers"] == "Q8_0" and data["quants"][1]["memory"]["fits"] is True


def _verdict(quant: str, meets: dict[int, bool]) -> CapacityVerdict:
    checks = tuple(
        LevelCheck(quant, users, None, None, 0.0, "meets" if ok else "misses", "") for users, ok in meets.items()
    )
    return CapacityVerdict(quant, None, tuple(meets), None, None, "", checks)


def test_the_scale_out_signal_that_showed_the_limit_coming() -> None:
    stages, series = [], []
    levels = {1: (1, 0), 2: (2, 0), 4: (4, 0), 8: (4, 3)}  # users: (busy slots, deferred), 4 slots
    for index, (users, (busy, deferred)) in enumerate(levels.items()):
        start = 1000.0 + index * 100
        stages.append({"quant": "Q8_0", "experiment": "sweep", "users": users, "started_unix_s": start,
                       "ended_unix_s": start + 60})
        for t in range(int(start), int(start) + 61, 5):
            series += [
                {"metric": "slots_busy", "quant": "Q8_0", "unix_s": float(t), "value": float(busy)},
                {"metric": "slots", "quant": "Q8_0", "unix_s": float(t), "value": 4.0},
                {"metric": "requests_deferred", "quant": "Q8_0", "unix_s": float(t), "value": float(deferred)},
            ]
    verdict = _verdict("Q8_0", {1: True, 2: True, 4: True, 8: False})
    (signal,) = scale_out_signals(pd.DataFrame(series), pd.DataFrame(stages), [verdict])
    assert signal.broke_at_users == 8
    assert signal.busy_from_users == 4 and signal.timing(signal.busy_from_users) == "leads"
    assert signal.deferred_from_users == 8 and signal.timing(signal.deferred_from_users) == "coincides"
    assert signal.lead_signal() == "LlamaServerSlotsSaturated"
    assert "before the break" in signal.sentence()
    compute_bound = _verdict("Q8_0", {1: True, 2: False, 4: False, 8: False})
    (time_limited,) = scale_out_signals(pd.DataFrame(series), pd.DataFrame(stages), [compute_bound])
    assert time_limited.lead_signal() is None and "LlamaServerTTFTOverSLO" in time_limited.sentence()
    assert scale_out_signals(pd.DataFrame(columns=["metric"]), pd.DataFrame(stages), [verdict]) == ()


def test_request_samples_feed_the_request_limits() -> None:
    sample = RequestSample((100.0,) * 4 + (900.0,) * 4, (0.2,) * 4 + (0.6,) * 4, (116.0,) * 8, (0.05,) * 8)
    memory = ServerMemory(MIB, MIB, MIB, 4, 2048, 32.0, None)
    plan = build_plan([MeasuredLimit("Q8_0", 2, 1.0, 10.0, "sweep")], {"Q8_0": memory}, {"Q8_0": sample},
                      plan_view(None, 4, 0.3, None, "", None), 1.0, 0.1)
    (item,) = plan.quants
    assert item.prompt_limit is not None and item.prompt_limit.tokens == 1700  # 0.2 + 0.0005 x (p - 100)
    assert item.context_limit is not None and item.context_limit.why == "every request had the same length"
    assert item.by_users is not None and item.by_users.servers == 3


def test_the_plan_says_how_many_hosts_a_model_over_budget_is_split_over() -> None:
    from quantload.analysis.chapters.plan import _fits, _quant_sentence

    limits = [MeasuredLimit("F16", users=4, rps=2.0, output_tok_s=100.0, source="sweep")]
    big = ServerMemory(100 * MIB, 720 * MIB, 12 * MIB, 8, 4096, 720 * MIB / 32768, 512 * MIB)
    plan = build_plan(limits, {"F16": big}, {}, plan_view(None, None, 0.3, None, "", 0.5), 1.0, 0.1)
    (item,) = plan.quants
    said = _quant_sentence(plan, item)
    assert "over the budget" in said and "or split the model over 2 hosts (server.rpc" in said
    assert _fits(item.memory) == "no (2 hosts per model)" and item.to_dict()["memory"]["hosts_per_model"] == 2
