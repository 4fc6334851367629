"""The interactive mode that `locust -f locustfiles/...` runs (web UI or headless, any runner).

The user count and host come from Locust's web UI or command line, users cycle through the
prompt set forever, records go to `--ql-out` when given (workers forward theirs to the master),
and `/metrics` is served on `--ql-metrics-port` (a worker uses an explicit port as is, one worker
per host; left at the default, workers take port + 1 + worker index so several fit on one host).
Request parameters come from quantload's layered configuration (`quantload.toml`,
`QUANTLOAD_LOAD__*`), e.g. `QUANTLOAD_LOAD__MAX_TOKENS=64`.
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path
from typing import Any

import gevent
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from quantload.config import LoadSettings, load_config
from quantload.errors import QuantloadError
from quantload.load.in_locust.user import StreamingChatUser
from quantload.load.in_locust.wiring import Role, wire_process
from quantload.load.metrics import LoadMetrics, serve_metrics
from quantload.load.prompts import Prompt, select_prompts
from quantload.load.tickets import StageContext, Ticket
from quantload.rundir import RunPaths

_log = logging.getLogger(__name__)


class EndlessPrompts:
    """Interactive tickets: the prompt set in order, again and again, labelled with the host."""

    def __init__(
        self,
        environment: Environment,
        prompts: list[Prompt],
        settings: LoadSettings,
        labels: tuple[str, str, str],
        run_id: str,
    ) -> None:
        self.environment = environment
        self.prompts = prompts
        self.settings = settings
        self.labels = labels
        self.run_id = run_id
        self._counter = itertools.count()

    def take(self, done: str | None = None) -> Ticket | None:
        host = self.environment.host
        runner = self.environment.runner
        if not host or runner is None:
            gevent.sleep(1.0)
            return None
        seq = next(self._counter)
        prompt = self.prompts[seq % len(self.prompts)]
        users = int(runner.user_count)
        server, quant, model = self.labels
        settings = self.settings
        context = StageContext(
            run_id=self.run_id,
            stage_id=f"interactive-{users}",
            stage_index=0,
            experiment="interactive",
            users=users,
            rate_rps=None,
            repeat=0,
            cache_prompt=settings.cache_prompt,
            server=server,
            quant=quant,
            model=model,
            url=host,
            max_tokens=settings.max_tokens,
            temperature=settings.temperature,
            seed=settings.seed,
            ignore_eos=settings.ignore_eos,
            request_timeout_s=settings.request_timeout_s,
            connect_timeout_s=settings.connect_timeout_s,
            path="/v1/chat/completions",
            reuse_connections=settings.reuse_connections,
            first_round_jitter_s=0.0,
            first_byte_timeout_s=settings.first_byte_timeout_s,
        )
        return Ticket(context, seq, prompt.id, prompt.messages())


def _add_arguments(parser: Any) -> None:
    group = parser.add_argument_group("quantload")
    group.add_argument("--ql-server", default="server", help="server label of the records/metrics")
    group.add_argument("--ql-quant", default="unknown", help="quantization label")
    group.add_argument("--ql-model", default="", help="model name sent in requests")
    group.add_argument("--ql-out", default="", help="folder for records.jsonl (master/local)")
    group.add_argument("--ql-run-id", default="interactive", help="run id of the records")
    group.add_argument(
        "--ql-metrics-port",
        type=int,
        default=-1,
        help="/metrics port (0 = off). Default load.metrics_port, where workers add 1 + their index "
        "so several fit on one host; given explicitly, a worker uses it as is (one worker per host, "
        "e.g. compose replicas found by DNS)",
    )


def _settings() -> LoadSettings:
    try:
        return load_config(Path.cwd(), os.environ).settings.load
    except QuantloadError as error:
        _log.error("quantload configuration: %s; using defaults", error.one_line())
        return LoadSettings()


def _keep_gauges(environment: Environment, metrics: LoadMetrics, labels: tuple[str, str]) -> None:
    while True:
        runner = environment.runner
        users = int(runner.user_count) if runner is not None else 0
        metrics.set_active_users(labels[0], labels[1], users)
        metrics.set_stage([labels[0], labels[1], "interactive", str(users), "0", ""] if users else None)
        gevent.sleep(1.0)


def install_interactive(events: Any, user_class: type[StreamingChatUser]) -> None:
    """Register the listeners a locustfile needs to run `user_class` interactively."""
    events.init_command_line_parser.add_listener(_add_arguments)

    def on_init(environment: Environment, **_: Any) -> None:
        options = environment.parsed_options
        runner = environment.runner
        if options is None or runner is None:
            return
        settings = _settings()
        prompts = select_prompts(
            settings.prompts,
            settings.prompt_count,
            settings.min_prompt_tokens,
            settings.max_prompt_tokens,
            Path.cwd(),
        )
        labels = (str(options.ql_server), str(options.ql_quant), str(options.ql_model))
        metrics = LoadMetrics()
        role: Role = (
            "worker"
            if isinstance(runner, WorkerRunner)
            else ("master" if isinstance(runner, MasterRunner) else "local")
        )
        source = EndlessPrompts(environment, prompts, settings, labels, str(options.ql_run_id))
        out = Path(options.ql_out) if options.ql_out and role != "worker" else None
        parts = wire_process(
            environment,
            role,
            metrics,
            records_path=RunPaths(out).records_path if out is not None else None,
            tickets=source if role != "master" else None,
        )
        user_class.runtime = parts.runtime
        port = int(options.ql_metrics_port)
        base = settings.metrics_port if port < 0 else port
        if role != "worker":
            gevent.spawn(_keep_gauges, environment, metrics, (labels[0], labels[1]))
            if base:
                serve_metrics(metrics, settings.metrics_host, base)
            return
        started: list[bool] = []

        def on_test_start(environment: Environment, **_: Any) -> None:
            if base and not started and isinstance(runner, WorkerRunner):
                started.append(True)
                own = port if port >= 0 else base + 1 + max(runner.worker_index, 0)
                serve_metrics(metrics, settings.metrics_host, own)

        environment.events.test_start.add_listener(on_test_start)  # type: ignore[no-untyped-call]

    events.init.add_listener(on_init)
