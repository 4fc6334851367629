"""A Locust process running a quantload plan: `python -m quantload.load.in_locust.process`.

Roles: `local` (one process runs the plan), `master` (runs the plan's stages and writes the
records; `--expect-workers N` workers send the requests) and `worker` (connects to a master; needs
no plan, tickets carry everything). The API key comes from the environment variable
QL_TARGET_API_KEY, never from the command line or the plan file.

Started by `quantload.load.supervisor` (and so by `quantload load`, `quantload run` and
`quantload calibrate`); usable by hand
for multi-host runs, e.g. on another machine:
`python -m quantload.load.in_locust.process --role worker --master-host 10.0.0.5 --metrics-port 9650`.
"""

from __future__ import annotations

# isort: off
import locust  # noqa: F401  (first: gevent's monkey-patching must precede the other imports)

# isort: on
import argparse
import logging
import sys
from pathlib import Path

import gevent
from locust.env import Environment
from locust.log import setup_logging
from locust.runners import Runner

from quantload.load.in_locust.master_watch import MasterWatch
from quantload.load.in_locust.user import StreamingChatUser
from quantload.load.in_locust.wiring import wire_process
from quantload.load.metrics import LoadMetrics, serve_metrics
from quantload.load.plan import LoadPlan
from quantload.load.processes import FAILURE_MARKER, MASTER_LOST_EXIT, WORKERS_TIMEOUT_S
from quantload.rundir import RunPaths

_log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m quantload.load.in_locust.process")
    parser.add_argument("--role", choices=("local", "master", "worker"), default="local")
    parser.add_argument("--plan", type=Path, help="plan JSON (local, master)")
    parser.add_argument("--out", type=Path, help="folder for records.jsonl and stages.jsonl")
    parser.add_argument("--master-host", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=5557)
    parser.add_argument("--expect-workers", type=int, default=1)
    parser.add_argument("--workers-timeout", type=float, default=WORKERS_TIMEOUT_S, help="s to wait for them")
    parser.add_argument("--metrics-host", default="127.0.0.1")
    parser.add_argument("--metrics-port", type=int, default=0, help="0 = no /metrics")
    parser.add_argument("--web-host", default="127.0.0.1")
    parser.add_argument("--web-port", type=int, default=0, help="Locust web UI; 0 = none")
    parser.add_argument("--log-level", default="INFO")
    return parser


def _say_failed(cause: str) -> None:
    """The failure line the supervisor looks for in this process's log."""
    sys.stderr.write(f"{FAILURE_MARKER}{cause}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    """Run one role to completion; the exit code is 0 unless the process itself broke, when the
    last line it prints is FAILURE_MARKER and the cause (which the supervisor shows), or a worker
    lost its master (MASTER_LOST_EXIT, quantload.load.in_locust.master_watch)."""
    args = _parser().parse_args(argv)
    setup_logging(args.log_level)  # type: ignore[no-untyped-call]
    try:
        return _run(args)
    except Exception as error:
        _log.exception("the load process failed")
        lines = str(error).strip().splitlines()
        cause = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
        _say_failed(cause[:400])
        return 1


def _run(args: argparse.Namespace) -> int:
    plan = None
    if args.role != "worker":
        if args.plan is None or args.out is None:
            _say_failed(f"--plan and --out are needed for role {args.role}")
            return 2
        plan = LoadPlan.model_validate_json(args.plan.read_text(encoding="utf-8"))
    user_class = type("QuantloadChatUser", (StreamingChatUser,), {"__module__": __name__})
    environment = Environment(
        user_classes=[user_class], host=plan.target.url if plan else None, stop_timeout=0.0
    )
    runner: Runner
    if args.role == "local":
        runner = environment.create_local_runner()
    elif args.role == "master":
        runner = environment.create_master_runner(args.master_host, args.master_port)
    else:
        runner = environment.create_worker_runner(args.master_host, args.master_port)
    metrics = LoadMetrics()
    parts = wire_process(
        environment,
        args.role,
        metrics,
        plan=plan,
        records_path=RunPaths(args.out).records_path if args.out else None,
        stages_path=RunPaths(args.out).stages_path if args.out else None,
        expect_workers=args.expect_workers,
        workers_timeout_s=args.workers_timeout,
    )
    user_class.runtime = parts.runtime  # type: ignore[attr-defined]
    if args.metrics_port:
        try:
            port = serve_metrics(metrics, args.metrics_host, args.metrics_port)
        except OSError as error:
            _log.warning(
                "no /metrics: cannot serve on %s:%d (%s)",
                args.metrics_host,
                args.metrics_port,
                error,
            )
        else:
            _log.info("serving /metrics on %s:%d", args.metrics_host, port)
    if args.web_port and args.role != "worker":
        environment.create_web_ui(args.web_host, args.web_port)
    if parts.controller is not None:
        gevent.spawn(parts.controller.run)
    watch = MasterWatch(runner) if args.role == "worker" else None
    if watch is not None:
        gevent.spawn(watch.run)
    runner.greenlet.join()
    parts.runtime.flush()
    if environment.web_ui is not None:
        environment.web_ui.stop()  # type: ignore[no-untyped-call]
    return MASTER_LOST_EXIT if watch is not None and watch.lost else 0


if __name__ == "__main__":
    sys.exit(main())
