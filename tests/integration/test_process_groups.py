"""Every child quantload starts leads a process group of its own and is stopped as a group: a
two-line wrapper script given as `llama-server` (how people set LD_LIBRARY_PATH) leaves no server
behind after a stop, a restart, a start that timed out, the wrapper's own exit, or quantload's
exit; a stop waits for every process it signalled; a stop signal during a start is held until the
child's handle is kept. And a server variant that fails to start is replaced by the configured
server (stack/server_variants.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fake_llama_binary import kill_left, running, server_pids, wait_written, wrapped_llama_server
from quantload.childproc import group_members, start_child, stop_group
from quantload.errors import ServerError
from quantload.experiments.base import ServerFlags
from quantload.llamacpp.server import LlamaServer, ServerSpec, port_is_free
from quantload.load.supervisor import _stop as stop_load_processes
from quantload.served import ServedTarget
from quantload.stack.server_variants import ServerVariants

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]


@pytest.fixture
def pids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "pids"
    monkeypatch.setenv("FAKE_LLAMA_PIDS", str(path))
    yield path
    kill_left(server_pids(path))


def _server(tmp_path: Path, timeout_s: float = 20.0) -> LlamaServer:
    toolchain = wrapped_llama_server(tmp_path / "bin")
    spec = ServerSpec(model_path=tmp_path / "m.gguf", alias="m")
    return LlamaServer(toolchain, spec, tmp_path / "logs" / "llama-server.log", timeout_s)


def test_a_stop_ends_the_wrappers_server_and_frees_its_port(tmp_path: Path, pids: Path) -> None:
    server = _server(tmp_path).start()
    (child,) = wait_written(pids, 1)
    assert running(child) and child != server.pid  # the wrapper's child, not the wrapper
    server.stop()
    assert not running(child)
    assert port_is_free("127.0.0.1", server.port)
    assert group_members(server.pid or 0) == []


def test_a_restart_leaves_one_server_only(tmp_path: Path, pids: Path) -> None:
    server = _server(tmp_path).start()
    server.stop()
    server.start()
    first, second = wait_written(pids, 2)
    assert not running(first) and running(second)
    server.stop()
    assert not running(second)


def test_a_start_that_times_out_leaves_nothing(
    tmp_path: Path, pids: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_HANG", "1")
    server = _server(tmp_path, timeout_s=1.0)
    with pytest.raises(ServerError, match="did not become ready"):
        server.start()
    (child,) = wait_written(pids, 1)
    assert not running(child)


def test_what_an_exited_wrapper_left_running_is_stopped_with_its_group(tmp_path: Path) -> None:
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(f'#!/bin/sh\n"{sys.executable}" -c "import time; time.sleep(60)" &\necho $! > "$1"\n')
    wrapper.chmod(0o755)
    pid_file = tmp_path / "left"
    process = start_child([str(wrapper), str(pid_file)])
    assert process.wait(timeout=10) == 0  # the wrapper ended; its child runs on in its group
    (left,) = wait_written(pid_file, 1)
    try:
        assert running(left)
        stop_group(process)
        assert not running(left)
    finally:
        kill_left([left])


def test_quantloads_exit_takes_the_wrappers_server_along(tmp_path: Path, pids: Path) -> None:
    wrapped_llama_server(tmp_path / "bin")
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        from fake_llama_binary import wrapped_llama_server
        from quantload.llamacpp.server import LlamaServer, ServerSpec

        toolchain = wrapped_llama_server(Path({str(tmp_path / "bin")!r}))
        spec = ServerSpec(model_path=Path("m.gguf"), alias="m")
        with LlamaServer(toolchain, spec, Path({str(tmp_path / "q.log")!r})):
            print("serving", flush=True)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "serving" in done.stdout, done.stderr[-2000:]
    (child,) = server_pids(pids)
    assert not running(child)


def test_a_stop_waits_for_every_load_process_it_signalled(tmp_path: Path) -> None:
    slow_to_end = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.4), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    processes = [
        start_child([sys.executable, "-c", slow_to_end], stdout=subprocess.PIPE) for _ in range(2)
    ]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    started = time.monotonic()
    stop_load_processes(processes)
    assert all(process.returncode == 0 for process in processes)
    assert all(group_members(process.pid) == [] for process in processes)
    assert time.monotonic() - started < 5  # signalled together, not one grace after another


def test_a_stop_signal_during_a_start_is_held_until_the_handle_is_kept() -> None:
    kept: list[subprocess.Popen[bytes]] = []

    def keep(process: subprocess.Popen[bytes]) -> None:
        kept.append(process)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the child starts

    with pytest.raises(KeyboardInterrupt):
        start_child([sys.executable, "-c", "import time; time.sleep(60)"], keep)
    (process,) = kept
    blocked = next(
        line for line in Path(f"/proc/{process.pid}/status").read_text().splitlines() if line.startswith("SigBlk")
    )
    assert int(blocked.split()[1], 16) == 0  # the child does not inherit the held signals
    assert stop_group(process, grace_s=5) == -signal.SIGTERM


def test_a_variant_that_fails_to_start_is_replaced_by_the_configured_server(
    tmp_path: Path, pids: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_REFUSE", "-nocb")
    server = _server(tmp_path).start()
    configured, port = server.spec, server.port
    target = ServedTarget(name="llama-q8_0", quant="Q8_0", model="m", url=server.url)
    variants = ServerVariants(server, target, server.toolchain, tmp_path / "logs", in_place=True)
    try:
        with pytest.raises(ServerError, match="did not become ready"), variants.variant(
            ServerFlags(slots=2, extra_args=("-nocb",), label="static")
        ):
            raise AssertionError("a variant that did not start is never yielded")
        assert server.alive() and server.port == port
        assert (server.spec.slots, server.spec.extra_args) == (configured.slots, ())  # not the variant's
        with variants.variant(ServerFlags(slots=4, label="np4")) as variant:
            assert "-np 4" in variant.startup_log.splitlines()[0]
        assert (server.spec.slots, server.spec.extra_args) == (configured.slots, ()) and server.alive()
    finally:
        server.stop()
