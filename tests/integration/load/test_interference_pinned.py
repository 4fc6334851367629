"""The server is measured, not the machine: a sweep stage run beside a CPU-bound process pinned to
the server's own core is marked interfered, and its verdict is undecided with that reason; the
same stage alone is decided.

The fake server is scripted slower than the SLO at p50 (every first token 200 ms late against a
100 ms limit), so the stage misses within a handful of requests, and only the busy core can turn
that miss into "undecided". The fake runs on one core and this test's own process (and the load
client it starts) on the others, so the share other processes took is read on the server's core.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from load_api import settings_context
from quantload.analysis.capacity import capacity
from quantload.analysis.run_data import load_run
from quantload.analysis.stage_tables import level_table, stage_table
from quantload.config import LoadSettings, Settings, SloSettings
from quantload.exclusive import pin_process, pin_this_process, usable_cpus, wait_for_quiet
from quantload.experiments.registry import run_experiment
from quantload.load.fakeserver import FakeScript, FakeServerProcess
from quantload.served import ServedTarget
from quantload.slo import Slo

pytestmark = [pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CPU affinity and /proc are Linux's"),
]

SLOW = FakeScript(ttft_ms=(200.0, 200.0), itl_ms=(5.0, 5.0), tokens=8, pathological=False)
SLO = SloSettings(
    ttft_s=0.1, tpot_s=0.05, ttft_percentile="p50", tpot_percentile="p50", max_failed_frac=0.5, level_max_s=8.0
)
THRESHOLD = 0.25  # load.interference_cpu_frac's default
QUIET_BOUND_S = 60.0
ALONE_ATTEMPTS = 3


def _settings() -> Settings:
    load = LoadSettings(
        users=(1,), repeats=1, prompt_count=6, warmup_requests=1, metrics_port=0, max_tokens=8,
        experiments=("sweep",), interference_cpu_frac=THRESHOLD,
    )  # fmt: skip
    return Settings(load=load, slo=SLO)


@pytest.fixture
def cores() -> Iterator[tuple[frozenset[int], frozenset[int]]]:
    """(the server's core, the cores of this process and the load client), restored afterwards."""
    usable = sorted(usable_cpus())
    if len(usable) < 2:
        pytest.skip("one usable core: the server and the client cannot be kept apart")
    server, client = frozenset(usable[:1]), frozenset(usable[1:])
    before = pin_this_process(client)
    assert before is not None
    try:
        yield server, client
    finally:
        pin_this_process(before)


def _stage_verdict(run_dir: Path, target: ServedTarget) -> tuple[str, str | None, float | None]:
    """The sweep level's verdict as the report judges it, why the machine was busy, and the share."""
    done = run_experiment("sweep", target, settings_context(run_dir, _settings(), run_dir.name))
    assert done.problem is None and len(done.summaries) == 1
    summary = done.summaries[0]
    run = load_run(run_dir)
    slo = Slo.of(SLO)
    stages = stage_table(run, slo)
    levels = level_table(stages, "sweep", "users", ("Q4_K_M",), run.records, slo)
    (verdict,) = capacity(levels, ("Q4_K_M",), slo)
    (check,) = verdict.checks
    return check.outcome, summary.machine_busy, summary.other_cpu_frac


def test_a_stage_beside_a_busy_loop_on_the_servers_core_is_undecided_and_alone_decided(
    tmp_path: Path, cores: tuple[frozenset[int], frozenset[int]]
) -> None:
    server_core, _ = cores
    taskset = shutil.which("taskset")
    if taskset is None:
        pytest.skip("taskset (util-linux) is not installed")
    with FakeServerProcess(SLOW) as fake:
        assert fake.pid is not None
        assert pin_process(fake.pid, server_core) is not None
        target = ServedTarget(name="fake", quant="Q4_K_M", model="m", url=fake.url)

        # A shared machine may take the core back during the stage: then it is measured again after
        # the next quiet spell, a few times at most.
        for attempt in range(ALONE_ATTEMPTS):
            quiet = wait_for_quiet(THRESHOLD, QUIET_BOUND_S, [fake.pid], server_cpus=server_core)
            if not quiet.quiet:
                pytest.skip(
                    f"other work kept {quiet.other_cpu_frac:.0%} of the server's core for {QUIET_BOUND_S:.0f} s"
                )
            alone, alone_busy, alone_share = _stage_verdict(tmp_path / f"alone-{attempt}", target)
            if alone_busy is None:
                break
            assert alone == "undecided", alone_busy  # busy is never a miss, whoever made it busy

        core = str(min(server_core))
        hog = subprocess.Popen([taskset, "-c", core, sys.executable, "-c", "while True: pass"])
        try:
            beside, busy, share = _stage_verdict(tmp_path / "beside", target)
        finally:
            hog.kill()
            hog.wait(timeout=10)

    assert alone_busy is None, f"alone, the stage was marked interfered: {alone_busy}"
    assert alone == "misses"  # decided: every first token is later than the limit
    assert alone_share is not None and alone_share <= THRESHOLD
    assert share is not None and share > THRESHOLD
    assert busy is not None and f"the server's core {core}" in busy and "not the server, was measured" in busy
    assert beside == "undecided"
