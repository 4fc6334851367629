"""The judge's three verdicts: a level meets the SLO only when its requests show it at the stated
confidence, misses when they show the opposite, and is undecided otherwise, saying how many more
requests would likely decide it; bursts of slow requests count for what their bursts are worth."""

from __future__ import annotations

import pytest

from quantload.config import Settings
from quantload.errors import ConfigError
from quantload.slo import Slo, SloCounts, judge

SLO = Slo(ttft_s=1.0, tpot_s=0.1)


def clean(
    requests: int, ttft_over: int = 0, burst: int = 1, failed: int = 0, block: int = 8
) -> SloCounts:
    """`requests` with `ttft_over` over the TTFT limit in runs of `burst` (each run in one block of
    `block` requests), spread evenly, and `failed` failures alone."""
    ok = requests - failed
    blocks = requests // block
    runs = ttft_over // burst if burst else 0
    return SloCounts(
        requests=requests, failed=failed, ttft_over=ttft_over, tpot_judged=ok, tpot_over=0,
        good=ok - ttft_over, blocks=blocks, block_requests=block, failed_blocked=failed, failed_sq=failed,
        ttft_over_blocked=ttft_over, ttft_over_sq=runs * burst * burst,
    )  # fmt: skip


def test_a_few_clean_requests_do_not_meet_a_p99_and_say_what_would_decide() -> None:
    verdict = judge(clean(100), SLO, in_flight=1)
    assert verdict.outcome == "undecided"
    assert verdict.more_requests is not None and 250 <= verdict.more_requests <= 500
    assert "more requests would likely decide it" in verdict.sureness


def test_enough_clean_requests_meet_with_a_bound_on_the_share_over() -> None:
    verdict = judge(clean(600), SLO, in_flight=1)
    assert verdict.outcome == "meets"
    assert "rests on 600 requests" in verdict.sureness and "at most" in verdict.sureness


def test_a_clearly_broken_level_misses_after_a_few_requests() -> None:
    verdict = judge(clean(6, ttft_over=5), SLO, in_flight=1)
    assert verdict.outcome == "misses" and "5 of 6 requests over the TTFT limit" in verdict.why


def test_a_share_at_its_allowance_stays_undecided() -> None:
    verdict = judge(clean(2000, ttft_over=20), SLO, in_flight=1)
    assert verdict.outcome == "undecided" and verdict.more_requests is None
    assert "sits at its allowance" in verdict.sureness


def test_overs_in_bursts_carry_less_evidence_than_the_same_count_alone() -> None:
    alone = judge(clean(300, ttft_over=12), SLO, in_flight=1)
    burst = judge(clean(300, ttft_over=12, burst=6, block=16), SLO, in_flight=1)  # two bursts of six
    assert alone.outcome == "misses" and burst.outcome == "undecided"
    assert "bursts of about" in burst.sureness


def test_more_users_in_flight_need_more_requests_to_meet() -> None:
    assert judge(clean(600), SLO, in_flight=1).outcome == "meets"
    assert judge(clean(600), SLO, in_flight=8).outcome == "undecided"
    assert judge(clean(600), Slo(1.0, 0.1, burst_requests=1), in_flight=8).outcome == "meets"


def test_a_busy_machine_turns_a_miss_into_undecided_never_a_meet_into_a_miss() -> None:
    broken = judge(clean(20, ttft_over=15), SLO, in_flight=1, machine_busy="other processes took 60 % of the CPU")
    assert broken.outcome == "undecided" and "other processes took" in broken.why
    assert judge(clean(600), SLO, in_flight=1, machine_busy="busy").outcome == "meets"


def test_failures_count_against_their_own_allowance() -> None:
    verdict = judge(clean(40, failed=10), SLO, in_flight=1)
    assert verdict.outcome == "misses" and "10 of 40 requests failed" in verdict.why
    assert judge(clean(30, failed=30), SLO).hard_failure


@pytest.mark.parametrize(
    ("percentile", "fewest"), [("p50", 6), ("p90", 37), ("p95", 75), ("p99", 380), ("p99.9", 3810)]
)
def test_the_fewest_requests_a_level_needs_follow_from_its_percentile(percentile: str, fewest: int) -> None:
    slo = Slo(1.0, 0.1, ttft_percentile=percentile, tpot_percentile=percentile, max_failed_frac=0.5)  # type: ignore[arg-type]
    assert slo.fewest_requests() == fewest


def test_the_slo_says_how_few_requests_meet_and_which_allowance_asks_for_them() -> None:
    # p90 latency limits with the default 1 % failed allowance: the failures need the requests
    assert "no fewer than 380 requests, for the 1 % failed allowance)" in Slo(3.0, 0.2, "p90", "p90").text()
    loose = Slo(3.0, 0.2, "p90", "p90", max_failed_frac=0.1)
    assert loose.text().endswith("no fewer than 37 requests, for the TTFT p90, the TPOT p90 and the 10 % failed allowance)")
    assert Slo(3.0, 0.2, "p99", "p90", max_failed_frac=0.1).fewest_text().endswith("380 requests, for the TTFT p99")


def test_a_p50_objective_is_met_by_a_handful_of_requests() -> None:
    slo = Slo(1.0, 0.1, ttft_percentile="p50", tpot_percentile="p50", max_failed_frac=0.5)
    assert judge(clean(12), slo, in_flight=1).outcome == "meets"


def test_a_budget_below_what_the_percentile_needs_is_refused_naming_the_minimum() -> None:
    with pytest.raises(ValueError, match="below the 380 requests"):
        Settings(slo={"level_max_requests": 200})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="3810"):
        Settings(slo={"ttft_percentile": "p99.9", "level_max_requests": 3000})  # type: ignore[arg-type]
    for confidence in (0.5, 0.999, 1.2):
        with pytest.raises(ValueError, match="confidence"):
            Settings(slo={"confidence": confidence})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttft_percentile"):
        Settings(slo={"ttft_percentile": "p97"})  # type: ignore[arg-type]


def test_the_old_report_keys_read_as_the_slo(tmp_path: object) -> None:
    settings = Settings.model_validate({"report": {"slo_ttft_p99_s": 0.25, "slo_tpot_s": 0.04}})
    assert (settings.slo.ttft_s, settings.slo.tpot_s, settings.slo.ttft_percentile) == (0.25, 0.04, "p99")
    with pytest.raises(ConfigError, match=r"limit\.repeats"):
        from quantload.config import load_config

        (tmp_path / "quantload.toml").write_text("[limit]\nrepeats = 3\n")  # type: ignore[operator]
        load_config(tmp_path, {})  # type: ignore[arg-type]


def test_a_client_not_trusted_within_its_error_cannot_meet_a_limit_closer_than_it() -> None:
    near = SloCounts(**{**clean(600).to_dict(), "ttft_near": 30})  # 30 TTFTs within 5 ms under the limit
    assert judge(near, SLO, in_flight=1).outcome == "meets"
    doubted = judge(near, SLO, in_flight=1, client_untrusted="its event loop woke 40 ms late")
    assert doubted.outcome == "undecided" and "within the client's stated error" in doubted.why
    assert judge(clean(600), SLO, in_flight=1, client_untrusted="late loop").outcome == "meets"  # none near
