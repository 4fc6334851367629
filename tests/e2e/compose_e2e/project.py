"""docker-compose on the real docker-compose.yml plus the stand-in override, with failures that say
which service failed and show the end of its `docker-compose logs`."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from quantload.compose.containers import ContainerState, project_containers

REPO = Path(__file__).resolve().parents[3]
BASE_FILE = REPO / "docker-compose.yml"
OVERRIDE_FILE = Path(__file__).resolve().parent / "docker-compose.standins.yml"
LOG_LINES = 40


class StackFailure(AssertionError):
    """A compose step failed; the message names the service(s) and shows their logs' ends."""


@dataclass
class Compose:
    """One compose project on a private engine."""

    project: str
    env_file: Path
    environ: dict[str, str]  # DOCKER_HOST of the engine, without the developer's QL_/COMPOSE_ settings
    client: object  # Docker SDK client of the same engine
    files: Sequence[Path] = field(default_factory=lambda: (BASE_FILE, OVERRIDE_FILE))
    # the whole output of every one-shot job (`run`), kept whatever its end: {label: text}
    job_outputs: dict[str, str] = field(default_factory=dict)

    def argv(self, *args: str) -> list[str]:
        command = ["docker-compose", "--project-name", self.project, "--env-file", str(self.env_file)]
        for path in self.files:
            command += ["-f", str(path)]
        return [*command, *args]

    def run(
        self,
        *args: str,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        input_bytes: bytes | None = None,
        check: bool = True,
        services: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[bytes]:
        """Run one docker-compose command; on failure or timeout, StackFailure with the logs of
        `services` (or of every service in trouble)."""
        environ = {**self.environ, **(env or {})}
        label = job_label(args) if args and args[0] == "run" else None
        try:
            result = subprocess.run(
                self.argv(*args), cwd=REPO, env=environ, input=input_bytes, capture_output=True,
                timeout=timeout_s, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as expired:
            output = _text(expired.stdout) + _text(expired.stderr)
            if label is not None:
                self.keep_job_output(label, output + f"\n[timed out after {timeout_s:.0f} s]")
            raise StackFailure(
                self.explain(
                    f"docker-compose {' '.join(args)} did not finish within {timeout_s:.0f} s",
                    output,
                    services,
                )
            ) from None
        if label is not None and "tar" not in args:  # a tar stream is data, not a log
            self.keep_job_output(
                label, _text(result.stdout) + _text(result.stderr) + f"\n[exit {result.returncode}]"
            )
        if check and result.returncode != 0:
            output = _text(result.stdout) + _text(result.stderr)
            raise StackFailure(
                self.explain(
                    f"docker-compose {' '.join(args)} exited with {result.returncode}", output, services
                )
            )
        return result

    def keep_job_output(self, label: str, text: str) -> None:
        """Keep one job's whole output (a second run of the same job gets a numbered label)."""
        taken = sum(1 for name in self.job_outputs if name == label or name.startswith(f"{label} #"))
        self.job_outputs[label if not taken else f"{label} #{taken + 1}"] = text

    def all_logs(self, service: str) -> str:
        """The whole `docker-compose logs` of a service (e.g. the prepare job's container)."""
        result = subprocess.run(
            self.argv("logs", "--no-color", "--timestamps", service),
            cwd=REPO, env=self.environ, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        return (result.stdout + result.stderr).strip()

    def states(self) -> list[ContainerState]:
        return [state for state, _ in project_containers(self.client, self.project)]

    def logs(self, service: str, lines: int = LOG_LINES) -> str:
        result = subprocess.run(
            self.argv("logs", "--no-color", "--tail", str(lines), service),
            cwd=REPO, env=self.environ, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        return (result.stdout + result.stderr).strip()

    def troubled(self) -> list[tuple[str, str]]:
        """(service, what is wrong) for every container in trouble, or not ready yet."""
        found = []
        for state in self.states():
            problem = state.problem()
            if problem is None and not state.ready:
                problem = f"not ready ({state.status_text()})"
            if problem is not None:
                found.append((state.service, problem))
        return found

    def explain(self, what: str, output: str, services: Sequence[str] = ()) -> str:
        """`what`, compose's own last lines, and the end of the log of each service concerned."""
        troubled = self.troubled()
        named = list(services) or [service for service, _ in troubled]
        lines = [what, "compose said: " + " | ".join(output.strip().splitlines()[-8:])]
        for service, problem in troubled:
            lines.append(f"service {service}: {problem}")
        for service in dict.fromkeys(named):
            lines.append(f"---- docker-compose logs --tail {LOG_LINES} {service}")
            lines.append(self.logs(service))
        return "\n".join(lines)

    def wait_ready(self, services: Sequence[str], timeout_s: float) -> float:
        """Wait until every container of `services` is ready; seconds waited. StackFailure naming the
        services that are not, with their logs, at the deadline or as soon as one fails for good."""
        started = time.monotonic()
        while True:
            states = [s for s in self.states() if s.service in services and not s.oneoff]
            seen = {s.service for s in states}
            failed = [s for s in states if s.problem() is not None and s.state != "running"]
            waiting = [s for s in states if not s.ready]
            if not waiting and seen >= set(services):
                return time.monotonic() - started
            if failed or time.monotonic() - started > timeout_s:
                concerned = [s.service for s in failed or waiting] + sorted(set(services) - seen)
                raise StackFailure(self.explain(
                    f"services not ready after {time.monotonic() - started:.0f} s: {', '.join(concerned)}",
                    "", concerned,
                ))  # fmt: skip
            time.sleep(1.0)


VALUED_RUN_OPTIONS = frozenset({"-e", "--env", "-u", "--user", "-w", "--workdir", "--name", "--entrypoint", "-v"})


def job_label(args: Sequence[str]) -> str:
    """The service a `run ...` command runs (and its command when one is given), e.g. 'load'."""
    rest = list(args[1:])
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in VALUED_RUN_OPTIONS and rest:
            rest.pop(0)
    return " ".join(rest[:2]) if rest else "run"


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", "replace")
