"""Client accuracy across hosts: `quantload calibrate` against a fake on another host (issue 24).

    .venv/bin/python benchmarks/calibrate_hosts.py [--streams 1,8,64,256]   # as root

Two hosts in network namespaces: `fake` runs `quantload calibrate --serve-fake <its address>:8090`,
`client` runs `quantload calibrate --fake-url http://<fake>:8090`; then the same calibration on
this machine's loopback (the fake started by calibrate itself), for comparison. Prints both
tables (TTFT and ITL error p50/p99 per stream count, client CPU, the verdict) and writes them to
benchmarks/figures/. Across hosts the TTFT error also holds the first token's way back over the
veth link and bridge (the request's way there is taken out with the fake's receive time: the
namespaces share one clock).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the hosts are test code
import netns_hosts  # noqa: E402
from support import clean_env  # noqa: E402

QUANTLOAD = (sys.executable, "-m", "quantload.cli.main")
FAKE_PORT = 8090
TIMEOUT_S = 1200.0


def _ms(value: Any) -> str:
    return "-" if value is None else f"{float(value) * 1000:.2f}"


def table(title: str, result: dict[str, Any]) -> list[str]:
    lines = [
        f"{title}: {result['cores']} cores, load average {result['load_average_before']:.2f} before,"
        f" {result['load_average_after']:.2f} after; trusted up to {result['trusted_streams']} streams",
        "",
        "| streams | ok | TTFT err p50 ms | TTFT err p99 ms | ITL err p50 ms | ITL err p99 ms"
        " | CPU % core/100 streams |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for count in result["counts"]:
        cpu = count["client_cpu_per_100_streams"]
        lines.append(
            f"| {count['streams']} | {count['ok']}/{count['requests']} | {_ms(count['ttft_error_p50_s'])} |"
            f" {_ms(count['ttft_error_p99_s'])} | {_ms(count['itl_error_p50_s'])} |"
            f" {_ms(count['itl_error_p99_s'])} | {'-' if cpu is None else f'{100 * cpu:.0f}'} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--streams", default="1,8,64,256")
    parser.add_argument("--seconds", default="5")
    args = parser.parse_args()
    reason = netns_hosts.unavailable()
    if reason:
        raise SystemExit(reason)
    netns_hosts.interrupt_on_sigterm()
    env = clean_env()
    common = ["--streams", args.streams, "--seconds", args.seconds, "--json"]
    with tempfile.TemporaryDirectory(prefix="quantload-calibrate-hosts-") as scratch:
        folder = Path(scratch)
        with netns_hosts.host_network(("fake", "client")) as network:
            fake = network["fake"]
            network.spawn("fake", [*QUANTLOAD, "calibrate", "--serve-fake", f"{fake.address}:{FAKE_PORT}"],
                          folder / "fake.log", env=env)  # fmt: skip
            network.wait_listening("client", fake.address, FAKE_PORT, 60)
            client = [*QUANTLOAD, "calibrate", "--fake-url", fake.url(FAKE_PORT), *common]
            remote = network.run("client", [*client, "--out", str(folder / "hosts")], TIMEOUT_S, env=env)
        if remote.returncode != 0:
            raise SystemExit(f"calibrate across hosts failed: {remote.stderr[-3000:]}")
        local = subprocess.run(
            [*QUANTLOAD, "calibrate", *common, "--out", str(folder / "loopback")],
            env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=True,
        )  # fmt: skip
    across, here = json.loads(remote.stdout), json.loads(local.stdout)
    text = "\n".join([
        *table(f"across hosts (fake at {across['fake_url']})", across), "",
        *table("loopback (the fake on this host)", here),
    ])  # fmt: skip
    print(text)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
    figure = REPO / "benchmarks" / "figures" / f"calibrate-hosts-{stamp}.md"
    figure.write_text(f"# quantload calibrate across hosts ({stamp})\n\n`{' '.join(sys.argv)}`\n\n{text}\n")
    print(f"written to {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
