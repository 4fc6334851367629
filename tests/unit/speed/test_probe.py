"""The machine probe: real (small) measurements, and the cache that keeps it to once per machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from speed_helpers import limits

from quantload.roofline.probe import (
    MachineLimits,
    buffer_size_bytes,
    cache_path,
    measure_arithmetic,
    measure_bandwidth,
    probe_machine,
    this_machine,
)


def test_small_real_measurements_give_positive_rates() -> None:
    bandwidth = measure_bandwidth(4 * 1024 * 1024, threads=2, passes=3)
    arithmetic = measure_arithmetic(size=64, passes=3)
    assert len(bandwidth) == 3 and all(rate > 1e6 for rate in bandwidth)
    assert len(arithmetic) == 3 and all(rate > 1e6 for rate in arithmetic)


def test_buffer_is_larger_than_caches() -> None:
    assert 256 * 1024 * 1024 <= buffer_size_bytes() <= 2048 * 1024 * 1024


class CountingProbe:
    def __init__(self, others: float | None = 0.0) -> None:
        self.calls = 0
        self.others = others

    def __call__(self) -> MachineLimits:
        self.calls += 1
        return limits(bandwidth_bytes_per_s=float(self.calls), others=self.others)


def test_probe_runs_once_then_comes_from_the_cache(tmp_path: Path) -> None:
    probe = CountingProbe()
    first = probe_machine(tmp_path, probe=probe)
    second = probe_machine(tmp_path, probe=probe)
    assert probe.calls == 1
    assert first.source == "probe" and second.source == "cache"
    assert second.bandwidth_bytes_per_s == first.bandwidth_bytes_per_s
    assert cache_path(tmp_path, this_machine()).is_file()


def test_refresh_stale_or_foreign_cache_probes_again(tmp_path: Path) -> None:
    probe = CountingProbe()
    probe_machine(tmp_path, probe=probe)
    probe_machine(tmp_path, refresh=True, probe=probe)
    assert probe.calls == 2
    probe_machine(tmp_path, max_age_s=-1, probe=probe)  # every cached probe is too old
    assert probe.calls == 3
    path = cache_path(tmp_path, this_machine())
    data = json.loads(path.read_text())
    data["machine"]["hostname"] = "elsewhere"
    path.write_text(json.dumps(data))
    probe_machine(tmp_path, max_age_s=1e12, probe=probe)
    assert probe.calls == 4
    path.write_text("{ broken")
    probe_machine(tmp_path, max_age_s=1e12, probe=probe)
    assert probe.calls == 5


def test_no_cache_dir_means_no_cache(tmp_path: Path) -> None:
    probe = CountingProbe()
    probe_machine(None, probe=probe)
    probe_machine(None, probe=probe)
    assert probe.calls == 2


@pytest.mark.parametrize("others", [None, 0.6])
def test_a_probe_taken_on_a_busy_or_unknown_machine_is_not_reused(tmp_path: Path, others: float | None) -> None:
    probe = CountingProbe(others=others)
    first = probe_machine(tmp_path, probe=probe)
    assert first.taken_when_busy
    probe_machine(tmp_path, probe=probe)
    assert probe.calls == 2
