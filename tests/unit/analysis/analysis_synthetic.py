"""Synthetic run directories for the analysis unit tests: seeded random closed-loop stages written
with the load package's own record and stage-event models, so the report reads real file formats.
Expected values in the tests are recomputed from these files independently (numpy on the raw
values), never typed in."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

from quantload.load.records import RequestRecord, StageEvent
from quantload.quality.dataset import DatasetInfo
from quantload.quality.kld_results import KldBase, KldResult, KldSet
from quantload.quality.results import QualityFile

T0 = 1_800_000_000.0


def _record(quant: str, stage_id: str, users: int, repeat: int, sent: float, rng: random.Random,
            experiment: str = "sweep", cache: bool = False, fail: bool = False,
            rate: float | None = None, ttft_added_s: float = 0.0) -> RequestRecord:  # fmt: skip
    ttft = rng.uniform(0.05, 0.4) + ttft_added_s
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
           rate: float | None = None, kv_cache_type: str | None = None) -> StageEvent:  # fmt: skip
    return StageEvent(
        stage_rate_rps=rate, kv_cache_type=kv_cache_type,
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
    kv_types: Sequence[str] = (),
    ttft_added_s: Mapping[tuple[str, int], float] | None = None,
) -> Path:
    """A run directory with run.json, config.json, records.jsonl and stages.jsonl (no model files);
    with `kv_types`, a kv_types stage at 4 users per quantization and cache type; `ttft_added_s`
    slows the sweep's first tokens of (quantization, users) by that much."""
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
        stages += [("kv_types", 4, 0, False, None) for _ in kv_types]
        kinds = iter(kv_types)
        for index, (experiment, users, repeat, cache, rate) in enumerate(stages):
            stage_id = f"{quant}-{experiment}-{index}"
            kind = next(kinds) if experiment == "kv_types" else None
            events.append(_event("stage_start", quant, stage_id, index, users, repeat, clock, experiment, cache,
                                 rate=rate, kv_cache_type=kind).to_json_line())  # fmt: skip
            user_clock = [clock + 0.001 * u for u in range(users)]
            latest = clock
            for number in range(requests):
                user = number % users
                fail = number < failures and experiment == "sweep"
                added = (ttft_added_s or {}).get((quant, users), 0.0) if experiment == "sweep" else 0.0
                record = _record(
                    quant, stage_id, users, repeat, user_clock[user], rng, experiment, cache, fail,
                    ttft_added_s=added,
                )  # fmt: skip
                user_clock[user] += record.e2e_s or 0.01
                latest = max(latest, user_clock[user])
                lines.append(record.to_json_line())
            events.append(_event("stage_end", quant, stage_id, index, users, repeat, latest, experiment, cache,
                                 rate=rate, kv_cache_type=kind).to_json_line())  # fmt: skip
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
        "kv_types": {"users": 4, "requests": requests if kv_types else 0},
    }
    (folder / "config.json").write_text(json.dumps({"settings": settings, "sources": {}}))
    return folder


# ----------------------------------------------------------------------------- quality.json and kv.json

SHAPE = {"n_layer": 30, "n_head_kv": [3] * 30, "head_dim_k": 64, "head_dim_v": 64, "slots": 8,
         "ctx_per_slot": 4096, "unified": False}  # fmt: skip
SOURCE_NOTE = "F16 reconstructed from the Q4_1 release"


def kld_base() -> KldBase:
    return KldBase(
        quant="F16", model_path="models/F16.gguf", model_name="SmolLM2", model_size_bytes=100,
        model_sha256="a" * 64, source_note=SOURCE_NOTE,
        dataset=DatasetInfo(name="WikiText-2", path="wiki.test.raw", size_bytes=10, sha256="ab"),
        ctx_tokens=512, chunks_requested=4, chunks_scored=4, tokens_scored=1020, n_vocab=49152,
        predicted_size_bytes=1, file_size_bytes=1, file_path="cache/kld/b.logits", kept=False, reused=False,
        perplexity=23.9, perplexity_error=2.4, wall_time_s=10.0, other_cpu_frac=0.1, command=[],
        llama_cpp={}, measured_at="2026-01-01",
    )  # fmt: skip


