"""The whole protocol across five hosts against the native run of the same profile (issue 24).

    .venv/bin/python benchmarks/hosts_netns.py [--models tiny,smollm2-135m] [--out DIR]   # as root

For each model (tiny with the ci profile, SmolLM2-135M with quick): `quantload prepare` into a
folder of its own; the native run, `quantload run` with `load.experiments` set to the profile's
experiments less kv_types (which only `quantload run` can run, as it starts servers of its own);
then the same protocol across hosts in network namespaces (tests/hosts_protocol.py: a server host,
two load hosts, a control host, a monitoring host). Prints the wall time of each phase and in all,
with the load average before and after, and writes the table to benchmarks/figures/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the hosts and the protocol are test code
import netns_hosts  # noqa: E402
from hosts_protocol import HOSTS, Protocol, profile_settings  # noqa: E402
from quantload.config import ToolchainSettings  # noqa: E402
from quantload.experiments.registry import planned  # noqa: E402
from quantload.llamacpp.toolchain import find_toolchain  # noqa: E402
from support import clean_env  # noqa: E402

PROFILES = {"tiny": "ci", "smollm2-135m": "quick"}
DATASET = REPO.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"
QUANTLOAD = (sys.executable, "-m", "quantload.cli.main")
# native run.json step -> the phase it belongs to (the multi-host run names its phases the same)
NATIVE_PHASES = {
    "quality": "quality", "kld": "quality", "roofline_probe": "speed", "speed": "speed",
    "serve": "servers", "prometheus": "monitoring", "kv": "kv", "report": "report",
    "load": "load", "prefix_cache": "load", "sessions": "load", "mixed": "load", "limit_users": "load",
    "open_loop": "load", "trace": "load", "limit_rate": "load",
}  # fmt: skip
PHASES = ("quality", "speed", "servers", "monitoring", "load", "kv", "report", "total")


def _load_average() -> float:
    return os.getloadavg()[0]


def prepare(model: str, folder: Path, env: dict[str, str]) -> Path:
    subprocess.run([*QUANTLOAD, "prepare", "--model", model, "--out", str(folder)], env=env, check=True)
    return folder / "manifest.json"


def native(
    model: str, profile: str, experiments: list[str], out: Path, env: dict[str, str]
) -> dict[str, float]:
    """`quantload run` of the same profile and experiments; seconds per phase from its run.json."""
    started = time.monotonic()
    run_env = {**env, "QUANTLOAD_LOAD__EXPERIMENTS": json.dumps(experiments)}
    command = [
        *QUANTLOAD, "run", "--model", model, "--profile", profile, "--out", str(out),
        "--dataset", str(DATASET),
    ]  # fmt: skip
    subprocess.run(command, env=run_env, check=True, stdout=subprocess.DEVNULL)
    total = time.monotonic() - started
    (run_dir,) = [p for p in out.iterdir() if (p / "run.json").is_file()]
    seconds: dict[str, float] = {}
    for step in json.loads((run_dir / "run.json").read_text())["steps"]:
        phase = NATIVE_PHASES.get(step["name"])
        if phase is not None:
            seconds[phase] = seconds.get(phase, 0.0) + (step["seconds"] or 0.0)
    seconds["total"] = total
    return seconds


def across_hosts(
    model: str, profile: str, experiments: list[str], manifest: Path, out: Path
) -> dict[str, float]:
    toolchain = find_toolchain(ToolchainSettings(), os.environ)
    if toolchain is None:
        raise SystemExit("llama.cpp tools not built: run `quantload toolchain` first")
    with netns_hosts.host_network(HOSTS) as network:
        protocol = Protocol(
            network, toolchain, manifest, out / "netns", profile, experiments, DATASET, clean_env()
        )
        result = protocol.run()
        summary = result.summary()
    if summary["not_measured"]:
        print(f"  across hosts, not measured: {summary['not_measured']}")
    return result.seconds


def _row_lines(model: str, profile: str, here: dict[str, float], there: dict[str, float]) -> list[str]:
    lines = []
    for phase in PHASES:
        here_s, there_s = here.get(phase), there.get(phase)
        ratio = f"{there_s / here_s:.2f}" if here_s and there_s else "-"
        shown = [f"{value:.1f}" if value is not None else "-" for value in (here_s, there_s)]
        lines.append(f"| {model} | {profile} | {phase} | {shown[0]} | {shown[1]} | {ratio} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--models", default="tiny,smollm2-135m")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temp folder)")
    args = parser.parse_args()
    reason = netns_hosts.unavailable()
    if reason:
        raise SystemExit(reason)
    netns_hosts.interrupt_on_sigterm()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
    figure = REPO / "benchmarks" / "figures" / f"hosts-netns-{stamp}.md"
    header = [
        f"# Across hosts against native ({stamp})", "", f"`{' '.join(sys.argv)}`", "",
        "| model | profile | phase | native s | across hosts s | across/native |",
        "|---|---|---|---:|---:|---:|",
    ]  # fmt: skip
    figure.write_text("\n".join(header) + "\n")
    print("\n".join(header[4:]), flush=True)
    with tempfile.TemporaryDirectory(prefix="quantload-hosts-bench-") as scratch:
        base = args.out or Path(scratch)
        env = clean_env()
        for model in args.models.split(","):
            before = _load_average()
            profile = PROFILES[model]
            settings = profile_settings(profile, base)
            # what `quantload run` would run (the registry leaves out those without their input,
            # such as a soak with no duration), less kv_types
            experiments = [kind.name for kind in planned(settings) if kind.name != "kv_types"]
            folder = base / model
            manifest = prepare(model, folder / "models", env)
            print(f"{model} ({profile}, experiments {', '.join(experiments)}): native run ...", flush=True)
            here = native(model, profile, experiments, folder / "native", env)
            print(f"{model}: across hosts ...", flush=True)
            there = across_hosts(model, profile, experiments, manifest, folder)
            lines = _row_lines(model, profile, here, there)
            after = _load_average()
            lines.append(f"| {model} | | load average | {before:.2f} before | {after:.2f} after | |")
            with figure.open("a") as handle:  # each model's rows as soon as they are measured
                handle.write("\n".join(lines) + "\n")
            print("\n".join(lines), flush=True)
    with figure.open("a") as handle:
        handle.write(f"\n{os.cpu_count()} cores\n")
    print(f"written to {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
