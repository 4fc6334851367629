"""The KV-cache check of a llama-server container, read from the container through the SDK.

Everything comes from the container itself, so the check needs no files on the host:
- the layout (`-np`, `-c`, `-kvu`/`-no-kvu`, `-ctk`, `-ctv`, the model path) from its command line
  and `LLAMA_ARG_*` variables, exactly what llama-server was started with;
- the model's GGUF header, streamed out of the container (`get_archive`) only as far as the header
  reaches, so a multi-gigabyte file costs a few megabytes;
- the server's log since the container last started (`docker logs --since`), where llama-server
  prints `llama_kv_cache: size = ...` at `-lv 4`.
The prediction (quantload.kvcache) and the comparison (quantload.kvcheck) are the ones native mode
uses; the result is a `kv.json` in the run folder the servers write their logs to.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import IO, Any

import docker

from quantload.compose.containers import ContainerState
from quantload.errors import MeasurementError, ModelError, QuantloadError, ServerError
from quantload.kvcache import kv_shape_from_gguf, predict_kv
from quantload.kvcheck import KvCheck, kv_check_from_log, merge_kv_file
from quantload.models.gguf_meta import GgufSummary, summarize_scan
from quantload.models.gguf_scan import scan_gguf

SERVER_BINARY = "llama-server"
FIRST_READ_BYTES = 2 << 20  # the header of a small model; doubled until the header is complete
# Long and short spellings of the options that shape the KV cache, and their LLAMA_ARG_* variables.
_VALUE_OPTIONS = {
    "-np": "slots", "--parallel": "slots",
    "-c": "ctx", "--ctx-size": "ctx",
    "-ctk": "type_k", "--cache-type-k": "type_k",
    "-ctv": "type_v", "--cache-type-v": "type_v",
    "-m": "model", "--model": "model",
    "--log-file": "log_file",
}  # fmt: skip
_ENV_OPTIONS = {
    "LLAMA_ARG_N_PARALLEL": "slots",
    "LLAMA_ARG_CTX_SIZE": "ctx",
    "LLAMA_ARG_CACHE_TYPE_K": "type_k",
    "LLAMA_ARG_CACHE_TYPE_V": "type_v",
    "LLAMA_ARG_MODEL": "model",
    "LLAMA_ARG_LOG_FILE": "log_file",
}
_TRUE = ("1", "true", "on", "yes", "enabled")


@dataclass(frozen=True)
class ServerLaunch:
    """What shapes one llama-server's KV cache, as it was started."""

    model_path: PurePosixPath
    slots: int
    ctx_total: int
    unified: bool
    cache_type_k: str
    cache_type_v: str
    log_file: PurePosixPath | None

    @property
    def ctx_per_slot(self) -> int:
        return self.ctx_total // self.slots


def is_llama_server(attrs: Mapping[str, Any]) -> bool:
    """Whether a container's program is llama-server (upstream's images: the entrypoint)."""
    config = attrs.get("Config") or {}
    program = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    return bool(program) and PurePosixPath(str(program[0])).name == SERVER_BINARY


def server_launch(argv: Sequence[str], env: Mapping[str, str]) -> ServerLaunch:
    """Parse llama-server's arguments (flags win over LLAMA_ARG_* variables, as in llama.cpp)."""
    values: dict[str, str] = {}
    unified: bool | None = None
    for name, key in _ENV_OPTIONS.items():
        if env.get(name):
            values[key] = env[name]
    if env.get("LLAMA_ARG_KV_UNIFIED"):
        unified = env["LLAMA_ARG_KV_UNIFIED"].lower() in _TRUE
    args = list(argv)
    for index, arg in enumerate(args):
        option, sep, inline = arg.partition("=")
        if option in _VALUE_OPTIONS:
            value = inline if sep else (args[index + 1] if index + 1 < len(args) else "")
            values[_VALUE_OPTIONS[option]] = value
        elif arg in ("-kvu", "--kv-unified"):
            unified = True
        elif arg in ("-no-kvu", "--no-kv-unified"):
            unified = False
    missing = [
        flag for flag, key in (("-m", "model"), ("-np", "slots"), ("-c", "ctx")) if not values.get(key)
    ]
    if missing:
        raise ServerError(
            f"llama-server was started without {', '.join(missing)}, so its KV layout is llama.cpp's"
            " automatic choice and cannot be predicted",
            "start it with -m, -np and -c (docker-compose.yml does)",
        )
    try:
        slots, ctx = int(values["slots"]), int(values["ctx"])
    except ValueError:
        raise ServerError(
            f"llama-server's -np {values['slots']!r} or -c {values['ctx']!r} is not a number"
        ) from None
    if slots <= 0 or ctx <= 0:
        raise ServerError(f"llama-server runs with -np {slots} -c {ctx}: automatic sizes cannot be predicted")
    log_file = values.get("log_file")
    return ServerLaunch(
        model_path=PurePosixPath(values["model"]),
        slots=slots,
        ctx_total=ctx,
        unified=bool(unified),
        cache_type_k=values.get("type_k", "f16"),
        cache_type_v=values.get("type_v", "f16"),
        log_file=PurePosixPath(log_file) if log_file else None,
    )


