"""The soak's watch on its server: memory and KV cells in use, read every `soak.sample_s` while the
soak's slices run, each reading appended to `soak.jsonl` (schema quantload.soak/1) as it is taken.

Server memory comes from the first source that applies:
  proc    the llama-server process quantload started (`ServerControl.server_pid`): its resident
          memory from /proc (quantload.load.process_memory)
  docker  the container `soak.server_container` names (compose): the Docker SDK's stats, usage
          less inactive file pages, as `docker stats` shows it
  none    a server quantload neither started nor was told the container of: the start line
          says why, and the report says "not measured"
KV cells in use: the sum of `/slots`' `n_prompt_tokens` and the slots busy
(quantload.exporter.slots); a server whose `/slots` does not answer has the reason in its lines.

The load client's memory is not read here: each Locust process reports its own with its health
windows, and every slice's stage_end line carries the sum (`client_rss_bytes`).

Bounded: each reading waits at most READ_TIMEOUT_S per source, the thread is stopped and joined
when the slices end, and nothing is kept in memory: every reading is one line on disk.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field

from quantload.errors import QuantloadError
from quantload.exporter.server_metrics import ServerDataError
from quantload.exporter.slots import cells_from_slots, parse_slots
from quantload.load.process_memory import resident_bytes
from quantload.load.records import JsonlAppender
from quantload.rundir.jsonl import BadLines, iter_jsonl
from quantload.served import ServedTarget

SOAK_SCHEMA = "quantload.soak/1"
READ_TIMEOUT_S = 3.0
ERROR_CHARS = 200
MemorySource = Literal["proc", "docker"]


class SoakLine(BaseModel):
    """One line of soak.jsonl: a soak began (its level and slices), a reading, or it ended."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    schema_: str = Field(default=SOAK_SCHEMA, alias="schema")
    event: Literal["soak_start", "sample", "soak_end"]
    unix_s: float
    run_id: str
    invocation: str  # the soak's stages' ids start with it
    server: str
    quant: str
    # soak_start
    users: int | None = None
    rate_rps: float | None = None
    level_from: str | None = None  # where the level came from (a setting, or a search's limit)
    duration_s: float | None = None
    slice_s: float | None = None
    slices: int | None = None
    memory_source: MemorySource | None = None
    memory_missing: str | None = None  # why the server's memory is not read
    # sample
    server_rss_bytes: int | None = None
    kv_cells_used: int | None = None
    kv_cells_total: int | None = None
    slots_busy: int | None = None
    errors: tuple[str, ...] = ()  # what could not be read this time, and why
    # soak_end
    samples: int | None = None

    def to_json_line(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)

    @classmethod
    def from_json_line(cls, line: str) -> SoakLine:
        return cls.model_validate_json(line)


def read_soak_lines(path: Path, bad: BadLines | None = None) -> list[SoakLine]:
    """Every line of a soak.jsonl; a torn or foreign line is counted in `bad` (the rule every run
    file is read by, quantload.rundir.jsonl)."""
    return list(iter_jsonl(path, SoakLine.from_json_line, bad))


class MemoryProbe(Protocol):
    """Where the server's resident memory is read."""

    @property
    def source(self) -> MemorySource: ...

    def read(self) -> int:
        """The server's memory now, bytes; QuantloadError saying why it cannot be read."""
        ...


class ProbeError(QuantloadError):
    """A reading that could not be taken."""


@dataclass(frozen=True)
class ProcMemory:
    """A process of this machine, by pid."""

    pid: int
    source: MemorySource = "proc"

    def read(self) -> int:
        found = resident_bytes(self.pid)
        if found is None:
            raise ProbeError(f"/proc/{self.pid} cannot be read (the server process is gone?)")
        return found


def container_memory_bytes(stats: Mapping[str, Any]) -> int | None:
    """A container's memory as `docker stats` shows it, from the engine's stats document: usage
    less the inactive file cache (cgroup v2 `inactive_file`, v1 `total_inactive_file`)."""
    memory = stats.get("memory_stats") or {}
    usage = memory.get("usage")
    if not isinstance(usage, int):
        return None
    detail = memory.get("stats") or {}
    inactive = detail.get("inactive_file", detail.get("total_inactive_file", 0))
    return usage - inactive if isinstance(inactive, int) and inactive <= usage else usage


