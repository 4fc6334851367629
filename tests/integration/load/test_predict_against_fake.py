"""The scheduler model against a server of known timing: the fake server's scripted first-token
time, gap and slot count, given to the simulation as its batch costs, must predict what a real
limit search (Locust processes, trial after trial) measures on that fake, level by level and in its
limit, and the search the model runs on its levels' verdicts (quantload.predict.search) must show
the limit the real search decides.

The fake's streams do not slow each other, while llama-server's batches do (a prompt in the batch
holds up the other slots' next token). The costs here charge a batch holding a prompt the fake's
first-token time and any other batch its gap, so the model is exact at one slot and off by at most
one first-token time per prompt that joins a running stream at several; the tolerances say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from load_api import settings_context
from quantload.config import LimitSettings, LoadSettings, Settings, SloSettings
from quantload.experiments.base import ExperimentRun
from quantload.experiments.registry import run_experiment
from quantload.load.fakeserver import FakeScript, FakeServerProcess
from quantload.predict.limit import LimitPrediction, SimulatedLoad, predict_limit
from quantload.predict.search import LevelBudget, SearchRules
from quantload.predict.simulator import FixedShape, RequestShape, ServerModel
from quantload.served import ServedTarget
from quantload.slo import Slo

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class KnownTiming:
    """The fake's script as batch costs: a batch with a prompt takes the first-token time, a batch
    of generated tokens only takes the gap."""

    def __init__(self, script: FakeScript) -> None:
        self.ttft_s = script.ttft_ms[0] / 1000
        self.itl_s = script.itl_ms[0] / 1000

    def batch_s(self, prompt_tokens: int, decode_tokens: int, kv_tokens: int) -> float:
        return self.ttft_s if prompt_tokens > 0 else self.itl_s


def fixed_fake(ttft_ms: float, itl_ms: float, tokens: int, streams: int) -> FakeScript:
    """A fake of fixed timing: every stream the same first-token time and gap, `streams` at once."""
    return FakeScript(
        ttft_ms=(ttft_ms, ttft_ms), itl_ms=(itl_ms, itl_ms), tokens=tokens, max_streams=streams,
        close_after_stream=True, pathological=False,
    )  # fmt: skip


def p90_slo(ttft_s: float) -> SloSettings:
    """TTFT `ttft_s` and TPOT 50 ms at p90, at most 10 % failed, 30 s a level."""
    return SloSettings(
        ttft_s=ttft_s, tpot_s=0.05, ttft_percentile="p90", tpot_percentile="p90", max_failed_frac=0.1,
        level_max_s=30.0,
    )  # fmt: skip


def measured_and_predicted(
    tmp_path: Path, script: FakeScript, slo: SloSettings
) -> tuple[ExperimentRun, LimitPrediction]:
    settings = Settings(
        load=LoadSettings(
            metrics_port=0, warmup_requests=1, request_timeout_s=20, first_round_jitter_s=0.005,
            interference_cpu_frac=1.0, max_tokens=script.tokens,
        ),
        limit=LimitSettings.model_validate(
            {"max_users": 8, "requests_per_user": 3, "min_requests": 6, "time_cap_s": 240}
        ),
        slo=slo,
    )  # fmt: skip
    with FakeServerProcess(script) as fake:
        target = ServedTarget(name="fake", quant="Q4_K_M", model="m", url=fake.url)
        done = run_experiment("limit_users", target, settings_context(tmp_path, settings, "search"))
    assert done.limit is not None and done.problem is None
    server = ServerModel(n_slots=script.max_streams, ctx_per_slot_tokens=script.n_ctx)
    limit = settings.limit
    budget = LevelBudget(slo.level_max_s, slo.level_max_requests, limit.requests_per_user, limit.min_requests or 1)
    plan = SimulatedLoad(
        "closed", FixedShape(RequestShape(64, script.tokens)), requests=400, warmup_requests=8, budget=budget
    )
    rules = SearchRules(limit.start_users, limit.max_users, limit.growth, limit.time_cap_s)
    prediction = predict_limit(
        server, KnownTiming(script), Slo.of(slo), plan, range(1, 9), misses_past=2, search=rules
    )
    assert prediction.search is not None
    searched = [(trial.level, trial.outcome) for trial in prediction.search.trials]
    print(f"the search predicted {searched}; measured {[(t.level, t.outcome) for t in done.limit.trials]}")
    assert prediction.search.limit == done.limit.limit
    return done, prediction


def test_one_slot_queueing_is_predicted_level_by_level_and_in_the_limit(tmp_path: Path) -> None:
    # One stream at a time, 40 ms to the first token and 9 gaps of 10 ms: a request takes 130 ms,
    # so with U users a request waits (U - 1) x 130 ms for its turn: TTFT 40, 170, 300 ms at 1, 2, 3
    # users. Against 235 ms at p90 the limit is 2 users, with 65 ms either side of the limit.
    done, prediction = measured_and_predicted(tmp_path, fixed_fake(40.0, 10.0, 10, 1), p90_slo(0.235))
    predicted = {level.level: level for level in prediction.levels}
    assert [round(predicted[n].ttft_p50_s, 3) for n in (1, 2, 3)] == [0.04, 0.17, 0.3]  # worked by hand
    assert prediction.limit == 2 and done.limit.limit == 2
    for trial in done.summaries:
        expected = predicted[trial.users].ttft_p50_s
        print(f"{trial.users} users: TTFT p50 measured {trial.ttft_p50_s:.3f} s, predicted {expected:.3f} s")
        # the client's own time per request (a few ms) adds to every turn a request waits
        assert abs(trial.ttft_p50_s - expected) <= 0.1 * expected + 0.02 * trial.users


def test_three_slots_predict_the_limit_the_search_measures(tmp_path: Path) -> None:
    # The limit search's own fake (tests/integration/load/test_limit_search_fake.py): 3 streams at a
    # time, 20 ms to the first token and 19 gaps of 8 ms. A fourth user waits about a whole stream.
    done, prediction = measured_and_predicted(tmp_path, fixed_fake(20.0, 8.0, 20, 3), p90_slo(0.15))
    assert prediction.limit == 3 and done.limit.limit == 3
    predicted = {level.level: level for level in prediction.levels}
    for trial in done.summaries:
        expected = predicted[trial.users]
        print(
            f"{trial.users} users: TTFT p50 measured {trial.ttft_p50_s:.3f} s, predicted"
            f" {expected.ttft_p50_s:.3f} s; e2e p50 {trial.e2e_p50_s:.3f} s against"
            f" {expected.ttft_p50_s + 19 * expected.tpot_p50_s:.3f} s"
        )
        # up to 3 users no request queues: TTFT is the first-token time, plus at most one gap of a
        # batch it joins; from 4, the waits are a whole stream in both
        assert abs(trial.ttft_p50_s - expected.ttft_p50_s) <= 0.01 + 0.15 * expected.ttft_p50_s