def kld_result(quant: str, kld: float, error: float | None, cache: str = "f16", floor: bool = False,
               same_top: float = 90.0, chunk_error: float | None = None) -> KldResult:  # fmt: skip
    return KldResult(
        quant=quant, model_path=f"models/{quant}.gguf", model_size_bytes=100, cache_type_k=cache,
        cache_type_v=cache, flash_attn="auto" if cache == "f16" else "on", is_floor=floor, chunks_scored=4,
        tokens_scored=1020, kld_mean_nats=kld, kld_mean_error_nats=error, kld_mean_chunk_error_nats=chunk_error,
        kld_median_nats=kld, kld_p99_nats=kld, kld_p99_9_nats=kld, kld_max_nats=kld, kld_quantiles_nats={},
        same_top_p_pct=same_top, same_top_p_error_pct=1.0, delta_p_rms_pct=1.0, delta_p_rms_error_pct=None,
        delta_p_mean_pct=0.0, delta_p_mean_error_pct=None, delta_p_quantiles_pct={}, ppl_change_pct=1.5,
        ppl_change_error_pct=0.4, ln_ppl_ratio=0.01, ln_ppl_ratio_error=0.004, ppl_ratio=1.01,
        ppl_ratio_error=0.004, ppl_q=24.0, ppl_q_error=2.4, ppl_base=23.8, ppl_base_error=2.4, ppl_diff=0.2,
        ppl_diff_error=0.1, ln_ppl_correlation_pct=None, running_kld_mean_nats=[kld], wall_time_s=8.0,
        other_cpu_frac=None, command=[], llama_cpp={}, measured_at="2026-01-01",
    )  # fmt: skip


def kld_set(losses: dict[str, dict[str, tuple[float, float | None]]]) -> KldSet:
    """{quant: {cache type: (mean, error)}}; F16 with f16 is the floor."""
    results = {
        quant: {
            cache: kld_result(quant, mean, error, cache, floor=quant == "F16" and cache == "f16")
            for cache, (mean, error) in per.items()
        }
        for quant, per in losses.items()
    }
    return KldSet(base=kld_base(), results=results)


def write_quality(folder: Path, losses: dict[str, dict[str, tuple[float, float | None]]]) -> None:
    """quality.json with KLDs only (no perplexity results)."""
    quality = QualityFile(kld=kld_set(losses))
    (folder / "quality.json").write_text(json.dumps(quality.to_json()))


def kv_entry(cache_type: str, reported_mib: float | None) -> dict[str, object]:
    return {**SHAPE, "cache_type_k": cache_type, "cache_type_v": cache_type, "reported_mib": reported_mib,
            "flash_attn": "enabled"}  # fmt: skip


def write_kv(folder: Path, quants: Sequence[str], served: str = "f16",
             others: dict[str, float | None] | None = None) -> None:  # fmt: skip
    """kv.json: each quantization's own server with `served`, and one entry per other cache type
    (cache type: reported MiB)."""
    data = {
        "schema": "quantload.kv/1", "llama_cpp": None,
        "results": {quant: kv_entry(served, 720.0) for quant in quants},
        "cache_types": {quant: {kind: kv_entry(kind, mib) for kind, mib in (others or {}).items()} for quant in quants},
    }  # fmt: skip
    (folder / "kv.json").write_text(json.dumps(data))


def mark_busy(folder: Path, stage_ids: Sequence[str], other_cpu_frac: float) -> None:
    """summaries.jsonl as the load writes it, the stages `stage_ids` marked as measured beside other
    work that took `other_cpu_frac` of the CPUs (quantload.machine_share's words)."""
    from quantload.config import SloSettings
    from quantload.load.records import iter_records, iter_stage_events
    from quantload.load.summary import summarize_stage
    from quantload.machine_share import Interference
    from quantload.slo import Slo

    records = list(iter_records(folder / "records.jsonl"))
    events = list(iter_stage_events(folder / "stages.jsonl"))
    starts = {e.stage_id: e for e in events if e.event == "stage_start"}
    lines = []
    for end in (e for e in events if e.event == "stage_end"):
        summary = summarize_stage(end, records, Slo.of(SloSettings()), starts.get(end.stage_id))
        busy = end.stage_id in stage_ids
        summary = summary.model_copy(update={
            "other_cpu_frac": other_cpu_frac if busy else 0.02,
            "machine_busy": Interference(other_cpu_frac, 10.0).reason(0.25) if busy else None,
        })  # fmt: skip
        lines.append(summary.to_json_line())
    (folder / "summaries.jsonl").write_text("\n".join(lines) + "\n")
