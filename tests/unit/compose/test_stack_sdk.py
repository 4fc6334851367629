"""quantload.compose (what `quantload stack ps` and `quantload stack kv` do) against a fake engine.

The fake answers the few SDK calls the package makes (inspect attributes, logs, the archive
endpoint's HEAD and GET) from files in memory; the real engine is exercised by
tests/e2e/test_compose_stack.py.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantload.cli.main import main
from quantload.compose import containers as containers_module
from quantload.compose.containers import ContainerState, default_project_name
from quantload.compose.server_kv import (
    FIRST_READ_BYTES,
    check_servers,
    container_launch,
    is_llama_server,
    read_container_gguf,
    run_folder_of,
    server_launch,
)
from quantload.errors import ServerError
from quantload.kvcache import kv_shape_from_gguf, predict_kv
from quantload.models.gguf_meta import read_gguf

SERVER_CMD = [
    "--host",
    "0.0.0.0",
    "--port",
    "8080",
    "-np",
    "4",
    "-c",
    "8192",
    "-no-kvu",
    "--metrics",
    "-lv",
    "4",
]
SERVER_ENV = [
    "LLAMA_ARG_MODEL=/models/Q8_0.gguf",
    "LLAMA_ARG_LOG_FILE=/results/e2e/logs/llama-server-Q8_0.log",
]


def write_gguf(path: Path, file_type: int, tensor_mib: int = 10) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_file_type(file_type)
    writer.add_block_count(2)
    writer.add_embedding_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_context_length(4096)
    writer.add_tensor("big.weight", np.zeros((tensor_mib * 1024, 256), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class CountingStream(io.BytesIO):
    """A response body that counts what was read from it."""

    def __init__(self, data: bytes, sink: list[int]) -> None:
        super().__init__(data)
        self.sink = sink

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.sink.append(len(chunk))
        return chunk


class FakeResponse:
    def __init__(self, status: int, headers: dict[str, str] | None = None, body: io.BytesIO | None = None):
        self.status_code = status
        self.headers = headers or {}
        self.raw = body
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeApi:
    """The archive endpoint of one fake container: HEAD gives the stat, GET a tar of one file."""

    base_url = "http+docker://localhost"
    api_version = "1.41"

    def __init__(self, files: dict[str, bytes | str]) -> None:
        self.files = files  # path -> content, or the target of a symbolic link
        self.read: list[int] = []
        self.responses: list[FakeResponse] = []

    def head(self, url: str, params: dict[str, str]) -> FakeResponse:
        entry = self.files.get(params["path"])
        if entry is None:
            return FakeResponse(404)
        stat = {"name": Path(params["path"]).name, "size": len(entry) if isinstance(entry, bytes) else 0,
                "linkTarget": entry if isinstance(entry, str) else ""}  # fmt: skip
        header = base64.urlsafe_b64encode(json.dumps(stat).encode()).decode()
        return FakeResponse(200, {"X-Docker-Container-Path-Stat": header})

    def get(self, url: str, params: dict[str, str], stream: bool, headers: dict[str, str]) -> FakeResponse:
        data = self.files[params["path"]]
        assert isinstance(data, bytes), "the package should have followed the link"
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(Path(params["path"]).name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        response = FakeResponse(200, body=CountingStream(archive.getvalue(), self.read))
        self.responses.append(response)
        return response


class FakeClient:
    def __init__(self, api: FakeApi) -> None:
        self.api = api


class FakeContainer:
    def __init__(
        self, name: str, attrs: dict[str, Any], files: dict[str, bytes | str], log: str = ""
    ) -> None:
        self.id = f"id-{name}"
        self.name = name
        self.attrs = attrs
        self.client = FakeClient(FakeApi(files))
        self.log = log
        self.log_since: list[Any] = []

    def logs(self, stdout: bool = True, stderr: bool = True, since: Any = None, tail: Any = None) -> bytes:
        self.log_since.append(since)
        return self.log.encode()


def attrs(service: str, *, status: str = "running", health: str | None = "healthy", exit_code: int = 0,
          restarts: int = 0, policy: str = "unless-stopped", cmd: list[str] | None = None,
          env: list[str] | None = None, entrypoint: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    state: dict[str, Any] = {"Status": status, "ExitCode": exit_code, "OOMKilled": False,
                             "StartedAt": "2026-12-01T10:00:00.123456789Z"}  # fmt: skip
    if health:
        state["Health"] = {"Status": health, "Log": [{"Output": "curl: (7) Failed to connect\n"}]}
    return {
        "Name": f"/proj_{service}_1",
        "State": state,
        "RestartCount": restarts,
        "HostConfig": {"RestartPolicy": {"Name": policy}},
        "Config": {
            "Labels": {"com.docker.compose.service": service, "com.docker.compose.project": "proj"},
            "Image": "img",
            "Entrypoint": entrypoint,
            "Cmd": cmd or [],
            "Env": env or [],
        },
        "NetworkSettings": {"Ports": {"8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8081"}]}},
    }


def server(tmp_path: Path, name: str = "llama-q8-0", file_type: int = 7, log: str | None = None,
           **state: Any) -> FakeContainer:  # fmt: skip
    model = write_gguf(tmp_path / f"tiny-{name}.gguf", file_type).read_bytes()
    shape = kv_shape_from_gguf(read_gguf(tmp_path / f"tiny-{name}.gguf"))
    mib = predict_kv(shape, 4, 2048).total_mib
    kv_line = (
        f"llama_kv_cache: size = {mib:7.2f} MiB (  2048 cells,   2 layers,  4/4 seqs),"
        f" K (f16): {mib / 2:7.2f} MiB, V (f16): {mib / 2:7.2f} MiB\n"
    )
    text = log if log is not None else "build: 0 (unknown) with GNU 12.2.0 for Linux x86_64\n" + kv_line
    files: dict[str, bytes | str] = {
        "/models/Q8_0.gguf": f"tiny-{name}.gguf",
        f"/models/tiny-{name}.gguf": model,
    }
    return FakeContainer(name, attrs(name, cmd=SERVER_CMD, env=SERVER_ENV, entrypoint=["/app/llama-server"],
                                     **state), files, text)  # fmt: skip


# ---------------------------------------------------------------- containers and their state


def test_states_in_words() -> None:
    healthy = ContainerState.from_attrs(attrs("llama-f16"))
    assert (healthy.service, healthy.name, healthy.ready, healthy.problem()) == (
        "llama-f16",
        "proj_llama-f16_1",
        True,
        None,
    )
    assert healthy.ports == ("127.0.0.1:8081->8080/tcp",) and healthy.status_text() == "running, healthy"
    job = ContainerState.from_attrs(attrs("prepare", status="exited", health=None, policy=""))
    assert job.ready and job.problem() is None and job.status_text() == "exited 0"
    failed = ContainerState.from_attrs(attrs("prepare", status="exited", health=None, policy="", exit_code=2))
    assert not failed.ready and failed.problem() == "exited with code 2"
    killed = ContainerState.from_attrs(
        attrs("llama-q8-0", status="exited", exit_code=137, health="unhealthy")
    )
    assert killed.problem() == "exited with code 137 (killed by signal 9, SIGKILL)"
    stopped = ContainerState.from_attrs(attrs("exporter", status="exited", health=None))
    assert "should stay up" in (stopped.problem() or "")
    sick = ContainerState.from_attrs(attrs("llama-f16", health="unhealthy"))
    assert sick.problem() == "unhealthy: curl: (7) Failed to connect"
    starting = ContainerState.from_attrs(attrs("llama-f16", health="starting"))
    assert starting.problem() is None and not starting.ready
    looping = ContainerState.from_attrs(attrs("llama-f16", status="restarting", exit_code=1, restarts=3))
    assert looping.problem() == "restarting after exit code 1 (restarted 3 times)"
    came_back = ContainerState.from_attrs(attrs("llama-f16", restarts=1))
    assert came_back.status_text() == "running, healthy, restarted 1 time"


def test_the_project_name_follows_compose() -> None:
    assert default_project_name(Path("/src/My Quantload.v2"), {}) == "myquantloadv2"
    assert default_project_name(Path("/src/x"), {"COMPOSE_PROJECT_NAME": "ql"}) == "ql"


def test_an_unreachable_engine_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert main(["stack", "ps", "--project", "nothing"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the Docker engine at unix:///nonexistent/docker.sock" in err
    assert "set DOCKER_HOST" in err and "Traceback" not in err


# ---------------------------------------------------------------- the server's launch


def test_launch_from_flags_and_variables() -> None:
    launch = server_launch(SERVER_CMD, dict(item.split("=", 1) for item in SERVER_ENV))
    assert (launch.slots, launch.ctx_total, launch.ctx_per_slot, launch.unified) == (4, 8192, 2048, False)
    assert str(launch.model_path) == "/models/Q8_0.gguf" and (launch.cache_type_k, launch.cache_type_v) == (
        "f16",
        "f16",
    )
    flags_win = server_launch(["-m", "/m/a.gguf", "--parallel=2", "-c", "4096", "-kvu", "-ctk", "q8_0"],
                              {"LLAMA_ARG_N_PARALLEL": "8", "LLAMA_ARG_CACHE_TYPE_V": "q8_0"})  # fmt: skip
    assert (flags_win.slots, flags_win.unified, flags_win.cache_type_k, flags_win.cache_type_v) == (
        2,
        True,
        "q8_0",
        "q8_0",
    )
    with pytest.raises(ServerError, match="without -np"):
        server_launch(["-m", "/m/a.gguf", "-c", "4096"], {})
    with pytest.raises(ServerError, match="automatic sizes"):
        server_launch(["-m", "/m/a.gguf", "-np", "-1", "-c", "4096"], {})


def test_llama_servers_are_told_apart_by_their_program() -> None:
    assert is_llama_server(attrs("x", entrypoint=["/app/llama-server"]))
    assert is_llama_server(attrs("x", cmd=["llama-server", "-m", "m.gguf"]))
    assert not is_llama_server(attrs("x", cmd=["quantload", "exporter"]))
    assert not is_llama_server(attrs("x"))


# ---------------------------------------------------------------- the KV check from the container


def test_the_gguf_header_is_read_through_the_link_and_only_as_far_as_needed(tmp_path: Path) -> None:
    container = server(tmp_path)
    model = container.client.api.files["/models/tiny-llama-q8-0.gguf"]
    assert isinstance(model, bytes) and len(model) > 4 * FIRST_READ_BYTES
    summary = read_container_gguf(container, container_launch(container.attrs).model_path)
    assert (summary.file_type, summary.architecture, summary.size_bytes) == ("Q8_0", "qwen2", len(model))
    assert summary.path.name == "tiny-llama-q8-0.gguf"  # the link's target
    assert sum(container.client.api.read) <= FIRST_READ_BYTES + 64 * 1024
    assert all(response.closed for response in container.client.api.responses)


def test_a_server_is_checked_from_its_command_line_model_and_log(tmp_path: Path) -> None:
    container = server(tmp_path)
    (result,) = check_servers([(ContainerState.from_attrs(container.attrs), container)])
    assert result.error is None and result.check is not None
    assert result.label == "Q8_0" and result.check.diff_pct == 0.0
    assert result.check.prediction.slots == 4 and result.check.prediction.ctx_per_slot == 2048
    assert result.check.server_build == "0 (unknown) with GNU 12.2.0 for Linux x86_64"
    since = container.log_since[-1]
    assert since is not None and since.isoformat() == "2026-12-01T10:00:00+00:00"  # only since the last start
    assert str(run_folder_of(container)) == "/results/e2e"


def test_servers_that_cannot_be_checked_say_why(tmp_path: Path) -> None:
    quiet = server(tmp_path, "llama-f16", file_type=1, log="build: 0 (unknown)\n")  # started without -lv 4
    dead = server(tmp_path, "llama-q8-0", status="exited", exit_code=137, health=None)
    other = FakeContainer("exporter", attrs("exporter", cmd=["quantload", "exporter"]), {})
    pairs = [(ContainerState.from_attrs(c.attrs), c) for c in (quiet, dead, other)]
    results = {r.service: r for r in check_servers(pairs)}
    assert set(results) == {"llama-f16", "llama-q8-0"}
    assert results["llama-f16"].check is None and "-lv 4" in (results["llama-f16"].error or "")
    assert results["llama-f16"].error and results["llama-f16"].error.startswith("llama-f16:")
    assert results["llama-q8-0"].label == "Q8_0"  # read from the stopped container
    assert (
        results["llama-q8-0"].error
        == "llama-q8-0 died: its container exited with code 137 (killed by signal 9, SIGKILL)"
    )


def test_the_cli_needs_a_stack(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    class NoContainers:
        closed = False

        class containers:
            @staticmethod
            def list(all: bool, filters: dict[str, str]) -> list[Any]:
                return []

        def close(self) -> None:
            type(self).closed = True

    monkeypatch.setattr(containers_module.docker, "from_env", lambda **_: type("C", (), {
        "ping": lambda self: True, "containers": NoContainers.containers})())  # fmt: skip
    monkeypatch.setattr("quantload.cli.cmd_stack.connect", lambda environ: NoContainers())
    assert main(["stack", "kv", "--project", "empty"]) == 2
    assert "no llama-server containers in compose project 'empty'" in capsys.readouterr().err
    assert NoContainers.closed  # the engine client is closed when the command ends
