"""The tune tests' shared pieces: a target, the fake's script, a quick SLO and a run context for a
tune of a small space, variants of fake servers that note the flags asked for, the model a tune is
of and a finished tune's tune.jsonl (importable as `tune_fakes`: pytest puts tests/ on sys.path).
Used by tests/unit/tune and tests/integration/tune."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from load_api import context
from quantload.config import LoadSettings
from quantload.errors import ServerError
from quantload.experiments.base import ServedVariant, ServerFlags
from quantload.llamacpp.server import free_port
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.run_context import RunContext
from quantload.rundir import TUNE_JSONL
from quantload.served import ServedTarget
from quantload.tune.search import new_search
from quantload.tune.space import configurations, space_key
from quantload.tune.state_file import TuneLine

TARGET = ServedTarget(name="llama-q8_0", quant="Q8_0", model="m", url="http://127.0.0.1:1")
SCRIPT = FakeScript(ttft_ms=(2, 5), itl_ms=(1, 2), tokens=6, close_after_stream=True)


def tune_context(tmp_path: Path, **tune: object) -> RunContext:
    load = LoadSettings.model_validate(
        {
            "warmup_requests": 0,
            "request_timeout_s": 10,
            "first_round_jitter_s": 0.01,
            "metrics_port": 0,
            "max_tokens": 6,
            "prompt_count": 4,
        }
    )
    space = {
        "slots": [2, 4],
        "batch_sizes": ["2048/512"],
        "cache_types": ["f16"],
        "finalists": 1,
        "eta": 2,
        "short_trial_s": 30,
        "budget_s": 600,
        **tune,
    }
    return context(
        tmp_path,
        load,
        tune=space,
        slo=QUICK_SLO,
        limit={"max_users": 2, "requests_per_user": 1, "min_requests": 2},
    )


# a median objective decides a level in a few requests, so a tune of the fake takes seconds
QUICK_SLO = {
    "ttft_s": 30.0, "tpot_s": 5.0, "ttft_percentile": "p50", "tpot_percentile": "p50", "max_failed_frac": 0.5,
    "level_max_s": 5.0,
}  # fmt: skip


MODEL = "tiny Q8_0-tiny.gguf sha256:0123456789abcdef"


class RecordingVariants:
    """Variants of fake servers that note the flags asked for; `dead` slot counts get a server that
    is gone when the trial runs, `broken` ones a server that never becomes ready (ServerError)."""

    def __init__(self, dead: tuple[int, ...] = (), broken: tuple[int, ...] = ()) -> None:
        self.asked: list[ServerFlags] = []
        self.dead = dead
        self.broken = broken

    @contextlib.contextmanager
    def variant(self, flags: ServerFlags) -> Iterator[ServedVariant]:
        self.asked.append(flags)
        if flags.slots in self.broken:
            raise ServerError(f"llama-server with -np {flags.slots} did not become ready")
        if flags.slots in self.dead:  # killed as the trial starts: nothing listens on its port
            url = f"http://127.0.0.1:{free_port()}"
            yield ServedVariant(TARGET.model_copy(update={"url": url}), flags, None, "no KV line", "")
            return
        with FakeServer(SCRIPT) as fake:
            yield ServedVariant(TARGET.model_copy(update={"url": fake.url}), flags, None, "no KV line", "")

    def adopt(self, flags: ServerFlags) -> ServedVariant:
        raise AssertionError("not here")


def finished_state(tmp_path: Path, model: str = MODEL) -> tuple[Path, list[str]]:
    """A finished tune's tune.jsonl of two configurations, as its lines."""
    run = tune_context(tmp_path, baseline=False)
    configs = configurations(run.settings)
    search = new_search(run.settings, [config.key for config in configs])
    common: dict[str, Any] = {
        "run_id": "run-1",
        "quant": "Q8_0",
        "server": "llama-q8_0",
        "objective": "users",
    }
    lines = [TuneLine(kind="start", model=model, space_key=space_key(run.settings, model), **common)]
    while (trial := search.next_trial()) is not None:
        line = TuneLine(
            kind="trial", key=trial.key, rung=trial.rung.index, limit=2.0, goodput_rps=1.0, **common
        )
        search.record(line.score())
        lines.append(line)
    return tmp_path / TUNE_JSONL, [line.model_dump_json(by_alias=True) for line in lines]
