"""Tables from the run's own files: the report's header, the quantization table (file size, quality,
speed and the sweep's load figures per quantization), the KV check and the roofline.

The quantization table has one row per quantization: file size, perplexity and its +/- (one
standard error), the quality loss against F16 (mean KLD in nats with its standard error, the
larger of the per-token and per-chunk one, and the share of tokens whose top token matches F16's;
f16 KV cache, so the weights' own loss; F16's row is the floor), llama-bench prefill and decode
tokens/s, then for each concurrency level TTFT p50,
TTFT p99 and total output tokens/s, each with `_min` and `_max` over the repeats. An empty cell is
a figure that was not measured (so is a standard deviation when llama-bench ran only once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.run_data import RunData
from quantload.quality.kld_results import FLOOR_CACHE_TYPE, mean_error_nats
from quantload.roofline.speed_file import SpeedFile
from quantload.rundir.kv_file import KvResult

# ----------------------------------------------------------------------------- header


@dataclass(frozen=True)
class Header:
    """Facts for the top of the report; None where the run did not record them."""

    run_id: str
    model: str | None
    model_note: str | None
    llama_cpp: str | None
    machine: str | None
    status: str
    started: str
    finished: str
    profile: str | None
    servers: str | None
    cache_states: tuple[tuple[str, str], ...]
    run_notes: tuple[str, ...]

    def facts(self) -> list[tuple[str, str]]:
        """(label, text) pairs in display order; missing facts say so."""
        unknown = "not recorded"
        facts = [
            ("run", self.run_id),
            ("model", self.model or unknown),
            ("llama.cpp", self.llama_cpp or unknown),
            ("machine", self.machine or unknown),
            ("run status", self.status),
            ("started", self.started),
            ("finished", self.finished),
            ("profile", self.profile or unknown),
            ("servers", self.servers or unknown),
        ]
        if self.model_note:
            facts.insert(2, ("model source note", self.model_note))
        return facts

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _model(run: RunData) -> tuple[str | None, str | None]:
    if run.manifest is not None:
        source = run.manifest.source
        name = str(source.get("name") or source.get("origin") or "")
        origin = source.get("origin")
        text = f"{name} ({origin})" if origin and origin != name else name
        note = source.get("note")
        return text or None, str(note) if note else None
    model = (run.state.model if run.state else None) or (run.settings.model.source if run.settings else None)
    return (str(model) if model else None), None


def _llama_cpp(run: RunData) -> str | None:
    records: list[dict[str, Any]] = []
    if run.manifest is not None:
        records.append(run.manifest.llama_cpp)
    records += [r.llama_cpp for r in (run.quality.results.values() if run.quality else [])]
    records += [e.bench.llama_cpp for e in (run.speed.results.values() if run.speed else [])]
    for record in records:
        sdist, version = record.get("sdist"), record.get("binary_version")
        if sdist or version:
            return " ".join(str(part) for part in (sdist, f"({version})" if version else None) if part)
    return None


def _machine(run: RunData) -> str | None:
    if run.speed is None or not run.speed.results:
        return None
    bench = next(iter(run.speed.results.values())).bench
    parts = []
    limits = run.speed.machine
    if limits is not None:
        ident = limits.machine
        parts.append(
            f"{ident.hostname}: {ident.cpu_model}, {ident.usable_cpus} usable CPUs ({ident.machine})"
        )
    elif bench.cpu_info:
        parts.append(bench.cpu_info)
    if bench.gpu_info:
        parts.append(f"GPU {bench.gpu_info}")
    if bench.backends:
        parts.append(f"llama.cpp backends {bench.backends}, {bench.n_threads} threads")
    return "; ".join(parts) or None


def _servers(run: RunData) -> str | None:
    at_once = run.state.servers_at_once if run.state else None
    if at_once is None and run.settings is not None:
        at_once = run.settings.run.servers_at_once
    text = None
    if at_once is False:
        text = "servers were run one at a time, so no server competed with another for cores"
    elif at_once is True:
        text = "servers were run all at once and shared this machine's cores"
    if run.state is not None:
        bad = [
            f"{q}: {s.status}"
            for q, s in run.state.servers.items()
            if s.status not in ("ok", "running", None)
        ]
        if bad:
            text = (text + "; " if text else "") + "server trouble: " + ", ".join(bad)
    return text


def _cache_n_text(stages: pd.DataFrame, records: pd.DataFrame, experiment: str) -> str | None:
    ids = set(stages[stages["experiment"] == experiment]["stage_id"]) if not stages.empty else set()
    chosen = records[records["stage_id"].isin(ids) & records["ok"] & ~records["warmup"]]
    if chosen.empty:
        return None
    states = sorted({bool(v) for v in chosen["cache_prompt"]})
    sent = " and ".join(f"cache_prompt={str(s).lower()}" for s in states)
    reused = chosen["cache_n"].dropna()
    hits = int((reused > 0).sum())
    if not len(reused):
        return f"{sent} on every request; the server did not report cache_n"
    return (
        f"{sent} on every request; the server reused cached prompt tokens (timings.cache_n > 0)"
        f" in {hits} of {len(reused)} requests"
    )


def cache_states(run: RunData, stages: pd.DataFrame) -> list[tuple[str, str]]:
    """Each section's cache state: the prompt cache for load sections, the probe cache for speed."""
    states: list[tuple[str, str]] = []
    for experiment, label in (("sweep", "concurrency sweep"), ("open_loop", "open loop")):
        text = _cache_n_text(stages, run.records, experiment)
        if text:
            states.append((label, text))
    prefix = stages[stages["experiment"] == "prefix_cache"] if not stages.empty else stages
    if not prefix.empty:
        server_state = "; ".join(dict.fromkeys(str(s) for s in prefix["server_state"].dropna()))
        text = _cache_n_text(stages, run.records, "prefix_cache") or ""
        states.append(
            (
                "prompt-cache experiment",
                f"off and on by design: {text}" + (f"; server state: {server_state}" if server_state else ""),
            )
        )
    if run.speed is not None and run.speed.machine is not None:
        limits = run.speed.machine
        how = "measured for this run" if limits.source == "probe" else "reused from the probe cache"
        states.append(("roofline", f"machine limits {how} (probed {limits.probed_at})"))
    return states


