"""The TTFT split with 0 and with 20 ms of added round-trip delay, across hosts (issue 24).

    .venv/bin/python benchmarks/network_delay.py [--models tiny,smollm2-135m] [--rtt-ms 20]   # as root

Three hosts in network namespaces: `server` (a llama-server of the model's Q4_K_M, flags as
`quantload run` starts it), `relay` (tests/netns_relay.py twice: one adding no delay, one adding
--rtt-ms of round trip) and `control` (`quantload load` and `quantload report`). One `quantload
load` per round streams the same closed-loop stage at 1 user to the server directly, through the
relay with no added delay and through the relay with the delay, the three in turn (--rounds, the
order turning each round). The report's TTFT split (queueing+network = TTFT - the server's
prompt_ms; prefill = prompt_ms), pooled over the rounds, is printed for each path, with the
differences: with the delay against without it (the target: the network part moves by the delay
within 2 ms at p50, the prefill does not), and the relay's own cost against the direct path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the hosts and the relay are test code
import netns_hosts  # noqa: E402
from hosts_protocol import profile_settings  # noqa: E402
from quantload.config import ToolchainSettings  # noqa: E402
from quantload.llamacpp.server import ServerSpec  # noqa: E402
from quantload.llamacpp.toolchain import find_toolchain  # noqa: E402
from support import clean_env  # noqa: E402

RELAY = REPO / "tests" / "netns_relay.py"
QUANTLOAD = (sys.executable, "-m", "quantload.cli.main")
PROFILES = {"tiny": "ci", "smollm2-135m": "quick"}
SERVER_PORT, NO_DELAY_PORT, DELAY_PORT = 8083, 8100, 8120
MAX_TOKENS = 4  # TTFT is what is measured: short answers keep the rounds short
TIMEOUT_S = 1800.0


def _prepare(model: str, folder: Path, env: dict[str, str]) -> Path:
    subprocess.run([*QUANTLOAD, "prepare", "--model", model, "--out", str(folder)], env=env, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    manifest = json.loads((folder / "manifest.json").read_text())
    return folder / str(manifest["files"]["Q4_K_M"]["file"])


def measure(
    model: str, rtt_ms: float, prompts: int, rounds: int, base: Path
) -> list[dict[str, float | str]]:
    toolchain = find_toolchain(ToolchainSettings(), os.environ)
    if toolchain is None:
        raise SystemExit("llama.cpp tools not built: run `quantload toolchain` first")
    profile = PROFILES[model]
    env = {**clean_env(), "QUANTLOAD_RUN__PROFILE": profile, "PYTHONUNBUFFERED": "1"}
    model_path = _prepare(model, base / "models", env)
    server_settings = profile_settings(profile, base).server
    out = base / "run"
    with netns_hosts.host_network(("server", "relay", "control")) as network:
        server, relay = network["server"], network["relay"]
        spec = ServerSpec(model_path=model_path, alias=f"{model}-Q4_K_M", slots=server_settings.slots,
                          ctx_per_slot=server_settings.ctx_per_slot, host=server.address)  # fmt: skip
        command = spec.command(toolchain.path("llama-server"), SERVER_PORT)
        network.spawn("server", command, base / "llama-server.log")
        for port, delay in ((NO_DELAY_PORT, 0.0), (DELAY_PORT, rtt_ms)):
            network.spawn("relay", [
                sys.executable, str(RELAY), "--listen", f"{relay.address}:{port}",
                "--to", f"{server.address}:{SERVER_PORT}", "--rtt-ms", f"{delay:g}",
            ], base / f"relay-{port}.log")  # fmt: skip
        network.wait_listening("control", server.address, SERVER_PORT, 300)
        for port in (NO_DELAY_PORT, DELAY_PORT):
            network.wait_listening("control", relay.address, port, 30)
        targets = [
            (server.url(SERVER_PORT), "direct", "direct"),
            (relay.url(NO_DELAY_PORT), "relay-0ms", "relay-0ms"),
            (relay.url(DELAY_PORT), f"relay-{rtt_ms:g}ms", f"relay-{rtt_ms:g}ms"),
        ]
        for round_index in range(rounds):  # the paths take turns, so drift in the machine hits all alike
            order = targets[round_index % 3 :] + targets[: round_index % 3]
            print(f"{model}: round {round_index + 1} of {rounds}", flush=True)
            load = [
                *QUANTLOAD, "load", "--model", model, "-e", "sweep", "--users", "1", "--workers", "0",
                "--prompt-count", str(prompts), "--repeats", "1", "--max-tokens", str(MAX_TOKENS),
                "--metrics-port", "0", "--out", str(out),
            ]  # fmt: skip
            for url, name, label in order:
                load += ["--url", url, "--name", name, "--quant", label]
            loaded = network.run("control", load, TIMEOUT_S, env=env)
            if loaded.returncode != 0:
                raise SystemExit(f"quantload load failed: {loaded.stderr[-3000:]}")
        report = network.run("control", [*QUANTLOAD, "report", str(out)], TIMEOUT_S, env=env)
        if report.returncode != 0:
            raise SystemExit(f"quantload report failed: {report.stderr[-3000:]}")
    rows: list[dict[str, float | str]] = json.loads((out / "summary.json").read_text())["ttft_split"]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--models", default="tiny,smollm2-135m")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--prompts", type=int, default=40, help="requests per path and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three paths, in turn")
    args = parser.parse_args()
    reason = netns_hosts.unavailable()
    if reason:
        raise SystemExit(reason)
    netns_hosts.interrupt_on_sigterm()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
    figure = REPO / "benchmarks" / "figures" / f"network-delay-{stamp}.md"
    header = [
        "| model | path | requests | TTFT p50 ms | prefill p50 ms | queueing+network p50 ms"
        " | queueing+network p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(header), flush=True)
    done: list[tuple[list[str], str, str]] = []  # each model's rows, verdict, load averages
    for model in args.models.split(","):
        before = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="quantload-delay-bench-") as scratch:
            measured = measure(model, args.rtt_ms, args.prompts, args.rounds, Path(scratch))
        rows = {str(row["quant"]): row for row in measured}
        lines = [
            f"| {model} | {label} | {row['requests']} | {float(row['ttft_p50_s']) * 1000:.2f} |"
            f" {float(row['prefill_p50_s']) * 1000:.2f} |"
            f" {float(row['queue_network_p50_s']) * 1000:.2f} |"
            f" {float(row['queue_network_p99_s']) * 1000:.2f} |"
            for label, row in rows.items()
        ]
        delayed, undelayed, direct = rows[f"relay-{args.rtt_ms:g}ms"], rows["relay-0ms"], rows["direct"]
        moved_ms = (float(delayed["queue_network_p50_s"]) - float(undelayed["queue_network_p50_s"])) * 1000
        prefill_ms = (float(delayed["prefill_p50_s"]) - float(undelayed["prefill_p50_s"])) * 1000
        relay_ms = (float(undelayed["queue_network_p50_s"]) - float(direct["queue_network_p50_s"])) * 1000
        within = abs(moved_ms - args.rtt_ms) <= 2.0
        verdict = (
            f"{model}: with {args.rtt_ms:g} ms added the network part moved {moved_ms:+.2f} ms at p50"
            f" ({'within' if within else 'NOT within'} 2 ms of the delay), the prefill {prefill_ms:+.2f} ms;"
            f" the relay itself costs {relay_ms:+.2f} ms against the direct path"
        )
        loads = f"{model}: load average {before:.2f} before, {os.getloadavg()[0]:.2f} after"
        done.append((lines, verdict, loads))
        print("\n".join([*lines, verdict, loads]), flush=True)
        # each model's rows as soon as they are measured: a later model that fails keeps them
        table = [*header, *[line for lines_, _, _ in done for line in lines_]]
        notes = [line for _, verdict_, loads_ in done for line in (verdict_, loads_)]
        text = "\n".join([*table, "", *notes])
        figure.write_text(f"# TTFT split with added delay ({stamp})\n\n`{' '.join(sys.argv)}`\n\n{text}\n")
    print(f"written to {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
