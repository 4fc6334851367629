"""The exporter's Collector: on every scrape, read each llama-server and turn it into metrics.

Each scrape reads every target's `/metrics` and `/slots` concurrently (and `/props` until the
target's labels are known), waiting at most `timeout_s` in all. A target that fails counts an
error of its class, reports `quantload_target_up 0` and logs one rate-limited line; the other
targets and the scrape itself carry on.

Where a target's log is known, its model's placement is followed there (exporter.placement): the
layers it offloaded and, matched by PCI address to the GPUs NVML lists, the GPUs it uses, as
`quantload_server_gpu_info` series the report joins with the GPUs' energy.

llama-server's throughput gauges (`predicted_tokens_seconds`, `prompt_tokens_seconds`) average
over the time since the previous read of `/metrics` and reset on every read: this exporter must be
the only reader of each server's `/metrics`, and Prometheus must scrape the exporter only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from quantload.exporter import names
from quantload.exporter.fetch import ERROR_CLASSES, LOADING_DETAIL, PARSE, Fetched, Fetcher, TargetRequest
from quantload.exporter.labels import UNKNOWN, discover
from quantload.exporter.names import MetricSpec
from quantload.exporter.placement import LogFollower, server_gpus
from quantload.exporter.ratelimit import RateLimitedLog
from quantload.exporter.server_metrics import ServerDataError, ServerSample, parse_server_metrics
from quantload.exporter.slots import (
    KvCapacity,
    SlotState,
    cells_from_log,
    cells_from_slots,
    parse_slots,
)
from quantload.exporter.targets import ExporterTarget, check_unique
from quantload.gpus import GpuInfo, GpuInventory
from quantload.llamacpp.offload import OffloadLog

LOG_HEAD_BYTES = 1024 * 1024
MODELS_PATH = "/v1/models"


def model_size(body: str | None) -> float | None:
    """The model's size in bytes from llama-server's /v1/models (`data[0].meta.size`), or None."""
    try:
        data = json.loads(body or "")
        size = data["data"][0]["meta"]["size"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return float(size) if isinstance(size, int | float) and not isinstance(size, bool) and size > 0 else None
COUNTED_ENDPOINTS = ("metrics", "slots")

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass
class _TargetState:
    """What the collector remembers about one target between scrapes."""

    target: ExporterTarget
    quant: str
    model: str
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    kv_from_log: KvCapacity | None = None
    log_done: bool = False
    was_up: bool | None = None
    model_bytes: float | None = None  # /v1/models' meta.size: the file's tensors, for the dashboard's order
    model_asked: bool = False  # /v1/models is read once, whatever it answers
    log_follower: LogFollower | None = None  # the model's placement, from the server's log

    @property
    def labels(self) -> dict[str, str]:
        return {"server": self.target.name, "quant": self.quant, "model": self.model}

    @property
    def labels_known(self) -> bool:
        return self.quant != UNKNOWN and self.model != UNKNOWN

    def headers(self) -> dict[str, str]:
        key = self.target.api_key_text
        return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass(frozen=True)
class _Reading:
    """One target's answers in one scrape, parsed; a failed part is None with its error result."""

    metrics: list[ServerSample] | None
    slots: list[SlotState] | None
    metrics_result: Fetched
    slots_result: Fetched


