"""A compose project's containers, found by compose's labels, and their state in plain words."""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from quantload.errors import QuantloadError

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
ONEOFF_LABEL = "com.docker.compose.oneoff"
LONG_RUNNING_POLICIES = ("always", "unless-stopped")


class StackError(QuantloadError):
    """The Docker engine or the compose project cannot be read."""


def connect(environ: Mapping[str, str]) -> Any:
    """A Docker SDK client for DOCKER_HOST (or the default socket), API version negotiated."""
    client = None
    try:
        client = docker.from_env(version="auto", environment=dict(environ))
        client.ping()
    except docker.errors.DockerException as error:
        if client is not None:
            client.close()  # its connection pool holds the socket it tried
        where = environ.get("DOCKER_HOST") or "the default socket"
        raise StackError(
            f"cannot reach the Docker engine at {where}: {error}",
            "start Docker, or set DOCKER_HOST to the engine the stack runs on",
        ) from None
    return client


def default_project_name(cwd: Path, environ: Mapping[str, str]) -> str:
    """The project name compose uses: COMPOSE_PROJECT_NAME, else the folder name, normalized."""
    named = environ.get("COMPOSE_PROJECT_NAME")
    return named if named else re.sub(r"[^-_a-z0-9]", "", cwd.name.lower())


@dataclass(frozen=True)
class ContainerState:
    """One container of the stack as `docker inspect` describes it."""

    service: str
    name: str
    oneoff: bool  # started by `compose run`
    state: str  # created, running, restarting, exited, dead, paused
    health: str | None  # starting, healthy, unhealthy; None without a healthcheck
    exit_code: int
    restart_count: int
    restart_policy: str
    oom_killed: bool
    started_at: str
    image: str
    ports: tuple[str, ...]
    health_output: str = ""  # the last healthcheck's output

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> ContainerState:
        """From the SDK's `container.attrs` (the engine's inspect document)."""
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        state = attrs.get("State") or {}
        health = state.get("Health") or {}
        checks = health.get("Log") or []
        ports: list[str] = []
        for container_port, bindings in sorted(
            ((attrs.get("NetworkSettings") or {}).get("Ports") or {}).items()
        ):
            for binding in bindings or []:
                ports.append(f"{binding.get('HostIp', '')}:{binding.get('HostPort', '')}->{container_port}")
        return cls(
            service=str(labels.get(SERVICE_LABEL, "")),
            name=str(attrs.get("Name", "")).lstrip("/"),
            oneoff=str(labels.get(ONEOFF_LABEL, "False")).lower() == "true",
            state=str(state.get("Status", "unknown")),
            health=health.get("Status") or None,
            exit_code=int(state.get("ExitCode") or 0),
            restart_count=int(attrs.get("RestartCount") or 0),
            restart_policy=str(
                ((attrs.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name") or ""
            ),
            oom_killed=bool(state.get("OOMKilled")),
            started_at=str(state.get("StartedAt", "")),
            image=str((attrs.get("Config") or {}).get("Image", "")),
            ports=tuple(ports),
            health_output=str(checks[-1].get("Output", "")).strip() if checks else "",
        )

    @property
    def long_running(self) -> bool:
        """A service meant to stay up (restarted by policy), as opposed to a job such as prepare."""
        return self.restart_policy in LONG_RUNNING_POLICIES

    @property
    def ready(self) -> bool:
        """Up and healthy (or up without a healthcheck), or a job that finished well."""
        if self.state == "running":
            return self.health in (None, "healthy")
        return self.state == "exited" and self.exit_code == 0 and not self.long_running

    def problem(self) -> str | None:
        """What is wrong, in words; None when nothing is (a starting container is not wrong yet)."""
        if self.oom_killed:
            return "killed by the kernel: out of memory"
        if self.state == "restarting":
            return f"restarting after exit code {self.exit_code} (restarted {self.restart_count} times)"
        if self.state in ("exited", "dead"):
            if self.exit_code != 0:
                return self.exit_text()
            if self.long_running:
                return "stopped (exit code 0), although it should stay up"
            return None
        if self.health == "unhealthy":
            last = f": {self.health_output.splitlines()[-1][:160]}" if self.health_output else ""
            return f"unhealthy{last}"
        return None

    def exit_text(self) -> str:
        """How the container ended, e.g. 'exited with code 137 (killed by signal 9, SIGKILL)'."""
        text = f"exited with code {self.exit_code}"
        number = self.exit_code - 128
        if number > 0:
            try:
                name = signal.Signals(number).name
            except ValueError:
                name = "unknown signal"
            text += f" (killed by signal {number}, {name})"
        return text

    def status_text(self) -> str:
        """One short phrase, e.g. 'running, healthy', 'exited 0', 'running, restarted 1 time'."""
        if self.state in ("exited", "dead"):
            text = f"{self.state} {self.exit_code}"
        else:
            text = self.state if self.health is None else f"{self.state}, {self.health}"
        if self.restart_count:
            text += f", restarted {self.restart_count} time{'s' if self.restart_count != 1 else ''}"
        return text


def project_containers(client: Any, project: str) -> list[tuple[ContainerState, Any]]:
    """Every container of `project` (running or not), with its SDK object, by service then name."""
    try:
        found = client.containers.list(all=True, filters={"label": f"{PROJECT_LABEL}={project}"})
    except docker.errors.DockerException as error:
        raise StackError(f"cannot list the containers of {project}: {error}") from None
    pairs = [(ContainerState.from_attrs(container.attrs), container) for container in found]
    return sorted(pairs, key=lambda pair: (pair[0].service, pair[0].name))