class DockerMemory:
    """A container of the engine DOCKER_HOST names, by name or id (the Docker SDK)."""

    source: MemorySource = "docker"

    def __init__(self, name: str, environ: Mapping[str, str]) -> None:
        # Imported here: the Docker SDK costs an import no native soak should pay.
        from quantload.compose.containers import connect

        self.name = name
        self._client = connect(environ)
        try:
            self._container = self._find()
        except BaseException:
            self._client.close()  # no probe to close it later
            raise

    def _find(self) -> Any:
        import docker

        try:
            return self._client.containers.get(self.name)
        except docker.errors.NotFound:
            raise ProbeError(
                f"no container {self.name!r} on this Docker engine",
                "set soak.server_container to the server's container name (`docker ps`)",
            ) from None
        except docker.errors.DockerException as error:
            raise ProbeError(f"the Docker engine did not answer for {self.name!r}: {error}") from None

    def read(self) -> int:
        import docker

        try:
            try:
                stats = self._container.stats(stream=False, one_shot=True)
            except docker.errors.InvalidVersion:  # an engine before API 1.41 takes two samples
                stats = self._container.stats(stream=False)
        except docker.errors.DockerException as error:
            raise ProbeError(f"container {self.name!r}: {error}") from None
        found = container_memory_bytes(stats)
        if found is None:
            raise ProbeError(f"container {self.name!r}: its stats hold no memory usage (stopped?)")
        return found

    def close(self) -> None:
        self._client.close()


@dataclass(frozen=True)
class SlotsReading:
    cells_used: int
    cells_total: int
    busy: int


def read_slots(target: ServedTarget, client: httpx.Client) -> SlotsReading:
    """The KV cells in use (and allocated, assuming one stream per slot) and the busy slots, from
    the target's `/slots`; ProbeError saying why not."""
    headers = {"Authorization": f"Bearer {target.api_key_text}"} if target.api_key_text else {}
    try:
        answer = client.get(target.endpoint("/slots"), headers=headers)
    except httpx.HTTPError as error:
        raise ProbeError(f"/slots: {type(error).__name__}: {error}") from None
    if answer.status_code != 200:
        raise ProbeError(f"/slots answered HTTP {answer.status_code}")
    try:
        slots = parse_slots(answer.json())
    except (ValueError, ServerDataError) as error:
        raise ProbeError(f"/slots: {error}") from None
    return SlotsReading(sum(s.tokens for s in slots), cells_from_slots(slots), sum(s.busy for s in slots))


class SoakWatch:
    """Reads the server every `sample_s` in a thread of its own while the soak runs (a context)."""

    def __init__(
        self,
        path: Path,
        start: SoakLine,
        target: ServedTarget,
        memory: MemoryProbe | None,
        sample_s: float,
    ) -> None:
        self.path = path
        self.start = start
        self.target = target
        self.memory = memory
        self.sample_s = sample_s
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-watch", daemon=True)
        self._appender: JsonlAppender | None = None

    def __enter__(self) -> SoakWatch:
        self._appender = JsonlAppender(self.path)
        self._appender.append_line(self.start.to_json_line())
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=self.sample_s + 2 * READ_TIMEOUT_S + 5.0)
        if self._appender is not None:
            self._appender.append_line(self._line("soak_end", samples=self.samples).to_json_line())
            self._appender.close()
        close = getattr(self.memory, "close", None)
        if callable(close):
            close()

    def _line(self, event: Literal["sample", "soak_end"], **fields: Any) -> SoakLine:
        start = self.start
        return SoakLine(
            event=event, unix_s=time.time(), run_id=start.run_id, invocation=start.invocation,
            server=start.server, quant=start.quant, **fields,
        )  # fmt: skip

    def reading(self, client: httpx.Client) -> SoakLine:
        """One reading of every source, what failed named in its `errors`."""
        fields: dict[str, Any] = {}
        errors: list[str] = []
        if self.memory is not None:
            try:
                fields["server_rss_bytes"] = self.memory.read()
            except QuantloadError as error:
                errors.append(f"memory: {error.problem}"[:ERROR_CHARS])
        try:
            slots = read_slots(self.target, client)
            fields.update(
                kv_cells_used=slots.cells_used, kv_cells_total=slots.cells_total, slots_busy=slots.busy
            )
        except QuantloadError as error:
            errors.append(error.problem[:ERROR_CHARS])
        return self._line("sample", errors=tuple(errors), **fields)

    def _loop(self) -> None:
        with httpx.Client(timeout=READ_TIMEOUT_S) as client:
            while True:
                try:
                    line = self.reading(client)
                except Exception as error:  # a bug here costs this reading, said in its line
                    why = f"watch: {type(error).__name__}: {error}"[:ERROR_CHARS]
                    line = self._line("sample", errors=(why,))
                try:
                    if self._appender is not None:
                        self._appender.append_line(line.to_json_line())
                        self.samples += 1
                except ValueError:  # the soak ended and closed the file while this reading ran
                    return
                if self._stop.wait(self.sample_s):
                    return
