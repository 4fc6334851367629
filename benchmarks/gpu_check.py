"""The GPU check: llama.cpp built for this machine's GPU, served, loaded, and its telemetry asserted.

Runs offline from the working tree (benchmarks/gpu_telemetry_check.sh sets up the wheels and the
pinned sdist that benchmarks/gpu_check_bundle.sh gathered). Steps, each bounded in time:

1. NVML must list a GPU, else one line and exit 2.
2. llama.cpp's tools: QUANTLOAD_LLAMA_BIN when set (a build to reuse), else built from the sdist for
   the architectures of the GPUs found, and for nothing else (`quantload toolchain`'s own path).
3. Models written here: the tiny synthetic Qwen2 and a random one of about --big-params parameters
   (F16, the tiny one's vocabulary).
4. Each served by llama-server with every layer asked on the GPU; its log must show N/N offloaded.
5. The exporter (the real NVML) against the server of the large model; its GPUs from its log.
6. The GPUs idle for --idle-s, then --requests chat completions (--concurrency at a time), the
   exporter's GPU series read every --sample-s all the while.
7. llama-bench of the large model, set against the GPU's roofline.

Asserted: offload N/N; the server's GPUs found; power between 0 and the card's enforced limit in
every sample; total memory as NVML says; the energy counter rising and within 20 % of the power's
integral over the same span; mean power under load above idle; decode at most 100 % of the GPU's
ceiling. The figures and each assertion go to a JSON figure file (and a Markdown one) in --out.

    python benchmarks/gpu_check.py --work /tmp/gpu-check --out benchmarks/figures

`--cpu-build` (tests only) accepts a llama.cpp without a GPU backend: the assertions that need one
(offload, the server's GPUs, the GPU roofline) are reported as skipped; the telemetry ones stand.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from quantload.config import ToolchainSettings
from quantload.exporter import names, start_exporter
from quantload.exporter.targets import ExporterTarget
from quantload.gpus import GpuInventory, read_gpu_inventory
from quantload.llamacpp.bench import measure_speed
from quantload.llamacpp.offload import check_offload, parse_offload
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.toolchain import Toolchain, ensure_llama_source, ensure_toolchain
from quantload.models.gguf_meta import read_gguf
from quantload.models.synthetic import TinyShape, write_tiny_model
from quantload.nvml import NvmlLoader, system_nvml
from quantload.roofline.ceilings import UnknownGpuCeilings, roofline
from quantload.roofline.gpu_limits import gpu_ceilings
from quantload.roofline.probe import run_probe

ENERGY_TOLERANCE = 0.20
DEADLINE_S = 600.0
REQUEST_TIMEOUT_S = 120.0
PROMPT = "Write a long story about a lighthouse keeper and the sea."


@dataclass
class Checks:
    """Every assertion: name, passed (None = skipped), and what was seen."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, passed: bool | None, seen: str) -> None:
        self.rows.append({"check": name, "passed": passed, "seen": seen})
        mark = {True: "ok  ", False: "FAIL", None: "skip"}[passed]
        print(f"gpu check: [{mark}] {name}: {seen}", flush=True)

    @property
    def failed(self) -> list[str]:
        return [row["check"] for row in self.rows if row["passed"] is False]


@dataclass
class Sample:
    """One read of the exporter: per GPU uuid, its series."""

    at_s: float
    gpus: dict[str, dict[str, float]]


