"""The devices a llama-server build sees besides the CPU, from its own `--list-devices`.

llama-server prints "Available devices:" and one line per device that is not the CPU,
`  NAME: DESCRIPTION (TOTAL MiB, FREE MiB free)`, or `  (none)` on a CPU-only build
(common/arg.cpp, common_print_available_devices). With `--rpc HOST:PORT,...` first, each
ggml-rpc-server's device is listed too (it connects to them to ask), so the same call says whether
the RPC hosts answer.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from quantload.errors import ServerError, ToolchainError
from quantload.llamacpp.toolchain import Toolchain

LIST_TIMEOUT_S = 30.0
HEADER = "Available devices:"
_DEVICE = re.compile(r"^\s+(\S+?):\s+(.*?)\s+\((\d+) MiB, (\d+) MiB free\)\s*$")


@dataclass(frozen=True)
class Device:
    """One device besides the CPU: its name (CUDA0, RPC0[10.0.0.2:50052], ...) and memory."""

    name: str
    description: str
    total_mib: int
    free_mib: int


def parse_devices(text: str) -> tuple[Device, ...] | None:
    """The devices `--list-devices` printed; None when the text has no device list at all."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == HEADER)
    except StopIteration:
        return None
    found = []
    for line in lines[start + 1 :]:
        match = _DEVICE.match(line)
        if match:
            found.append(Device(match[1], match[2], int(match[3]), int(match[4])))
    return tuple(found)


def list_devices(toolchain: Toolchain, rpc: Sequence[str] = ()) -> tuple[Device, ...]:
    """The devices this llama-server sees (with the RPC hosts `rpc` names), bounded in time.
    ServerError when an RPC host does not answer; ToolchainError when the list cannot be read."""
    binary = toolchain.path("llama-server")
    command = [str(binary), *(["--rpc", ",".join(rpc)] if rpc else []), "--list-devices"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=LIST_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ServerError(
            f"llama-server --list-devices did not answer within {LIST_TIMEOUT_S:g} s"
            + (f" (RPC hosts {', '.join(rpc)})" if rpc else ""),
            "check that every rpc-server is running and reachable",
        ) from None
    except OSError as error:
        raise ToolchainError(f"{binary} --list-devices did not run: {error}", "quantload toolchain") from None
    text = done.stdout + done.stderr
    devices = parse_devices(text)
    if done.returncode != 0 or devices is None:
        last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "no output")
        if rpc:
            raise ServerError(
                f"llama-server could not reach its RPC hosts {', '.join(rpc)}: {last[-200:]}",
                "start `quantload rpc-server` on each host, or fix server.rpc",
            )
        raise ToolchainError(f"{binary} --list-devices failed: {last[-200:]}", "rebuild: quantload toolchain")
    return devices