def build_header(run: RunData, stages: pd.DataFrame) -> Header:
    """The header of `run`."""
    model, note = _model(run)
    state = run.state
    status = str((state.status if state else None) or "unknown (no run.json)")
    if status == "running":
        status = "running, or stopped without recording its end (interrupted)"
    profile = (state.profile if state else None) or (run.settings.run.profile if run.settings else None)
    return Header(
        run_id=run.run_id,
        model=model,
        model_note=note,
        llama_cpp=_llama_cpp(run),
        machine=_machine(run),
        status=status,
        started=fmt.utc(state.started_unix_s if state else None),
        finished=fmt.utc(state.finished_unix_s if state else None),
        profile=str(profile) if profile else None,
        servers=_servers(run),
        cache_states=tuple(cache_states(run, stages)),
        run_notes=tuple(state.notes) if state else (),
    )


# ----------------------------------------------------------------------------- quantization table

LOAD_FIGURES: tuple[str, ...] = ("ttft_p50_s", "ttft_p99_s", "output_tok_s")


def level_column(metric: str, users: int) -> str:
    """'ttft_p50_s_at_4_users'."""
    return f"{metric}_at_{users}_users"


def users_levels(run: RunData, levels: pd.DataFrame) -> list[int]:
    """Configured levels and measured ones, ascending."""
    configured = list(run.configured_users())
    measured = [int(u) for u in levels["users"].dropna()] if not levels.empty else []
    return sorted(set(configured) | set(measured))


def _file_size(run: RunData, quant: str) -> int | None:
    if run.manifest is not None and quant in run.manifest.files:
        return run.manifest.files[quant].size_bytes
    if run.quality is not None and quant in run.quality.results:
        return run.quality.results[quant].model_size_bytes
    return None


def imatrix_text(metadata: dict[str, Any] | None) -> str:
    """Which importance matrix a file was made with, from its own quantize.imatrix.* metadata:
    'no', or the matrix's file name, calibration text and chunks."""
    if not metadata:
        return "no"
    name = Path(str(metadata.get("file", "yes"))).name
    dataset = metadata.get("dataset")
    chunks = metadata.get("chunks_count")
    details = [f"on {Path(str(dataset)).name}" if dataset else "", f"{chunks} chunks" if chunks else ""]
    extra = ", ".join(d for d in details if d)
    return f"{name} ({extra})" if extra else name