def big_shape(params: float) -> TinyShape:
    """A qwen2 shape of about `params` parameters (the tiny vocabulary's 151,936 tokens, tied)."""
    embedding, heads, kv_heads, ff = 2048, 16, 8, 5632
    per_layer = (
        2 * embedding * embedding + 2 * embedding * (embedding // heads * kv_heads) + 3 * embedding * ff
    )
    layers = max(1, round((params - 151_936 * embedding) / per_layer))
    return TinyShape(embedding=embedding, heads=heads, kv_heads=kv_heads, layers=layers, feed_forward=ff)


def read_exporter(url: str) -> Sample:
    """The quantload_gpu_* series of one scrape, by GPU uuid."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    gpus: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(names.GPU_PREFIX) and "uuid" in sample.labels:
                gpus.setdefault(sample.labels["uuid"], {})[sample.name] = sample.value
    return Sample(time.monotonic(), gpus)


def server_gpu_uuids(url: str) -> list[str]:
    """The GPUs the exporter places the server on (quantload_server_gpu_info)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sorted(
        sample.labels["uuid"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == names.SERVER_GPU_INFO.name
    )


class Sampler:
    """Reads the exporter every `every_s` on a thread until stopped."""

    def __init__(self, url: str, every_s: float) -> None:
        self.url, self.every_s = url, every_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-check-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(read_exporter(self.url))
            self._stop.wait(self.every_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def power_integral_j(samples: Sequence[Sample], uuid: str) -> float:
    """The trapezoid integral of one GPU's power over the samples."""
    points = [
        (s.at_s, s.gpus[uuid][names.GPU_POWER.name])
        for s in samples
        if names.GPU_POWER.name in s.gpus.get(uuid, {})
    ]
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in itertools.pairwise(points))


def _values(samples: Sequence[Sample], uuid: str, name: str) -> list[float]:
    return [s.gpus[uuid][name] for s in samples if name in s.gpus.get(uuid, {})]


def one_request(client: httpx.Client, url: str, max_tokens: int) -> int:
    response = client.post(
        f"{url}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
        },
        timeout=REQUEST_TIMEOUT_S,
    )
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


def send_load(url: str, requests: int, concurrency: int, max_tokens: int) -> int:
    """Output tokens of `requests` chat completions sent `concurrency` at a time."""
    with httpx.Client() as client, ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(lambda _: one_request(client, url, max_tokens), range(requests)))


def telemetry_checks(
    checks: Checks,
    idle: Sequence[Sample],
    load: Sequence[Sample],
    uuids: Sequence[str],
    inventory: GpuInventory,
) -> dict[str, Any]:
    """Power, memory and energy of each GPU of the server (see the module docstring)."""
    figures: dict[str, Any] = {}
    power, energy, limit, total = (names.GPU_POWER.name, names.GPU_ENERGY.name, names.GPU_POWER_LIMIT.name,
                                   names.GPU_MEMORY_TOTAL.name)  # fmt: skip
    for uuid in uuids:
        gpu = inventory.by_uuid(uuid)
        watts = _values([*idle, *load], uuid, power)
        limit_w = max(_values(load, uuid, limit), default=gpu.power_limit_w if gpu else None)
        in_range = bool(watts) and limit_w is not None and all(0 < w <= limit_w for w in watts)
        checks.add(
            f"{uuid} power within (0, limit]",
            in_range,
            f"{min(watts, default=0):.1f}-{max(watts, default=0):.1f} W, limit {limit_w} W",
        )
        totals = set(_values(load, uuid, total))
        expected = gpu.memory_total_bytes if gpu else None
        checks.add(
            f"{uuid} total memory as NVML says",
            totals == {expected},
            f"{sorted(totals)} B, NVML {expected} B",
        )
        counter = _values(load, uuid, energy)
        rising = len(counter) >= 2 and counter[-1] > counter[0]
        checks.add(
            f"{uuid} energy counter rising",
            rising,
            f"{counter[0] if counter else None} -> {counter[-1] if counter else None} J",
        )
        span = [s for s in load if energy in s.gpus.get(uuid, {})]
        integral = power_integral_j(span, uuid)
        used = counter[-1] - counter[0] if rising else 0.0
        close = integral > 0 and abs(used / integral - 1) <= ENERGY_TOLERANCE
        checks.add(
            f"{uuid} energy counter within 20 % of the power integral",
            close,
            f"counter {used:.1f} J, integral {integral:.1f} J",
        )
        idle_w = statistics.fmean(_values(idle, uuid, power)) if _values(idle, uuid, power) else None
        load_w = statistics.fmean(_values(load, uuid, power)) if _values(load, uuid, power) else None
        above = idle_w is not None and load_w is not None and load_w > idle_w
        checks.add(f"{uuid} power under load above idle", above, f"idle {idle_w} W, load {load_w} W")
        figures[uuid] = {
            "name": gpu.name if gpu else None, "idle_power_w": idle_w, "load_power_w": load_w,
            "power_limit_w": limit_w, "memory_total_bytes": expected, "energy_counter_j": used,
            "power_integral_j": integral, "samples": len(load),
        }  # fmt: skip
    return figures


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="models, logs, the build cache")
    parser.add_argument("--out", type=Path, default=None, help="where the figure file goes (default --work)")
    parser.add_argument(
        "--big-params", type=float, default=1e9, help="the random model's size; 0 = tiny only"
    )
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--sample-s", type=float, default=0.25)
    parser.add_argument("--bench-reps", type=int, default=3)
    parser.add_argument("--bench-prompt", type=int, default=512, help="llama-bench -p")
    parser.add_argument("--bench-gen", type=int, default=64, help="llama-bench -n")
    parser.add_argument("--tiny", type=Path, default=None, help="a tiny model already written (else written)")
    parser.add_argument("--cpu-build", action="store_true", help="tests only: accept a CPU-only llama.cpp")
    return parser.parse_args(list(argv))


