"""A worker ends once the master it joined has answered nothing for the silent limit, not before."""

from __future__ import annotations

from dataclasses import dataclass

from quantload.load.in_locust.master_watch import MasterWatch


@dataclass
class _Clock:
    now_s: float = 1000.0

    def __call__(self) -> float:
        return self.now_s


class _Runner:
    """What the watch reads of a Locust worker runner: the master's last answer, and quit."""

    def __init__(self) -> None:
        self.last_heartbeat_timestamp: float | None = None
        self.quits = 0

    def quit(self) -> None:
        self.quits += 1


def test_a_master_that_keeps_answering_is_never_left() -> None:
    clock, runner = _Clock(), _Runner()
    watch = MasterWatch(runner, silent_limit_s=15.0, clock=clock)
    for _ in range(100):
        clock.now_s += 1.0
        runner.last_heartbeat_timestamp = clock.now_s - 0.5
        assert not watch.check()
    assert runner.quits == 0 and not watch.lost


def test_a_master_that_stops_answering_is_left_once_after_the_limit() -> None:
    clock, runner = _Clock(), _Runner()
    watch = MasterWatch(runner, silent_limit_s=15.0, clock=clock)
    runner.last_heartbeat_timestamp = clock.now_s + 2.0
    clock.now_s += 17.0
    assert not watch.check()  # 15.0 s since the last answer: at the limit, not over it
    clock.now_s += 0.5
    assert watch.check() and watch.check()
    assert runner.quits == 1 and watch.lost


def test_a_master_that_never_answered_counts_from_the_start_of_the_watch() -> None:
    clock, runner = _Clock(), _Runner()
    watch = MasterWatch(runner, silent_limit_s=15.0, clock=clock)
    runner.last_heartbeat_timestamp = clock.now_s - 3600.0  # an answer older than the watch
    clock.now_s += 14.0
    assert not watch.check()
    runner.last_heartbeat_timestamp = None
    clock.now_s += 2.0
    assert watch.check() and runner.quits == 1
