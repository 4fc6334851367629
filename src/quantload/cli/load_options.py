"""The options of `quantload load`, one constant each (as quantload.cli.slo_options does for the
SLO's): the command's signature stays one line per option."""

from __future__ import annotations

import typer

from quantload.experiments import registry

URL = typer.Option(..., "--url", help="Server base URL; repeat for several.")
OUT = typer.Option(..., "--out", help="Folder for records.jsonl, stages.jsonl.")
NAME = typer.Option(None, "--name", help="Server label, per --url.")
QUANT = typer.Option(None, "--quant", help="Quant label, per --url.")
MODEL = typer.Option("", help="Model name sent in requests.")
EXPERIMENT = typer.Option(
    None, "--experiment", "-e", help=f"One of {', '.join(registry.for_any_server())}; repeatable."
)
WORKLOAD = typer.Option(
    None, help="What sweep, open loop and limit search send: prompts, lengths, dataset, sessions, trace."
)
INPUT_LENGTHS = typer.Option(None, help="Prompt tokens per request, e.g. lognormal:mean=300,spread=0.6.")
OUTPUT_LENGTHS = typer.Option(None, help="max_tokens per request, e.g. fixed:128.")
DATASET = typer.Option(None, help="ShareGPT JSON or JSONL for the dataset workload.")
TRACE = typer.Option(None, help="JSONL trace to replay (trace experiment).")
SPEED = typer.Option(None, help="Trace replay speed factor (2 = twice as fast).")
TURNS = typer.Option(None, help="Turns per conversation (sessions).")
SESSIONS = typer.Option(None, help="Conversations per sessions stage.")
THINK_TIME = typer.Option(None, help="Mean think time between turns, s.")
AFFINITY = typer.Option(None, help="Session slot affinity: none (server's -sps) or id_slot.")
BATCH_SIZES = typer.Option(None, help="Mixed experiment -b/-ub pairs, e.g. 2048/512,256/256.")
TIME_CAP = typer.Option(None, help="Limit search time cap per search, s.")
MAX_USERS = typer.Option(None, help="Limit search: most users to try.")
DURATION = typer.Option(None, help="Soak length (-e soak), e.g. 1h, 20m, 90s.")
USERS = typer.Option(None, help="Closed-loop users, e.g. 1,2,4,8.")
REPEATS = typer.Option(None, help="Repeats of each stage.")
RATES = typer.Option(None, help="Open-loop rates in requests/s, e.g. 0.5,1.")
PROMPTS = typer.Option(None, help="builtin, a ShareGPT JSON or a JSONL.")
PROMPT_COUNT = typer.Option(None, help="Prompts per stage.")
MAX_TOKENS = typer.Option(None, help="max_tokens per request.")
IGNORE_EOS = typer.Option(None, "--ignore-eos/--stop-at-eos")
CACHE_PROMPT = typer.Option(None, "--cache-prompt/--no-cache-prompt", help="Sweep/open loop.")
WORKERS = typer.Option(None, help="Locust workers: auto (default), or 0 = one process, N.")
REMOTE_WORKERS = typer.Option(None, help="Workers on other hosts (`quantload load-worker`) to wait for.")
MASTER_HOST = typer.Option(
    None, help="Address the Locust master listens on (this host's, for remote workers)."
)
MASTER_PORT = typer.Option(None, help="The master's port (default 5557 with remote workers).")
WORKERS_TIMEOUT = typer.Option(None, help="Seconds the master waits for its workers at each plan [60].")
METRICS_HOST = typer.Option(None, help="Address to serve /metrics on (default loopback).")
METRICS_PORT = typer.Option(None, help="/metrics port; 0 = none.")
REQUEST_TIMEOUT = typer.Option(None, help="Per-request deadline, s.")
FIRST_BYTE_TIMEOUT = typer.Option(None, help="Most seconds to wait for a response's first byte.")
API_KEY_ENV = typer.Option(None, help="Environment variable holding the API key.")
RUN_ID = typer.Option(None, help="Run id (default: time + config hash).")
AS_JSON = typer.Option(False, "--json", help="Print the summaries as JSON.")
