"""The report's header: what was measured, with which llama.cpp, on which machine, in which state."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.load_run import RunData


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
    model = run.run.get("model") or run.setting("model", "source")
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
    at_once = run.run.get("servers_at_once")
    if at_once is None:
        at_once = run.setting("run", "servers_at_once")
    text = None
    if at_once is False:
        text = "servers were run one at a time, so they did not compete for cores"
    elif at_once is True:
        text = "servers were run all at once and shared this machine's cores"
    servers = run.run.get("servers")
    if isinstance(servers, dict):
        bad = [
            f"{q}: {s.get('status')}"
            for q, s in servers.items()
            if isinstance(s, dict) and s.get("status") not in ("ok", "running", None)
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
    status = str(run.run.get("status") or "unknown (no run.json)")
    if status == "running":
        status = "running, or stopped without recording its end (interrupted)"
    profile = run.run.get("profile") or run.setting("run", "profile")
    notes = tuple(str(n) for n in run.run.get("notes", []) if isinstance(n, str))
    return Header(
        run_id=run.run_id,
        model=model,
        model_note=note,
        llama_cpp=_llama_cpp(run),
        machine=_machine(run),
        status=status,
        started=fmt.utc(run.run.get("started_unix_s")),
        finished=fmt.utc(run.run.get("finished_unix_s")),
        profile=str(profile) if profile else None,
        servers=_servers(run),
        cache_states=tuple(cache_states(run, stages)),
        run_notes=notes,
    )
