"""One model split over 1, 2 and 3 hosts, with the links limited by `tbf` at two rates (issue 38).

    .venv/bin/python benchmarks/rpc_split_netns.py [--model smollm2-135m] [--rates-mbit 100,10]
        [--users 1,4] [--prompts 8] [--max-tokens 32]                                    # as root

Hosts in network namespaces (tests/netns_hosts.py): `head` and the workers `w1`, `w2`, each running
`quantload rpc-server`. The model (its Q4_K_M, made by `quantload prepare`) is served by a
llama-server on the head (tests/rpc_split_driver.py, as `quantload run` starts it with server.rpc):

  1 host         the llama-server alone, no RPC
  1 host, RPC    every layer on the head's own rpc-server over loopback: the RPC backend's own cost
  2 hosts        the layers split between the head's rpc-server and w1's
  3 hosts        split between the head's, w1's and w2's

Each split runs with the links unlimited and limited to each rate: a `tbf` on every host's eth0
(what it sends), put on after the weights went over the links (the driver waits for it). At each
--users level the sweep (closed loop, prompt cache off, fixed-length answers) gives TTFT and TPOT
p50/p99 and the output tokens/s of all users; the server's timings give the median request's prompt
and decode tokens/s. Prints and writes (benchmarks/figures/rpc-split-*.md and .json) the table with
the load average before and after. Every host, link and qdisc is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the hosts and the driver are test code
import netns_hosts  # noqa: E402
from quantload.config import ToolchainSettings  # noqa: E402
from quantload.llamacpp.rpc_server import status_port  # noqa: E402
from quantload.llamacpp.toolchain import find_toolchain  # noqa: E402

DRIVER = REPO / "tests" / "rpc_split_driver.py"
QUANTLOAD = (sys.executable, "-m", "quantload.cli.main")
RPC_PORT = 50052
RUN_TIMEOUT_S = 1200.0


def _prepare(model: str, folder: Path) -> Path:
    subprocess.run([*QUANTLOAD, "prepare", "--model", model, "--quants", "Q4_K_M", "--out", str(folder)],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    manifest = json.loads((folder / "manifest.json").read_text())
    return folder / str(manifest["files"]["Q4_K_M"]["file"])


def _run_split(
    network: netns_hosts.HostNetwork, hosts: list[str], rate_mbit: float | None, model: Path, bins: Path,
    args: argparse.Namespace, out: Path, rpc: bool,
) -> dict[str, Any]:  # fmt: skip
    """One configuration: the driver on the head, the links limited once the weights are over."""
    endpoints = [f"{network[h].address}:{RPC_PORT}" for h in hosts] if rpc else []
    flag = out / "go"
    command = [
        sys.executable, str(DRIVER), "--model", str(model), "--rpc", ",".join(endpoints), "--out", str(out),
        "--llama-bin", str(bins), "--users", args.users, "--prompts", str(args.prompts),
        "--max-tokens", str(args.max_tokens), "--threads", str(args.threads), "--lost-after-s", "60",
        "--stage-timeout-s", "900", "--request-timeout-s", str(args.request_timeout_s),
        "--wait-for", str(flag),
    ]  # fmt: skip
    log = out / "driver.log"
    shutil.rmtree(out, ignore_errors=True)  # an earlier run's log and records would be read as this one's
    out.mkdir(parents=True)
    driver = network.spawn("head", command, log)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while '"event": "ready"' not in log.read_text():
        if driver.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the driver did not get ready: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    limited = [h for h in hosts if rpc] if rate_mbit else []
    for host in limited:
        kbit = int(rate_mbit * 1000)
        network.limit_rate(host, kbit, burst_bytes=max(1600, kbit * 125 // 100))
    try:
        flag.touch()
        driver.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for host in limited:
            network.clear_limit(host)
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    done = next(x for x in lines if x.get("event") == "done")
    return done


def _row(name: str, rate: str, done: dict[str, Any], users: list[int]) -> dict[str, Any]:
    by_users = {s["users"]: s for s in done["summaries"]}
    row: dict[str, Any] = {"configuration": name, "link": rate, "ready_s": done.get("ready_s")}
    for u in users:
        stage = by_users.get(u, {})
        rates = done["server_rates"].get(str(u), done["server_rates"].get(u, {}))
        row[u] = {
            "status": stage.get("status"),
            "ttft_p50_ms": _ms(stage.get("ttft_p50_s")), "ttft_p99_ms": _ms(stage.get("ttft_p99_s")),
            "tpot_p50_ms": _ms(stage.get("tpot_p50_s")), "tpot_p99_ms": _ms(stage.get("tpot_p99_s")),
            "output_tok_s": stage.get("output_tok_s"),
            "prefill_tok_s": rates.get("prompt_per_second"),
            "decode_tok_s": rates.get("predicted_per_second"),
        }  # fmt: skip
    return row


def _median_row(rows: list[dict[str, Any]], users: list[int]) -> dict[str, Any]:
    """One configuration over the rounds: each figure's median over the rounds that measured it,
    the status of each round ("ok" only when every round's was)."""
    merged: dict[str, Any] = {"configuration": rows[0]["configuration"], "link": rows[0]["link"]}
    for u in users:
        statuses = {row[u]["status"] for row in rows}
        status = "ok" if statuses == {"ok"} else "/".join(sorted(map(str, statuses)))
        figures: dict[str, Any] = {"status": status}
        for key in rows[0][u]:
            if key != "status":
                found = [row[u][key] for row in rows if row[u][key] is not None]
                figures[key] = statistics.median(found) if found else None
        merged[u] = figures
    return merged


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _table(rows: list[dict[str, Any]], users: list[int]) -> list[str]:
    head = ["configuration", "link"]
    for u in users:
        head += [f"{u}u prefill tok/s", f"{u}u decode tok/s", f"{u}u output tok/s", f"{u}u TTFT p50/p99 ms",
                 f"{u}u TPOT p50/p99 ms"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["configuration"], row["link"]]
        for u in users:
            m = row[u]
            cells += [
                _cell(m["prefill_tok_s"]), _cell(m["decode_tok_s"]), _cell(m["output_tok_s"]),
                f"{_cell(m['ttft_p50_ms'], 0)} / {_cell(m['ttft_p99_ms'], 0)}",
                f"{_cell(m['tpot_p50_ms'], 1)} / {_cell(m['tpot_p99_ms'], 1)}",
            ]  # fmt: skip
            if m["status"] != "ok":
                cells[-1] += f" ({m['status']})"
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _loadavg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rates-mbit", default="100,10")
    parser.add_argument("--users", default="1,4")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    # one thread: two threads on two cores other processes also use stall each other at every
    # barrier (a request's decode swung from 110 to 4 tokens/s between requests of one stage)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="every configuration this often; medians shown")
    parser.add_argument("--request-timeout-s", type=float, default=60.0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/quantload-rpc-split"))
    args = parser.parse_args()
    reason = netns_hosts.unavailable()
    if reason:
        raise SystemExit(reason)
    llama_bin = os.environ.get("QUANTLOAD_LLAMA_BIN")
    chosen = ToolchainSettings(llama_bin=Path(llama_bin) if llama_bin else None)
    toolchain = find_toolchain(chosen, os.environ)
    if toolchain is None or "ggml-rpc-server" not in toolchain.tools:
        raise SystemExit("llama.cpp with ggml-rpc-server not built: run `quantload toolchain` first")
    bins = toolchain.path("llama-server").parent
    users = [int(u) for u in args.users.split(",")]
    rates = [float(r) for r in args.rates_mbit.split(",")]
    model = _prepare(args.model, args.work / "models")
    before, started = _loadavg(), time.monotonic()
    rows: list[dict[str, Any]] = []
    netns_hosts.interrupt_on_sigterm()
    env = {**os.environ, "QUANTLOAD_LLAMA_BIN": str(bins)}
    with netns_hosts.host_network(["head", "w1", "w2"]) as network:
        for host in ("head", "w1", "w2"):
            address = network[host].address
            network.spawn(host, [*QUANTLOAD, "rpc-server", "--host", address, "--port", str(RPC_PORT),
                                 "--threads", str(args.threads), "--log", str(args.work / f"rpc-{host}.log")],
                          args.work / f"rpc-cli-{host}.log", env=env)  # fmt: skip
            network.wait_listening("head", address, status_port(RPC_PORT), 60)
        plan: list[tuple[str, list[str], bool, float | None]] = [
            ("1 host", ["head"], False, None), ("1 host, RPC", ["head"], True, None),
        ]
        for name, hosts in (("2 hosts", ["head", "w1"]), ("3 hosts", ["head", "w1", "w2"])):
            plan += [(name, hosts, True, None), *((name, hosts, True, rate) for rate in rates)]
        by_config: dict[int, list[dict[str, Any]]] = {}
        for round_index in range(args.rounds):  # each configuration once a round, the order reversed
            order = list(enumerate(plan))
            for index, (name, hosts, rpc, rate) in order[:: -1 if round_index % 2 else 1]:
                link = "-" if not rpc or len(hosts) == 1 else (f"{rate:g} Mbit/s" if rate else "unlimited")
                print(f"round {round_index + 1}: {name}, link {link} (load {_loadavg()}) ...", flush=True)
                done = _run_split(network, hosts, rate if len(hosts) > 1 else None, model, bins, args,
                                  args.work / f"run-{round_index}-{index}", rpc)  # fmt: skip
                by_config.setdefault(index, []).append(_row(name, link, done, users))
        rows = [_median_row(by_config[index], users) for index in sorted(by_config)]
    after = _loadavg()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
    command = " ".join(["benchmarks/rpc_split_netns.py", *sys.argv[1:]])
    text = "\n".join([
        f"# One model split over hosts ({stamp})",
        "",
        f"Command (as root): `.venv/bin/python {command}`; {model.name}; llama-server `-t {args.threads}`,"
        f" `-np {max(users)}`, 1,024-token slots, every layer on the RPC hosts (`-ngl all`); rpc-servers"
        f" `-t {args.threads}`; sweep of {args.prompts} prompts per level, {args.max_tokens} output tokens"
        f" each, prompt cache off, requests cut at {args.request_timeout_s:g} s; {args.rounds} round(s),"
        " every configuration once a round (the order reversed each round), medians shown. Every host"
        " is a network namespace of this one 2-core machine, so the hosts share its cores: the split"
        " adds no compute, only the RPC round trips and the link."
        f" Load average (1/5/15 min) before {before}, after {after}; {time.monotonic() - started:.0f} s.",
        "",
        *_table(rows, users),
        "",
    ]) + "\n"  # fmt: skip
    print(text)
    figures = REPO / "benchmarks" / "figures"
    (figures / f"rpc-split-{stamp}.md").write_text(text)
    (figures / f"rpc-split-{stamp}.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
