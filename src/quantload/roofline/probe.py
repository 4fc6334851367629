"""This machine's memory bandwidth and arithmetic rate, measured in a few seconds and cached.

Method (numpy only, so it runs wherever quantload does):

- Memory bandwidth: a float32 buffer of at least 256 MiB and four times the last-level cache (at
  most 2 GiB) is split into one slice per usable CPU; one thread per slice takes `numpy.max` of it
  (a vectorized streaming read that writes nothing and releases the GIL). Bandwidth = buffer bytes
  / wall time of the whole pass. One warm-up pass, then the median of 7 passes. Decoding a token is
  this kind of work: read every weight once.
- Arithmetic rate: a float32 matrix product of two random 1536 x 1536 matrices through numpy's BLAS
  with all its threads; rate = 2 n^3 / wall time. One warm-up, then the median of 5. llama.cpp's
  CPU kernels accumulate in f32 too, so this is the rate a well-blocked f32 kernel reaches here;
  int8 dot-product kernels (Q8_0, K-quants) can exceed it.

Both are achievable rates, not datasheet peaks: the ceiling a program on this machine can reach.
Other processes running at the same time lower them; the samples are kept so the spread shows.
"""

from __future__ import annotations

import hashlib
import platform
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantload import cpu_share
from quantload.config import SpeedSettings
from quantload.llamacpp.bench import load_average_1m, usable_cpus
from quantload.rundir import read_json, write_json_atomic
from quantload.text_format import percent

MIB = 1024 * 1024
MIN_BUFFER_BYTES = 256 * MIB
MAX_BUFFER_BYTES = 2048 * MIB
CACHE_MULTIPLE = 4
BANDWIDTH_PASSES = 7
MATRIX_SIZE = 1536
MATMUL_PASSES = 5
DEFAULT_MAX_AGE_S = 24 * 3600.0
PROBE_DIR = "machine"  # under the cache: the probe's result, per machine, for a day
# A 1-minute load average above this many runnable tasks per CPU means other work shared the CPUs.
BANDWIDTH_METHOD = (
    "numpy.max over a float32 buffer, one slice per CPU thread; bytes read / wall time;"
    " median of {passes} passes after a warm-up"
)
ARITHMETIC_METHOD = (
    "float32 {n}x{n} matrix product via numpy BLAS; 2 n^3 / wall time; median of {passes} passes"
    " after a warm-up"
)


class MachineId(BaseModel):
    """What identifies the machine a probe ran on; a cached probe is reused only on a match."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hostname: str
    cpu_model: str
    usable_cpus: int
    machine: str
    numpy_version: str

    @property
    def fingerprint(self) -> str:
        """A short hash of every field."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]


class EarlierProbe(BaseModel):
    """The probe a fresh one replaced in the cache: what the machine measured the time before."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bandwidth_bytes_per_s: float
    bandwidth_samples_bytes_per_s: list[float]
    arithmetic_flops_per_s: float
    arithmetic_samples_flops_per_s: list[float]
    probed_at: str


def relative_spread(samples: list[float]) -> float:
    """(max - min) / median of a probe's passes: how much its own passes disagreed."""
    if not samples:
        return 0.0
    middle = statistics.median(samples)
    return (max(samples) - min(samples)) / middle if middle > 0 else 0.0