def _toolchain_settings(work: Path, environ: Mapping[str, str]) -> ToolchainSettings:
    """QUANTLOAD_LLAMA_BIN to reuse; the build cache under `work`; the bundle's sdist, offline."""
    llama_bin = environ.get("QUANTLOAD_LLAMA_BIN")
    sdist_dir = environ.get("QUANTLOAD_TOOLCHAIN__SDIST_DIR")
    return ToolchainSettings(
        llama_bin=Path(llama_bin) if llama_bin else None,
        cache_dir=work / "cache",
        cmake_flags=tuple(flag for flag in environ.get("GPU_CHECK_CMAKE_FLAGS", "").split() if flag),
        sdist_dir=Path(sdist_dir) if sdist_dir else None,
    )


def _toolchain(work: Path, environ: Mapping[str, str], inventory: GpuInventory) -> Toolchain:
    settings = _toolchain_settings(work, environ)
    last = [0.0]

    def progress(completed: float, total: float | None, note: str = "") -> None:
        if time.monotonic() - last[0] > 30:
            last[0] = time.monotonic()
            print(f"gpu check: llama.cpp build {completed:g}/{total or '?'} {note}", flush=True)

    return ensure_toolchain(settings, environ, progress, gpus=lambda: inventory).placing_layers("all")


