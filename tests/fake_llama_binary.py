"""A stand-in `llama-server` binary for process tests: a small Python script that answers
`/health` on the `--host`/`--port` it is given, and the two-line shell wrapper people put in front
of the real binary (setting LD_LIBRARY_PATH, then running it as a child of the shell).

Behaviour is chosen by the environment the test gives quantload: `FAKE_LLAMA_PIDS` (a file each
server appends its pid to, so a test can find the wrapper's child), `FAKE_LLAMA_HANG=1` (never
listen: a start that times out), `FAKE_LLAMA_REFUSE=FLAG` (exit 1 at once, as llama-server does
on an argument it rejects, when FLAG is among its arguments). Test-only.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

from quantload.llamacpp.toolchain import Toolchain

SERVER_SOURCE = """\
import os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
refused = os.environ.get("FAKE_LLAMA_REFUSE")
if refused and refused in args:
    print(f"error: invalid argument: {refused}", flush=True)
    sys.exit(1)
pids = os.environ.get("FAKE_LLAMA_PIDS")
if pids:
    with open(pids, "a") as handle:
        handle.write(f"{os.getpid()}\\n")
if os.environ.get("FAKE_LLAMA_HANG") == "1":
    time.sleep(600)
host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
port = int(args[args.index("--port") + 1])


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_):
        pass


print("main: server is listening", flush=True)
ThreadingHTTPServer((host, port), Health).serve_forever()
"""

WRAPPER = """#!/bin/sh
export LD_LIBRARY_PATH="$(dirname "$0")/lib"
"{python}" "$(dirname "$0")/real-llama-server.py" "$@"; exit $?
"""


def _executable(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def wrapped_llama_server(folder: Path) -> Toolchain:
    """A toolchain whose `llama-server` is a shell wrapper running the stand-in as its child."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "real-llama-server.py").write_text(SERVER_SOURCE, encoding="utf-8")
    wrapper = _executable(folder / "llama-server", WRAPPER.replace("{python}", sys.executable))
    return Toolchain(tools={"llama-server": wrapper}, origin="QUANTLOAD_LLAMA_BIN", binary_version="fake")


def server_pids(path: Path) -> list[int]:
    """The pids the stand-in servers wrote (the wrapper's children)."""
    if not path.is_file():
        return []
    return [int(line) for line in path.read_text().split()]


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_written(path: Path, count: int, timeout_s: float = 10.0) -> list[int]:
    """The pids of `path` once it holds `count` of them."""
    deadline = time.monotonic() + timeout_s
    while len(server_pids(path)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return server_pids(path)


def kill_left(pids: list[int]) -> None:
    """End whatever a failed test left running."""
    for pid in pids:
        if running(pid):
            os.kill(pid, 9)
