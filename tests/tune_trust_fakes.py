"""The tune trust tests' shared pieces: the model a tune is of, variants of fake servers that note
the flags asked for, and a finished tune's tune.jsonl (importable as `tune_trust_fakes`: pytest puts
tests/ on sys.path). Used by tests/unit/tune/test_tune_trust.py and
tests/integration/tune/test_tune_trust_processes.py; the target, script and run context they build
on are in tune_fakes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantload.experiments.base import ServedVariant, ServerFlags
from quantload.llamacpp.server import free_port
from quantload.load.fakeserver import FakeServer
from quantload.rundir import TUNE_JSONL
from quantload.tune.search import new_search
from quantload.tune.space import configurations, space_key
from quantload.tune.state_file import TuneLine
from tune_fakes import SCRIPT, TARGET, tune_context

MODEL = "tiny Q8_0-tiny.gguf sha256:0123456789abcdef"


class RecordingVariants:
    """Variants of fake servers; `dead` slot counts get a server that is gone when the trial runs."""

    def __init__(self, dead: tuple[int, ...] = ()) -> None:
        self.asked: list[ServerFlags] = []
        self.dead = dead

    @contextlib.contextmanager
    def variant(self, flags: ServerFlags) -> Iterator[ServedVariant]:
        self.asked.append(flags)
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