def main(
    argv: Sequence[str],
    nvml: NvmlLoader = system_nvml,
    environ: Mapping[str, str] | None = None,
    on_phase: Callable[[str], None] = lambda phase: None,
) -> int:
    """Run the check; 0 when every assertion held, 1 when one failed, 2 when it cannot run here."""
    options = parse_args(argv)
    env = dict(os.environ if environ is None else environ)
    started = time.monotonic()
    inventory = read_gpu_inventory(nvml)
    if not inventory.gpus:
        print(f"gpu check: no NVIDIA GPU found ({inventory.why_none}): this check needs one", flush=True)
        return 2
    work, out = options.work, options.out or options.work
    (work / "logs").mkdir(parents=True, exist_ok=True)
    print("gpu check: GPUs " + "; ".join(f"{g.index} {g.name} {g.uuid}" for g in inventory.gpus), flush=True)
    checks = Checks()
    figures: dict[str, Any] = {"gpus": [vars(gpu) for gpu in inventory.gpus]}
    toolchain = _toolchain(work, env, inventory)
    figures["llama_cpp"] = toolchain.version_record()
    figures["build_seconds"] = toolchain.build.get("build_seconds")
    tree = functools.partial(ensure_llama_source, _toolchain_settings(work, env), env)
    models = [options.tiny or write_tiny_model(tree(), work / "tiny-F16.gguf")]
    if options.big_params > 0:
        shape = big_shape(options.big_params)
        made = time.monotonic()
        models.append(write_tiny_model(tree(), work / "big-F16.gguf", seed=1, shape=shape))
        figures["big_model"] = {
            "params": read_gguf(models[-1]).n_params,
            "write_s": round(time.monotonic() - made, 1),
        }
    served = models[-1]
    for model in models:
        spec = ServerSpec(model, model.stem, slots=options.concurrency, ctx_per_slot=1024, gpu_layers="all")
        server = LlamaServer(toolchain, spec, work / "logs" / f"llama-server-{model.stem}.log", 300.0)
        with server:
            offload = check_offload("all", parse_offload(server.launch_log_text()))
            no_gpu = options.cpu_build and not offload.devices  # no GPU device in the log (a CPU build)
            checks.add(
                f"{model.stem} offload N/N",
                None if no_gpu else offload.verdict == "as asked" and offload.offloaded == offload.layers,
                offload.line,
            )
            figures.setdefault("offload", {})[model.stem] = offload.to_json()
            if model != served:
                continue
            target = ExporterTarget(
                name="gpu-check", url=server.url, quant="F16", model=model.stem, log_path=server.log_path
            )
            exporter = start_exporter([target], port=0, timeout_s=0.5, nvml=nvml)
            try:
                time.sleep(1.0)
                uuids = server_gpu_uuids(exporter.url)
                checks.add(
                    "the server's GPUs found from its log",
                    None if no_gpu else bool(uuids),
                    ", ".join(uuids) or "none",
                )
                watched = uuids or [g.uuid for g in inventory.gpus]
                on_phase("idle")
                with Sampler(exporter.url, options.sample_s) as idle:
                    time.sleep(options.idle_s)
                on_phase("load")
                load_started = time.monotonic()
                with Sampler(exporter.url, options.sample_s) as load:
                    tokens = send_load(server.url, options.requests, options.concurrency, options.max_tokens)
                load_s = time.monotonic() - load_started
                on_phase("done")
                figures["load"] = {
                    "requests": options.requests,
                    "output_tokens": tokens,
                    "seconds": round(load_s, 2),
                    "output_tokens_per_s": round(tokens / load_s, 1),
                }
                figures["telemetry"] = telemetry_checks(
                    checks, idle.samples, load.samples, watched, inventory
                )
            finally:
                exporter.stop()
    bench = measure_speed(
        toolchain, served, options.bench_prompt, options.bench_gen, options.bench_reps,
        log_path=work / "logs" / "llama-bench.log",
    )  # fmt: skip
    try:
        roof = roofline(bench, read_gguf(served), run_probe(), gpu_ceilings(lambda: inventory))
    except UnknownGpuCeilings as unknown:
        checks.add("decode against the GPU roofline", False, str(unknown))
    else:
        decode = roof.decode
        on_gpu = roof.device == "gpu"
        within = on_gpu and 0 < decode.fraction_of_ceiling <= 1.0
        seen = (f"{decode.measured_tokens_per_s:,.1f} tok/s of a {decode.ceiling_tokens_per_s:,.1f} ceiling"
                f" ({decode.fraction_of_ceiling:.0%}) on {roof.device}: {roof.device_note}")  # fmt: skip
        checks.add(
            "decode at most 100 % of the GPU roofline",
            None if options.cpu_build and not on_gpu else within,
            seen,
        )
        figures["roofline"] = roof.model_dump(mode="json")
    figures["wall_s"] = round(time.monotonic() - started, 1)
    checks.add(
        "the whole check within ten minutes", figures["wall_s"] <= DEADLINE_S, f"{figures['wall_s']} s"
    )
    write_figures(out, figures, checks)
    if checks.failed:
        print(f"gpu check: FAILED {', '.join(checks.failed)}", flush=True)
        return 1
    print("gpu check: every assertion held", flush=True)
    return 0


def write_figures(out: Path, figures: dict[str, Any], checks: Checks) -> Path:
    """The figure file (JSON) and its Markdown table; returns the JSON's path."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"gpu-check-{stamp}.json"
    path.write_text(json.dumps({"checks": checks.rows, "figures": figures}, indent=2, default=str) + "\n")
    lines = ["| check | result | seen |", "|---|---|---|"]
    lines += [
        f"| {r['check']} | {({True: 'ok', False: 'FAILED', None: 'skipped'})[r['passed']]} | {r['seen']} |"
        for r in checks.rows
    ]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"gpu check: figures in {path}", flush=True)
    return path


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