class _Families:
    """Samples grouped into one family per metric name, as the exposition format requires."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def add(self, spec: MetricSpec, labels: dict[str, str], value: float) -> None:
        family_name = spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
        family = self._families.get(family_name)
        if family is None:
            family = Metric(family_name, spec.doc, spec.kind)
            self._families[family_name] = family
        elif family.type != spec.kind:
            return
        sample = f"{family_name}_total" if spec.kind == "counter" else family_name
        family.add_sample(sample, labels, value)

    def merge(self, other: _Families) -> None:
        """Add every sample of `other` (one target's) to these families."""
        for family in other._families.values():
            mine = self._families.get(family.name)
            if mine is None:
                self._families[family.name] = family
            elif mine.type == family.type:
                mine.samples.extend(family.samples)

    def all(self) -> list[Metric]:
        return list(self._families.values())


class LlamaServerCollector(Collector):
    """Re-exports llama-servers' metrics and slot usage, labelled by server, quant and model."""

    def __init__(
        self,
        targets: Sequence[ExporterTarget],
        timeout_s: float = 0.5,
        *,
        log_interval_s: float = 60.0,
        logger: logging.Logger | None = None,
        gpus: Sequence[GpuInfo] = (),
    ) -> None:
        check_unique(list(targets))
        self._timeout_s = timeout_s
        self._inventory = GpuInventory(tuple(gpus))
        self._states = [_new_state(t) for t in targets]
        self._fetcher = Fetcher(timeout_s, len(self._states) + 2)
        self._ratelimited = RateLimitedLog(logger or _log, log_interval_s)
        self._lock = threading.Lock()
        self._restarting: set[str] = set()  # targets quantload is restarting on purpose

    def set_targets(self, targets: Sequence[ExporterTarget]) -> None:
        """Read these targets from the next scrape on; one kept (same name and URL) keeps its counts.

        Lets one exporter (and so one Prometheus job) span servers started and stopped in turn.
        """
        check_unique(list(targets))
        with self._lock:
            kept = {(s.target.name, s.target.url): s for s in self._states}
            states = [kept.get((t.name, t.url)) or _new_state(t) for t in targets]
            wanted = {id(state) for state in states}
            self._fetcher.forget(s.target.name for s in self._states if id(s) not in wanted)
            self._states = states
            if self._fetcher.max_workers < len(states) + 2:
                self._fetcher.close()
                self._fetcher = Fetcher(self._timeout_s, len(states) + 2)

    @contextlib.contextmanager
    def restarting(self, name: str) -> Iterator[None]:
        """While the target `name` is restarted on purpose (quantload's own restart with other
        flags), a scrape that finds it down is not logged as an error; it still counts in
        quantload_target_scrape_errors_total, as the truth of what a scrape met."""
        with self._lock:
            self._restarting.add(name)
        try:
            yield
        finally:
            with self._lock:
                self._restarting.discard(name)

    def describe(self) -> list[Metric]:
        """Nothing: registering must not read the servers."""
        return []

    def collect(self) -> list[Metric]:
        """Read every target now and return the metric families."""
        with self._lock:
            started = time.monotonic()
            results = self._fetcher.fetch_all(self._requests())
            out = _Families()
            for state in self._states:
                target_out = _Families()
                try:
                    self._collect_target(target_out, state, results)
                except Exception as error:  # a bug on one target's data must not fail the scrape
                    name = state.target.name
                    self._ratelimited.log(
                        logging.ERROR,
                        f"{name}/internal",
                        f"exporter target {name}: internal error: {type(error).__name__}: {error}",
                    )
                    target_out = _Families()
                    target_out.add(names.TARGET_UP, state.labels, 0.0)
                out.merge(target_out)
            out.add(names.EXPORTER_SCRAPE_DURATION, {}, time.monotonic() - started)
            return out.all()

    def _collect_target(
        self, out: _Families, state: _TargetState, results: dict[tuple[str, str], Fetched]
    ) -> None:
        reading = self._read(state, results)
        self._add_health(out, state, reading)
        for sample in reading.metrics or []:
            spec = MetricSpec(sample.name, sample.kind, sample.doc)
            out.add(spec, {**state.labels, **sample.labels}, sample.value)
        kv = self._kv_capacity(state, reading.slots)
        info = {"url": state.target.url, "kv_cells_source": kv.source if kv else "none"}
        out.add(names.TARGET_INFO, {**state.labels, **info}, 1.0)
        if state.model_bytes is not None:
            out.add(names.TARGET_MODEL_BYTES, state.labels, state.model_bytes)
        if reading.slots is not None:
            _add_slots(out, state.labels, reading.slots, kv)
        self._add_placement(out, state)

    def _add_placement(self, out: _Families, state: _TargetState) -> None:
        """The server's offloaded layers and its GPUs (see the module docstring)."""
        target = state.target
        if state.log_follower is None and target.log_path is not None:
            state.log_follower = LogFollower(target.log_path)
        placement = state.log_follower.follow() if state.log_follower is not None else None
        if placement is not None and placement.offloaded is not None and placement.layers is not None:
            out.add(names.SERVER_OFFLOADED_LAYERS, state.labels, float(placement.offloaded))
            out.add(names.SERVER_OFFLOADABLE_LAYERS, state.labels, float(placement.layers))
        if placement is None and not target.gpus:
            return
        for used in server_gpus(placement or OffloadLog(), target.gpus, self._inventory):
            out.add(names.SERVER_GPU_INFO, {**state.labels, **used.labels}, 1.0)

    def close(self) -> None:
        """Close the connections to the servers and stop the worker threads."""
        self._fetcher.close()

    def _requests(self) -> list[TargetRequest]:
        requests: list[TargetRequest] = []
        for state in self._states:
            paths = ["/metrics", "/slots"] if state.labels_known else ["/metrics", "/slots", "/props"]
            if not state.model_asked:
                paths.append(MODELS_PATH)
            target = state.target
            requests.append(TargetRequest(target.name, target.url, paths, state.headers()))
        return requests

    def _read(self, state: _TargetState, results: dict[tuple[str, str], Fetched]) -> _Reading:
        name = state.target.name
        props = results.get((name, "/props"))
        if props is not None and props.ok:
            self._learn_labels(state, props)
        models = results.get((name, MODELS_PATH))
        if models is not None and (models.ok or models.error != "timeout"):
            state.model_asked = True
            state.model_bytes = model_size(models.body) if models.ok else None
        metrics, metrics_result = _parsed(results[(name, "/metrics")], parse_server_metrics)
        slots, slots_result = _parsed(results[(name, "/slots")], _slots_from_body)
        for endpoint, result in (("metrics", metrics_result), ("slots", slots_result)):
            if result.error is not None:
                key = (endpoint, result.error)
                state.errors[key] = state.errors.get(key, 0) + 1
                loading = result.detail == LOADING_DETAIL or name in self._restarting
                self._ratelimited.log(
                    logging.INFO if loading else logging.WARNING,
                    f"{name}/{endpoint}/{result.error}" + ("/loading" if loading else ""),
                    f"exporter target {name} /{endpoint}: {result.error}: {result.detail}",
                )
        self._note_transition(state, metrics is not None)
        return _Reading(metrics, slots, metrics_result, slots_result)

    def _add_health(self, out: _Families, state: _TargetState, reading: _Reading) -> None:
        labels = state.labels
        duration = reading.metrics_result.duration_s + reading.slots_result.duration_s
        out.add(names.TARGET_UP, labels, float(reading.metrics is not None))
        out.add(names.TARGET_SCRAPE_DURATION, labels, duration)
        for (endpoint, error), count in sorted(state.errors.items()):
            error_labels = {**labels, "endpoint": endpoint, "error": error}
            out.add(names.TARGET_SCRAPE_ERRORS, error_labels, float(count))

    def _learn_labels(self, state: _TargetState, props: Fetched) -> None:
        try:
            found = discover(json.loads(props.body or ""))
        except ValueError:
            return
        if state.quant == UNKNOWN and found.quant:
            state.quant = found.quant
        if state.model == UNKNOWN and found.model:
            state.model = found.model

    def _note_transition(self, state: _TargetState, up: bool) -> None:
        name = state.target.name
        if up and state.was_up is False:
            self._ratelimited.forget(f"{name}/")
            self._ratelimited.log(logging.INFO, f"{name}/up", f"exporter target {name} is up again")
        state.was_up = up

    def _kv_capacity(self, state: _TargetState, slots: list[SlotState] | None) -> KvCapacity | None:
        target = state.target
        if target.kv_cells:
            return KvCapacity(target.kv_cells, "config")
        if state.kv_from_log is not None:
            return state.kv_from_log
        if target.log_path is not None and not state.log_done:
            cells = _cells_in_log(target)
            if cells:
                state.kv_from_log = KvCapacity(cells, "log")
                return state.kv_from_log
            # The KV line is printed before the server answers; once it does, stop re-reading.
            state.log_done = slots is not None
        if slots:
            return KvCapacity(cells_from_slots(slots), "slots")
        return None


def _new_state(target: ExporterTarget) -> _TargetState:
    state = _TargetState(target, target.quant or UNKNOWN, target.model or UNKNOWN)
    for endpoint in COUNTED_ENDPOINTS:
        for error in ERROR_CLASSES:
            state.errors[(endpoint, error)] = 0
    return state


def _slots_from_body(body: str) -> list[SlotState]:
    return parse_slots(json.loads(body))


def _parsed(result: Fetched, parse: Callable[[str], _T]) -> tuple[_T | None, Fetched]:
    """The parsed body, or None and the result turned into a parse failure."""
    if not result.ok or result.body is None:
        return None, result
    try:
        return parse(result.body), result
    except (ServerDataError, ValueError, RecursionError) as exc:  # RecursionError: JSON too deep
        detail = exc.problem if isinstance(exc, ServerDataError) else f"not JSON ({str(exc)[:120]})"
        return None, Fetched(None, PARSE, detail, result.duration_s)


def _cells_in_log(target: ExporterTarget) -> int | None:
    if target.log_path is None:
        return None
    try:
        with target.log_path.open("rb") as log:
            head = log.read(LOG_HEAD_BYTES)
    except OSError:
        return None
    return cells_from_log(head.decode("utf-8", errors="replace"))


def _add_slots(out: _Families, labels: dict[str, str], slots: list[SlotState], kv: KvCapacity | None) -> None:
    held_busy = sum(s.tokens for s in slots if s.busy)
    held_idle = sum(s.tokens for s in slots if not s.busy)
    out.add(names.SLOTS, labels, float(len(slots)))
    out.add(names.SLOTS_BUSY, labels, float(sum(1 for s in slots if s.busy)))
    for slot in slots:
        out.add(names.SLOT_TOKENS, {**labels, "slot": str(slot.slot_id)}, float(slot.tokens))
    out.add(names.KV_TOKENS, {**labels, "state": "busy"}, float(held_busy))
    out.add(names.KV_TOKENS, {**labels, "state": "idle"}, float(held_idle))
    if kv is not None and kv.cells > 0:
        out.add(names.KV_CELLS, labels, float(kv.cells))
        out.add(names.KV_CELLS_USED_RATIO, labels, (held_busy + held_idle) / kv.cells)
