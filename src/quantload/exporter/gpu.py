"""GPU telemetry from NVML: per-GPU utilisation, memory, power and the energy counter, per scrape.

NVML (the NVIDIA Management Library, through `nvidia-ml-py`'s module `pynvml`) is opened once when
the exporter starts. Where it is missing or does not initialise (no driver, no GPU, a CPU machine),
`open_gpu_telemetry` logs one line and returns None: the `quantload_gpu_*` series are simply absent.

Every NVML call runs on a reader thread and a scrape waits at most `timeout_s` for it; a read that
hangs (a GPU falling off the bus can do that) costs that scrape its GPU series, and no new read
starts while it runs. A quantity a GPU does not support (many consumer GPUs have no energy
counter) is left out for that GPU, said once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from quantload.exporter import names
from quantload.exporter.names import MetricSpec
from quantload.exporter.ratelimit import RateLimitedLog
from quantload.gpus import GpuInfo, describe_gpu
from quantload.nvml import Nvml, NvmlLoader, not_supported

INIT_TIMEOUT_S = 10.0  # nvmlInit can take seconds on a machine without the persistence daemon

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Device:
    index: int
    handle: Any
    info: GpuInfo

    @property
    def uuid(self) -> str:
        return self.info.uuid

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def labels(self) -> dict[str, str]:
        return {"gpu": str(self.index), "uuid": self.uuid, "gpu_name": self.name}


@dataclass(frozen=True)
class _Quantity:
    spec: MetricSpec
    read: Callable[[Nvml, Any], float]


QUANTITIES: tuple[_Quantity, ...] = (
    _Quantity(names.GPU_UTILIZATION_RATIO, lambda n, h: n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
    _Quantity(names.GPU_MEMORY_USED, lambda n, h: float(n.nvmlDeviceGetMemoryInfo(h).used)),
    _Quantity(names.GPU_MEMORY_TOTAL, lambda n, h: float(n.nvmlDeviceGetMemoryInfo(h).total)),
    _Quantity(names.GPU_POWER, lambda n, h: n.nvmlDeviceGetPowerUsage(h) / 1000.0),
    _Quantity(names.GPU_ENERGY, lambda n, h: n.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0),
    _Quantity(names.GPU_POWER_LIMIT, lambda n, h: n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
)

# (device index, metric name, value) for one scrape
Sample = tuple[int, str, float]


class _BoundedCall:
    """Runs one call at a time on a daemon thread; the caller waits at most a set time for it."""

    def __init__(self) -> None:
        self._running: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._running is not None and self._running.is_alive()

    def run(self, call: Callable[[], Any], timeout_s: float) -> tuple[bool, Any, BaseException | None]:
        """(finished, result, error); finished is False when the call is still running."""
        if self.busy:
            return False, None, None
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["result"] = call()
            except BaseException as error:  # handed to the caller, who decides
                box["error"] = error

        thread = threading.Thread(target=work, name="quantload-nvml", daemon=True)
        self._running = thread
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            return False, None, None
        return True, box.get("result"), box.get("error")


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class GpuCollector(Collector):
    """Re-reads every GPU NVML listed at start-up on each scrape; see the module docstring."""

    def __init__(
        self,
        nvml: Nvml,
        devices: Sequence[_Device],
        timeout_s: float,
        call: _BoundedCall,
        logger: logging.Logger,
        log_interval_s: float = 60.0,
    ) -> None:
        self._nvml = nvml
        self._devices = tuple(devices)
        self._timeout_s = timeout_s
        self._call = call
        self._logger = logger
        self._ratelimited = RateLimitedLog(logger, log_interval_s)
        self._unsupported: set[tuple[int, str]] = set()
        self._lock = threading.Lock()

    @property
    def gpu_count(self) -> int:
        return len(self._devices)

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        """What NVML told of each GPU at start-up (PCI address, MIG slices, ...)."""
        return tuple(device.info for device in self._devices)

    def describe(self) -> list[Metric]:
        """Nothing: registering must not read the GPUs."""
        return []

    def collect(self) -> list[Metric]:
        """Read every GPU now; a read past the deadline gives no GPU series this time."""
        with self._lock:
            finished, samples, error = self._call.run(self._read_all, self._timeout_s)
        if not finished:
            self._ratelimited.log(
                logging.WARNING,
                "gpu/timeout",
                f"GPU telemetry: NVML did not answer within {self._timeout_s:g} s; no GPU series this scrape",
            )
            return []
        if error is not None:
            self._ratelimited.log(logging.WARNING, "gpu/error", f"GPU telemetry: {_error_text(error)}")
            return []
        return [*_families(cast(list[Sample], samples), self._devices), _mig_family(self._devices)]

    def close(self) -> None:
        """Release NVML (bounded like a scrape; a hung NVML is left to the process's end)."""
        with self._lock:
            self._call.run(self._nvml.nvmlShutdown, self._timeout_s)

    def _read_all(self) -> list[Sample]:
        samples: list[Sample] = []
        for device in self._devices:
            for quantity in QUANTITIES:
                key = (device.index, quantity.spec.name)
                if key in self._unsupported:
                    continue
                try:
                    value = quantity.read(self._nvml, device.handle)
                except self._nvml.NVMLError as error:
                    if not_supported(error):
                        self._unsupported.add(key)
                        self._logger.info(
                            "GPU telemetry: GPU %d (%s) does not report %s: left out",
                            device.index,
                            device.name,
                            quantity.spec.name,
                        )
                        continue
                    self._ratelimited.log(
                        logging.WARNING,
                        f"gpu/{device.index}/{quantity.spec.name}",
                        f"GPU telemetry: GPU {device.index} {quantity.spec.name}: {_error_text(error)}",
                    )
                    continue
                samples.append((device.index, quantity.spec.name, value))
        return samples


def _families(samples: Sequence[Sample], devices: Sequence[_Device]) -> list[Metric]:
    specs = {q.spec.name: q.spec for q in QUANTITIES}
    by_index = {d.index: d for d in devices}
    families: dict[str, Metric] = {}
    for index, name, value in samples:
        spec = specs[name]
        family_name = name.removesuffix("_total") if spec.kind == "counter" else name
        family = families.get(family_name)
        if family is None:
            family = families[family_name] = Metric(family_name, spec.doc, spec.kind)
        family.add_sample(name, by_index[index].labels, value)
    return list(families.values())


def _mig_family(devices: Sequence[_Device]) -> Metric:
    spec = names.GPU_MIG_ENABLED
    family = Metric(spec.name, spec.doc, spec.kind)
    for device in devices:
        family.add_sample(spec.name, device.labels, float(device.info.mig_enabled))
    return family


def _list_devices(nvml: Nvml) -> list[_Device]:
    nvml.nvmlInit()
    devices = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        devices.append(_Device(index, handle, describe_gpu(nvml, index, handle)))
    if not devices:
        nvml.nvmlShutdown()
    return devices


def open_gpu_telemetry(
    loader: NvmlLoader,
    timeout_s: float,
    *,
    init_timeout_s: float = INIT_TIMEOUT_S,
    logger: logging.Logger | None = None,
) -> GpuCollector | None:
    """A collector over every GPU NVML sees, or None (said in one log line) when there is none."""
    log = logger or _log
    off = "GPU telemetry off (no quantload_gpu_* series)"
    try:
        nvml = loader()
    except ImportError as error:  # nvidia-ml-py is a dependency; a broken install still must not stop us
        log.info("%s: the NVML bindings cannot be imported (%s)", off, error)
        return None
    call = _BoundedCall()
    finished, devices, failure = call.run(lambda: _list_devices(nvml), init_timeout_s)
    if not finished:
        log.warning("%s: NVML did not initialise within %g s", off, init_timeout_s)
        return None
    if failure is not None:
        if isinstance(failure, nvml.NVMLError):
            log.info("%s: NVML is not available here (%s)", off, failure)
            return None
        log.warning("%s: NVML failed: %s", off, _error_text(failure))
        return None
    if not devices:
        log.info("%s: NVML initialised but sees no GPU", off)
        return None
    listed = ", ".join(f"{d.index} {d.name}" for d in devices)
    log.info("GPU telemetry on: %s", listed)
    return GpuCollector(nvml, devices, timeout_s, call, log)