def quant_table(run: RunData, levels: pd.DataFrame, quants: Sequence[str]) -> pd.DataFrame:
    """The quantization table (see the module docstring); quants in the run's order."""
    users = users_levels(run, levels)
    kld = run.quality.kld if run.quality else None
    losses = kld.for_cache_type(FLOOR_CACHE_TYPE) if kld is not None else {}
    rows = []
    for quant in quants:
        quality = run.quality.results.get(quant) if run.quality else None
        loss = losses.get(quant)
        speed = run.speed.results.get(quant) if run.speed else None
        repeated = speed is not None and speed.bench.reps > 1  # one repetition has no spread to show
        entry = run.manifest.files.get(quant) if run.manifest is not None else None
        row: dict[str, Any] = {
            "quant": quant,
            "file_size_bytes": _file_size(run, quant),
            "file_type": entry.file_type if entry else None,
            "imatrix": imatrix_text(entry.imatrix) if entry else None,
            "origin": entry.origin if entry else None,
            "perplexity": quality.perplexity if quality else None,
            "perplexity_error": quality.perplexity_error if quality else None,
            "kld_mean_nats": loss.kld_mean_nats if loss else None,
            "kld_mean_error_nats": mean_error_nats(loss) if loss else None,
            "same_top_p_pct": loss.same_top_p_pct if loss else None,
            "prefill_tok_s": speed.bench.prefill.tokens_per_s if speed else None,
            "prefill_stddev_tok_s": speed.bench.prefill.stddev_tokens_per_s if speed and repeated else None,
            "decode_tok_s": speed.bench.decode.tokens_per_s if speed else None,
            "decode_stddev_tok_s": speed.bench.decode.stddev_tokens_per_s if speed and repeated else None,
        }
        mine = levels[levels["quant"] == quant] if not levels.empty else levels
        for level in users:
            found = mine[mine["users"] == level].to_dict("records") if not mine.empty else []
            source = found[0] if found else {}
            for metric in LOAD_FIGURES:
                for suffix in ("", "_min", "_max"):
                    value = source.get(f"{metric}{suffix}")
                    row[level_column(metric, level) + suffix] = (
                        None if value is None or pd.isna(value) else value
                    )
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- KV check and roofline


@dataclass(frozen=True)
class KvRow:
    """One quantization's KV check; `error` says why it was not measured."""

    quant: str
    predicted_mib: float | None
    reported_mib: float | None
    diff_pct: float | None
    slots: int | None
    ctx_per_slot: int | None
    cache_types: str | None
    formula: str | None
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_rows(kv: dict[str, KvResult], quants: Sequence[str]) -> list[KvRow]:
    """A row per quantization in kv.json, in the run's order."""
    rows = []
    for quant in [q for q in quants if q in kv] + [q for q in kv if q not in quants]:
        entry = kv[quant]
        error = entry.error
        if error is None and entry.reported_mib is None:
            error = "llama-server did not report a KV size"
        types = (
            f"K {entry.cache_type_k}, V {entry.cache_type_v}"
            if entry.cache_type_k is not None and entry.cache_type_v is not None
            else None
        )
        rows.append(
            KvRow(
                quant=quant,
                predicted_mib=entry.predicted_mib,
                reported_mib=entry.reported_mib,
                diff_pct=entry.diff_pct,
                slots=entry.slots,
                ctx_per_slot=entry.ctx_per_slot,
                cache_types=types,
                formula=entry.formula,
                error=error,
            )
        )
    return rows


def roofline_frame(speed: SpeedFile | None, quants: Sequence[str]) -> pd.DataFrame:
    """One row per (quant, test): measured, memory and compute ceilings, bound, fraction."""
    if speed is None:
        return pd.DataFrame()
    rows: list[dict[str, Any]] = []
    for quant in [q for q in quants if q in speed.results] + [q for q in speed.results if q not in quants]:
        entry = speed.results[quant]
        roof = entry.roofline
        if roof is None:
            continue
        for phase, ceiling in (("prefill", roof.prefill), ("decode", roof.decode)):
            bench = entry.bench.prefill if phase == "prefill" else entry.bench.decode
            rows.append(
                {
                    "quant": quant,
                    "phase": phase,
                    "test": ceiling.test,
                    "measured_tok_s": bench.tokens_per_s,
                    "stddev_tok_s": bench.stddev_tokens_per_s,
                    "memory_ceiling_tok_s": ceiling.memory_ceiling_tokens_per_s,
                    "compute_ceiling_tok_s": ceiling.compute_ceiling_tokens_per_s,
                    "ceiling_tok_s": ceiling.ceiling_tokens_per_s,
                    "bound": ceiling.bound,
                    "fraction_of_ceiling": ceiling.fraction_of_ceiling,
                    "bytes_per_token": ceiling.bytes_per_token,
                    "bits_per_weight": roof.bits_per_weight,
                    "explanation": roof.explanation,
                    "device": roof.device,
                    "device_note": roof.device_note,
                }
            )
    return pd.DataFrame(rows)