def container_launch(attrs: Mapping[str, Any]) -> ServerLaunch:
    """The ServerLaunch of a llama-server container."""
    config = attrs.get("Config") or {}
    program = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    return server_launch([str(arg) for arg in program[1:]], env)


def _archive_url(container: Any) -> str:
    """The engine's archive endpoint of a container (GET: a tar of a path; HEAD: its stat)."""
    api = container.client.api
    return f"{api.base_url}/v{api.api_version}/containers/{container.id}/archive"


def _refused(container: Any, path: PurePosixPath, status: int) -> ServerError:
    return ServerError(f"the Docker engine answered HTTP {status} for {path} in {container.name}")


def _stat(container: Any, path: PurePosixPath) -> dict[str, Any]:
    """The engine's stat of a path in a container (HEAD: nothing is transferred)."""
    response = container.client.api.head(_archive_url(container), params={"path": str(path)})
    with contextlib.closing(response):
        if response.status_code == 404:
            raise ModelError(f"{path} does not exist in container {container.name}")
        if response.status_code != 200:
            raise _refused(container, path, response.status_code)
        encoded = response.headers.get("X-Docker-Container-Path-Stat", "")
    stat: dict[str, Any] = docker.utils.decode_json_header(encoded) if encoded else {}
    return stat


def _resolve_link(container: Any, path: PurePosixPath) -> tuple[PurePosixPath, int]:
    """Follow symbolic links (the stack's /models/<quant>.gguf are relative links): (path, size)."""
    for _ in range(8):
        stat = _stat(container, path)
        target = str(stat.get("linkTarget") or "")
        if not target or PurePosixPath(target) == path:
            return path, int(stat.get("size") or 0)
        path = PurePosixPath(target) if target.startswith("/") else path.parent / target
    raise ModelError(f"{path} in container {container.name} is a loop of links")


def read_container_gguf(container: Any, path: PurePosixPath) -> GgufSummary:
    """The GGUF header of a file inside a container, read only as far as it reaches."""
    real, size = _resolve_link(container, path)
    limit = FIRST_READ_BYTES
    while True:
        with tempfile.NamedTemporaryFile(suffix=".gguf") as partial:
            copied = _copy_prefix(container, real, limit, partial)
            try:
                scan = scan_gguf(Path(partial.name))
            except ModelError:
                if copied >= size:  # the whole file was read: it is broken, not cut short by us
                    raise
                limit *= 4
                continue
        return summarize_scan(Path(str(real)), size, scan)


def _copy_prefix(container: Any, path: PurePosixPath, limit: int, sink: IO[bytes]) -> int:
    """Write the first `limit` bytes of a container file to `sink`; the number written.

    The response is closed as soon as enough is read: the engine keeps the container locked
    while it sends an archive, so an abandoned transfer would block every later call on it.
    """
    response = container.client.api.get(
        _archive_url(container), params={"path": str(path)}, stream=True,
        headers={"Accept-Encoding": "identity"},
    )  # fmt: skip
    with contextlib.closing(response):
        if response.status_code != 200:
            raise _refused(container, path, response.status_code)
        with tarfile.open(fileobj=response.raw, mode="r|") as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise ModelError(f"{path} in container {container.name} is not a regular file")
            source = tar.extractfile(member)
            assert source is not None
            copied = 0
            while copied < limit:
                block = source.read(min(1 << 20, limit - copied))
                if not block:
                    break
                sink.write(block)
                copied += len(block)
            sink.flush()
            return copied