class MachineLimits(BaseModel):
    """Measured memory bandwidth and arithmetic rate of this machine, with method and samples."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bandwidth_bytes_per_s: float = Field(description="median streaming-read rate")
    bandwidth_samples_bytes_per_s: list[float]
    bandwidth_method: str
    buffer_bytes: int
    read_threads: int
    arithmetic_flops_per_s: float = Field(description="median f32 matrix-product rate")
    arithmetic_samples_flops_per_s: list[float]
    arithmetic_method: str
    matrix_size: int
    machine: MachineId
    probed_at: str = Field(description="UTC, ISO 8601")
    probe_wall_s: float
    load_average_1m_start: float | None = Field(default=None, description="system load before the probe")
    other_cpu_frac: float | None = Field(
        default=None, description="share of all CPUs other processes used during the probe"
    )
    source: Literal["probe", "cache"] = "probe"
    earlier: EarlierProbe | None = Field(default=None, description="the cached probe this one replaced")

    def moves(self) -> list[str]:
        """Each ceiling that moved from the earlier probe by more than either probe's own noise
        (the spread of its passes): one sentence each; a ceiling that moves so is not a ceiling to
        set a measured rate against."""
        before = self.earlier
        if before is None:
            return []
        said = []
        for what, now, then, samples, old_samples, unit, scale in (
            ("memory bandwidth", self.bandwidth_bytes_per_s, before.bandwidth_bytes_per_s,
             self.bandwidth_samples_bytes_per_s, before.bandwidth_samples_bytes_per_s, "GB/s", 1e9),
            ("arithmetic rate", self.arithmetic_flops_per_s, before.arithmetic_flops_per_s,
             self.arithmetic_samples_flops_per_s, before.arithmetic_samples_flops_per_s, "GFLOP/s", 1e9),
        ):  # fmt: skip
            noise = max(relative_spread(samples), relative_spread(old_samples))
            moved = abs(now - then) / then if then > 0 else 0.0
            if moved > noise:
                said.append(
                    f"the {what} ceiling moved from {then / scale:,.1f} to {now / scale:,.1f} {unit} since"
                    f" the probe of {before.probed_at} ({percent(moved, 0)}, more than its noise of"
                    f" {percent(noise, 0)})"
                )
        return said

    @property
    def taken_when_busy(self) -> bool:
        """True when other work shared the CPUs during the probe (or that is unknown)."""
        return self.other_cpu_frac is None or cpu_share.busy(self.other_cpu_frac)

    @property
    def balance_flops_per_byte(self) -> float:
        """Arithmetic rate / bandwidth: work below this intensity is memory-bound."""
        return self.arithmetic_flops_per_s / self.bandwidth_bytes_per_s


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def this_machine() -> MachineId:
    """The identity of the machine this process runs on."""
    return MachineId(
        hostname=platform.node(),
        cpu_model=_cpu_model(),
        usable_cpus=usable_cpus(),
        machine=platform.machine(),
        numpy_version=np.__version__,
    )


def _last_level_cache_bytes() -> int | None:
    sizes: list[int] = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = entry.read_text(encoding="utf-8").strip().upper()
        except OSError:
            continue
        units = {"K": 1024, "M": MIB, "G": 1024 * MIB}
        factor = units.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * factor)
    return max(sizes) if sizes else None


def buffer_size_bytes() -> int:
    """The read buffer: at least 256 MiB and four times the largest cache, so DRAM is measured."""
    cache = _last_level_cache_bytes() or 0
    return min(MAX_BUFFER_BYTES, max(MIN_BUFFER_BYTES, CACHE_MULTIPLE * cache))


def _median_rate(work: float, run: Callable[[], object], passes: int) -> list[float]:
    run()  # warm-up: page faults, thread start-up, BLAS initialisation
    rates: list[float] = []
    for _ in range(passes):
        started = time.perf_counter()
        run()
        rates.append(work / (time.perf_counter() - started))
    return rates


def measure_bandwidth(buffer_bytes: int, threads: int, passes: int = BANDWIDTH_PASSES) -> list[float]:
    """Streaming-read rates in bytes/s, one per pass."""
    data = np.ones(buffer_bytes // 4, dtype=np.float32)
    slices = np.array_split(data, threads)
    with ThreadPoolExecutor(max_workers=threads) as pool:

        def read_all() -> None:
            list(pool.map(np.max, slices))

        return _median_rate(float(data.nbytes), read_all, passes)


def measure_arithmetic(size: int = MATRIX_SIZE, passes: int = MATMUL_PASSES) -> list[float]:
    """float32 matrix-product rates in flop/s, one per pass."""
    generator = np.random.default_rng(0)
    left = generator.standard_normal((size, size), dtype=np.float32)
    right = generator.standard_normal((size, size), dtype=np.float32)
    return _median_rate(2.0 * size**3, lambda: left @ right, passes)


def run_probe() -> MachineLimits:
    """Measure now, without looking at any cache (a few seconds)."""
    started = time.monotonic()
    load_start = load_average_1m()
    cpu_at_start = cpu_share.mark()
    threads = usable_cpus()
    buffer_bytes = buffer_size_bytes()
    bandwidth = measure_bandwidth(buffer_bytes, threads)
    arithmetic = measure_arithmetic()
    return MachineLimits(
        bandwidth_bytes_per_s=statistics.median(bandwidth),
        bandwidth_samples_bytes_per_s=[round(rate) for rate in bandwidth],
        bandwidth_method=BANDWIDTH_METHOD.format(passes=BANDWIDTH_PASSES),
        buffer_bytes=buffer_bytes,
        read_threads=threads,
        arithmetic_flops_per_s=statistics.median(arithmetic),
        arithmetic_samples_flops_per_s=[round(rate) for rate in arithmetic],
        arithmetic_method=ARITHMETIC_METHOD.format(n=MATRIX_SIZE, passes=MATMUL_PASSES),
        matrix_size=MATRIX_SIZE,
        machine=this_machine(),
        probed_at=datetime.now(UTC).isoformat(timespec="seconds"),
        probe_wall_s=round(time.monotonic() - started, 3),
        load_average_1m_start=load_start,
        other_cpu_frac=cpu_share.other_cpu_frac(cpu_at_start),
    )


def cache_path(cache_dir: Path, machine: MachineId) -> Path:
    """Where the probe of `machine` is cached."""
    return cache_dir / "roofline" / f"machine-{machine.fingerprint}.json"


def _read_cached(path: Path, machine: MachineId, max_age_s: float) -> MachineLimits | None:
    try:
        cached = MachineLimits.model_validate(read_json(path))
    except (OSError, ValueError, ValidationError):
        return None
    age_s = (datetime.now(UTC) - datetime.fromisoformat(cached.probed_at)).total_seconds()
    if cached.machine != machine or not 0 <= age_s <= max_age_s or cached.taken_when_busy:
        return None
    return cached.model_copy(update={"source": "cache"})


def probe_machine(
    cache_dir: Path | None,
    refresh: bool = False,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    probe: Callable[[], MachineLimits] = run_probe,
) -> MachineLimits:
    """This machine's limits: a cached probe younger than `max_age_s`, else a fresh one (cached).

    A cached probe that was taken while the machine was busy is not reused (probing again costs a
    couple of seconds). `cache_dir` None never reads or writes a cache; `refresh` forces a new probe.
    """
    machine = this_machine()
    path = cache_path(cache_dir, machine) if cache_dir is not None else None
    if path is not None and not refresh:
        cached = _read_cached(path, machine, max_age_s)
        if cached is not None:
            return cached
    limits = probe()
    if path is not None:
        earlier = _earlier(path, machine)
        if earlier is not None:
            limits = limits.model_copy(update={"earlier": earlier})
        write_json_atomic(path, limits.model_dump(mode="json"))
    return limits



def probe_in_cache(cache: Path, settings: SpeedSettings, refresh: bool = False) -> MachineLimits:
    """The speed step's probe: memory bandwidth and arithmetic rate, a recent probe kept in the
    cache (PROBE_DIR) else measured (about 1 s)."""
    return probe_machine(cache / PROBE_DIR, refresh=refresh, max_age_s=settings.probe_max_age_s)


def _earlier(path: Path, machine: MachineId) -> EarlierProbe | None:
    """The probe of this machine the cache held, however old or busy (None: none)."""
    try:
        cached = MachineLimits.model_validate(read_json(path))
    except (OSError, ValueError, ValidationError):
        return None
    if cached.machine != machine:
        return None
    return EarlierProbe(
        bandwidth_bytes_per_s=cached.bandwidth_bytes_per_s,
        bandwidth_samples_bytes_per_s=cached.bandwidth_samples_bytes_per_s,
        arithmetic_flops_per_s=cached.arithmetic_flops_per_s,
        arithmetic_samples_flops_per_s=cached.arithmetic_samples_flops_per_s,
        probed_at=cached.probed_at,
    )
