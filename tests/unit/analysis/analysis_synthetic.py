"""Synthetic run directories for the analysis unit tests: seeded random closed-loop stages written
with the load package's own record and stage-event models, so the report reads real file formats.
Expected values in the tests are recomputed from these files independently (numpy on the raw
values), never typed in."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from quantload.load.records import RequestRecord, StageEvent

T0 = 1_800_000_000.0


def _record(quant: str, stage_id: str, users: int, repeat: int, sent: float, rng: random.Random,
            experiment: str = "sweep", cache: bool = False, fail: bool = False,
            rate: float | None = None) -> RequestRecord:  # fmt: skip
    ttft = rng.uniform(0.05, 0.4)
    lag = rng.uniform(0.0, 0.004)
    tokens = 16
    tpot = rng.uniform(0.01, 0.05)
    e2e = ttft + tpot * (tokens - 1)
    prompt_ms = ttft * 1000 * rng.uniform(0.5, 0.9)
    return RequestRecord(
        run_id="synthetic", server=f"llama-{quant.lower()}", quant=quant, model="m", url="http://x",
        experiment=experiment, stage_id=stage_id, stage_users=users, repeat=repeat, cache_prompt=cache,
        prompt_id=f"p{rng.randrange(100)}", worker="h:1", intended_unix_s=sent - lag, sent_unix_s=sent,
        lag_s=lag, ttft_s=None if fail else ttft, e2e_s=None if fail else e2e, stage_rate_rps=rate,
        ttft_from_intended_s=None if fail else ttft + lag,
        tpot_s=None if fail else tpot, prompt_tokens=100, completion_tokens=None if fail else tokens,
        timings=None if fail else {"prompt_ms": prompt_ms, "predicted_ms": 1.0, "cache_n": 90 if cache else 0},
        ok=not fail, within_deadline=not fail, error_class="http_5xx" if fail else None,
    )  # fmt: skip


def _event(kind: str, quant: str, stage_id: str, index: int, users: int, repeat: int, at: float,
           experiment: str = "sweep", cache: bool = False, status: str = "ok",
           rate: float | None = None) -> StageEvent:  # fmt: skip
    return StageEvent(
        stage_rate_rps=rate,
        event=kind, unix_s=at, run_id="synthetic", server=f"llama-{quant.lower()}", quant=quant,
        experiment=experiment, stage_id=stage_id, stage_index=index, stage_users=users, repeat=repeat,
        cache_prompt=cache, requests_planned=6, status=status, prefix_tokens=300 if experiment != "sweep" else None,
    )  # fmt: skip


def write_synthetic_run(
    folder: Path,
    quants: Sequence[str] = ("Q8_0", "Q4_K_M"),
    users_levels: Sequence[int] = (1, 2),
    repeats: int = 2,
    requests: int = 6,
    seed: int = 0,
    failures: int = 0,
    open_loop_rates: Sequence[float] = (),
) -> Path:
    """A run directory with run.json, config.json, records.jsonl and stages.jsonl (no model files)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    events: list[str] = []
    clock = T0
    for quant in quants:
        stages: list[tuple[str, int, int, bool, float | None]] = [
            ("sweep", u, r, False, None) for r in range(repeats) for u in users_levels
        ]
        stages += [("prefix_cache", 1, r, cache, None) for r in range(repeats) for cache in (False, True)]
        stages += [("open_loop", 4, r, False, rate) for r in range(repeats) for rate in open_loop_rates]
        for index, (experiment, users, repeat, cache, rate) in enumerate(stages):
            stage_id = f"{quant}-{experiment}-{index}"
            events.append(_event("stage_start", quant, stage_id, index, users, repeat, clock, experiment, cache,
                                 rate=rate).to_json_line())  # fmt: skip
            user_clock = [clock + 0.001 * u for u in range(users)]
            latest = clock
            for number in range(requests):
                user = number % users
                fail = number < failures and experiment == "sweep"
                record = _record(
                    quant, stage_id, users, repeat, user_clock[user], rng, experiment, cache, fail
                )
                user_clock[user] += record.e2e_s or 0.01
                latest = max(latest, user_clock[user])
                lines.append(record.to_json_line())
            events.append(_event("stage_end", quant, stage_id, index, users, repeat, latest, experiment, cache,
                                 rate=rate).to_json_line())  # fmt: skip
            clock = latest + 1.0
    (folder / "records.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "stages.jsonl").write_text("\n".join(events) + "\n")
    run = {
        "schema": "quantload.run/1", "run_id": folder.name, "started_unix_s": T0 - 10,
        "finished_unix_s": clock, "status": "finished", "profile": "ci", "model": "synthetic",
        "servers_at_once": False, "steps": [], "servers": {},
        "prometheus": {"available": False, "url": None, "why": "prometheus not installed", "data_dir": None},
        "notes": [],
    }  # fmt: skip
    (folder / "run.json").write_text(json.dumps(run))
    settings = {
        "load": {"users": list(users_levels), "prefix_requests": requests},
        "model": {"quants": list(quants)},
    }
    (folder / "config.json").write_text(json.dumps({"settings": settings, "sources": {}}))
    return folder