def _started_at(attrs: Mapping[str, Any]) -> dt.datetime | None:
    text = str((attrs.get("State") or {}).get("StartedAt") or "")
    if not text or text.startswith("0001-"):
        return None
    seconds = text.split(".")[0].rstrip("Z")
    return dt.datetime.fromisoformat(seconds).replace(tzinfo=dt.UTC)


def log_since_start(container: Any) -> str:
    """The container's output since it last started (a restarted server's earlier lines left out)."""
    since = _started_at(container.attrs)
    raw = container.logs(stdout=True, stderr=True, since=since) if since else container.logs()
    return bytes(raw).decode("utf-8", "replace")


def check_container(container: Any) -> tuple[str, KvCheck]:
    """(label, check) of one running llama-server container; the label is the model's file type."""
    launch = container_launch(container.attrs)
    summary = read_container_gguf(container, launch.model_path)
    prediction = predict_kv(
        kv_shape_from_gguf(summary), launch.slots, launch.ctx_per_slot,
        launch.cache_type_k, launch.cache_type_v, launch.unified,
    )  # fmt: skip
    text = log_since_start(container)
    try:
        check = kv_check_from_log(prediction, text, None)
    except MeasurementError as error:
        raise MeasurementError(f"{container.name}: {error.problem}", error.hint) from None
    return summary.file_type, check


def run_folder_of(container: Any) -> PurePosixPath | None:
    """The run folder a server writes its log into (`<run>/logs/<file>`), inside the container."""
    log_file = container_launch(container.attrs).log_file
    if log_file is None:
        return None
    return log_file.parent.parent if log_file.parent.name == "logs" else log_file.parent


def put_file(container: Any, folder: PurePosixPath, name: str, data: bytes) -> PurePosixPath:
    """Write one file into a container (e.g. into a volume it mounts); its path there."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        info.mtime = int(dt.datetime.now(dt.UTC).timestamp())
        tar.addfile(info, io.BytesIO(data))
    try:
        if not container.put_archive(str(folder), archive.getvalue()):
            raise ServerError(f"the engine refused to write {folder / name} into {container.name}")
    except docker.errors.APIError as error:
        raise ServerError(
            f"cannot write {folder / name} into {container.name}: {error.explanation or error}",
            "does the container mount the results volume read-write?",
        ) from None
    return folder / name


@dataclass(frozen=True)
class ServerKv:
    """The KV check of one llama-server container, or why there is none."""

    service: str
    container: str
    label: str  # the model's file type (F16, Q8_0, ...), else the service name
    check: KvCheck | None
    error: str | None


def check_servers(pairs: Sequence[tuple[ContainerState, Any]]) -> list[ServerKv]:
    """Check every llama-server container of a project; a server that cannot be checked says why."""
    results: list[ServerKv] = []
    for state, container in pairs:
        if not is_llama_server(container.attrs):
            continue
        if state.state != "running":
            ended = state.problem() if state.exit_code != 0 else None
            why = (
                f"{state.service} died: its container {ended}" if ended
                else f"{state.service} is not running ({state.status_text()})"
            )  # fmt: skip
            results.append(
                ServerKv(state.service, state.name, _label_of(container, state.service), None, why)
            )
            continue
        try:
            label, check = check_container(container)
        except QuantloadError as error:
            results.append(ServerKv(state.service, state.name, state.service, None, error.one_line()))
            continue
        results.append(ServerKv(state.service, state.name, label, check, None))
    labels = [result.label for result in results]
    return [
        result if labels.count(result.label) == 1 else replace(result, label=result.service)
        for result in results
    ]


def _label_of(container: Any, fallback: str) -> str:
    """The model's file type, read from a container that may be stopped; `fallback` if unreadable."""
    try:
        return read_container_gguf(container, container_launch(container.attrs).model_path).file_type
    except (QuantloadError, docker.errors.DockerException):
        return fallback


def kv_json(results: Sequence[ServerKv], path: Path) -> None:
    """Write (or merge into) a kv.json with every server's check or why there is none, through
    quantload.kvcheck.merge_kv_file, the file's one writer."""
    for result in results:
        merge_kv_file(path, result.label, result.check if result.check is not None else str(result.error))
