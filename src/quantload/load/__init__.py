"""Load generation: streaming chat requests at llama-servers, one record per request.

Its face is this package: everything outside load/ imports the names of `__all__` from
`quantload.load` (a test holds it); the modules are its own. Nothing here imports Locust except the
`in_locust` package, which only Locust processes import (`import locust` monkey-patches the
interpreter). The experiments that use all this live in quantload.experiments. Names are loaded
on first use, so a Locust process importing one module pays for no other.

Modules, by job.

How a plan runs
  plan            a plan's stages as data handed to the Locust processes; the stage builder
  supervisor      run_plan: starts a plan's processes, follows its records and stage lines,
                  writes each stage's summary as it ends, closes its stages
  limit_file      limits.jsonl: one line per search
  processes       which Locust processes run a plan; the worker count for this machine
  remote_worker   `quantload load-worker`: a load host's worker, joining each plan of a remote master
  calibrate       `quantload calibrate`: the client against the fake server, at rising stream counts
  fakeserver      the OpenAI-style streaming server of known timing (calibration, tests, benchmarks)

What a request is and how it is measured
  prompts         the 100 built-in prompts, ShareGPT and JSONL loaders
  workloads       what a stage's requests are: prompt set, lengths, dataset, trace, sessions
  workload_builder  the workloads of one target from the settings (files read, tokenizer asked)
  synthetic       prompts of an exact token length via the server's /tokenize and /detokenize
  history_trim    the client's trim of a conversation that outgrows the slot (server-counted)
  datasets        ShareGPT/JSONL conversations with line numbers
  lengths         request length distributions (prompt and output tokens per request)
  trace           timestamped request traces (arrival, prompt and answer lengths)
  limit_search    the most users (or highest rate) within the SLO, as a pure state machine
  shared_prefix   the prompt-cache experiment's system prompt (sized with /tokenize), slot reset
  tickets         tickets (one request to send), the ticket book, stage trackers
  timed_supply    a timed stage's tickets (the soak's slices): the pool again until time is up
  client          the streaming HTTP/1.1 client on plain sockets (TTFT excludes connecting)
  http1           HTTP/1.1 response framing: head, chunked, length- or close-delimited body
  sse             Server-Sent Events over that body: the `data:` payloads
  openai_chunks   what each payload means (text, end, usage, timings, errors); a stream's verdict
  stream_result   what one streamed request produced, before it becomes a record
  measure         StreamResult -> RequestRecord (TTFT, TPOT, ITL, goodput)

What comes out
  records         the record schema (quantload.record/1), stage lines, JSONL files
  summary         a stage's summary, computed in one place (StageFigures -> StageSummary)
  client_health   the load processes' CPU and loop lateness per stage; "was the client the limit"
  process_memory  a process's resident memory from /proc (the load processes', the server's)
  metrics         the load generator's Prometheus metrics (quantload_*)

  in_locust/      inside a Locust process: the user class, the shared runtime, ticket sources,
                  record sinks, the stage controller, health, messages, the interactive mode
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quantload.load.arrival import StampSwitch, enable_kernel_stamps, read_stamped
    from quantload.load.calibrate import (
        CALIBRATION_DIR,
        Calibration,
        calibration_script,
        fake_delay_s,
        machine_limits,
        run_calibration,
        write_calibration,
    )
    from quantload.load.datasets import read_dataset
    from quantload.load.fakeserver import FakeScript, FakeServerProcess, SlowEpisodes, serve_forever
    from quantload.load.history_trim import whole_prompt_tokens
    from quantload.load.http1 import ProtocolError
    from quantload.load.lengths import LengthDistribution, parse_length_distribution
    from quantload.load.level_judgement import LevelJudgement
    from quantload.load.limit_file import LimitLine, SearchExperiment, TrialLine, read_limits
    from quantload.load.limit_search import (
        LimitResult,
        LimitSearch,
        Trial,
        TrialOutcome,
        level_text,
        level_unit,
    )
    from quantload.load.openai_chunks import classify_stream
    from quantload.load.plan import (
        LoadPlan,
        PlannedRequest,
        PlannedTurn,
        StageDecision,
        StagePlan,
        assemble_plan,
        decided_timeout_s,
        poisson_requests,
        stage_decision,
        stage_plan,
        warmup_requests,
    )
    from quantload.load.process_memory import resident_bytes
    from quantload.load.processes import (
        LoadProcess,
        WorkersSetting,
        choose_workers,
        master_listen_port,
        most_workers,
        usable_cores,
        workers_absent,
    )
    from quantload.load.prompts import Prompt, load_builtin, select_prompts
    from quantload.load.records import (
        JsonlAppender,
        RequestRecord,
        StageEvent,
        TenantLoad,
        iter_records,
        iter_stage_events,
    )
    from quantload.load.remote_worker import WorkerLoop, worker_argv
    from quantload.load.shared_prefix import build_system_prompt, count_tokens, erase_slots
    from quantload.load.sse import EventStreamParser
    from quantload.load.stream_result import StreamResult
    from quantload.load.summary import (
        StageFigures,
        StageSummary,
        delivered_concurrency,
        new_figures,
        summarize,
        summarize_stage,
    )
    from quantload.load.supervisor import LoadError, PlanOutcome, run_plan
    from quantload.load.workload_builder import WorkloadBuilder, ignored_flags
    from quantload.load.workloads import (
        LengthsWorkload,
        PromptSetWorkload,
        SessionWorkload,
        StageRequests,
        cycle_prompts,
    )

_HOME: dict[str, str] = {
    "TrialOutcome": "limit_search",
    "level_unit": "limit_search",
    "SlowEpisodes": "fakeserver",
    "LevelJudgement": "level_judgement",
    "load_builtin": "prompts",
    "PromptSetWorkload": "workloads",
    "StampSwitch": "arrival",
    "enable_kernel_stamps": "arrival",
    "read_stamped": "arrival",
    "read_dataset": "datasets",
    "CALIBRATION_DIR": "calibrate",
    "Calibration": "calibrate",
    "run_calibration": "calibrate",
    "fake_delay_s": "calibrate",
    "machine_limits": "calibrate",
    "calibration_script": "calibrate",
    "write_calibration": "calibrate",
    "FakeScript": "fakeserver",
    "FakeServerProcess": "fakeserver",
    "serve_forever": "fakeserver",
    "whole_prompt_tokens": "history_trim",
    "ProtocolError": "http1",
    "LengthDistribution": "lengths",
    "parse_length_distribution": "lengths",
    "LimitLine": "limit_file",
    "SearchExperiment": "limit_file",
    "TrialLine": "limit_file",
    "read_limits": "limit_file",
    "LimitResult": "limit_search",
    "LimitSearch": "limit_search",
    "Trial": "limit_search",
    "level_text": "limit_search",
    "classify_stream": "openai_chunks",
    "LoadPlan": "plan",
    "PlannedRequest": "plan",
    "PlannedTurn": "plan",
    "StageDecision": "plan",
    "StagePlan": "plan",
    "stage_decision": "plan",
    "decided_timeout_s": "plan",
    "assemble_plan": "plan",
    "poisson_requests": "plan",
    "stage_plan": "plan",
    "warmup_requests": "plan",
    "LoadProcess": "processes",
    "master_listen_port": "processes",
    "WorkersSetting": "processes",
    "choose_workers": "processes",
    "most_workers": "processes",
    "usable_cores": "processes",
    "resident_bytes": "process_memory",
    "workers_absent": "processes",
    "Prompt": "prompts",
    "select_prompts": "prompts",
    "JsonlAppender": "records",
    "RequestRecord": "records",
    "StageEvent": "records",
    "TenantLoad": "records",
    "iter_records": "records",
    "iter_stage_events": "records",
    "WorkerLoop": "remote_worker",
    "worker_argv": "remote_worker",
    "build_system_prompt": "shared_prefix",
    "count_tokens": "shared_prefix",
    "erase_slots": "shared_prefix",
    "EventStreamParser": "sse",
    "StreamResult": "stream_result",
    "StageFigures": "summary",
    "StageSummary": "summary",
    "delivered_concurrency": "summary",
    "new_figures": "summary",
    "summarize": "summary",
    "summarize_stage": "summary",
    "LoadError": "supervisor",
    "PlanOutcome": "supervisor",
    "run_plan": "supervisor",
    "WorkloadBuilder": "workload_builder",
    "ignored_flags": "workload_builder",
    "LengthsWorkload": "workloads",
    "SessionWorkload": "workloads",
    "StageRequests": "workloads",
    "cycle_prompts": "workloads",
}
__all__ = [
    "CALIBRATION_DIR",
    "Calibration",
    "EventStreamParser",
    "FakeScript",
    "FakeServerProcess",
    "JsonlAppender",
    "LengthDistribution",
    "LengthsWorkload",
    "LevelJudgement",
    "LimitLine",
    "LimitResult",
    "LimitSearch",
    "LoadError",
    "LoadPlan",
    "LoadProcess",
    "PlanOutcome",
    "PlannedRequest",
    "PlannedTurn",
    "Prompt",
    "PromptSetWorkload",
    "ProtocolError",
    "RequestRecord",
    "SearchExperiment",
    "SessionWorkload",
    "SlowEpisodes",
    "StageDecision",
    "StageEvent",
    "StageFigures",
    "StagePlan",
    "StageRequests",
    "StageSummary",
    "StampSwitch",
    "StreamResult",
    "TenantLoad",
    "Trial",
    "TrialLine",
    "TrialOutcome",
    "WorkerLoop",
    "WorkersSetting",
    "WorkloadBuilder",
    "assemble_plan",
    "build_system_prompt",
    "calibration_script",
    "choose_workers",
    "classify_stream",
    "count_tokens",
    "cycle_prompts",
    "decided_timeout_s",
    "delivered_concurrency",
    "enable_kernel_stamps",
    "erase_slots",
    "fake_delay_s",
    "ignored_flags",
    "iter_records",
    "iter_stage_events",
    "level_text",
    "level_unit",
    "load_builtin",
    "machine_limits",
    "master_listen_port",
    "most_workers",
    "new_figures",
    "parse_length_distribution",
    "poisson_requests",
    "read_dataset",
    "read_limits",
    "read_stamped",
    "resident_bytes",
    "run_calibration",
    "run_plan",
    "select_prompts",
    "serve_forever",
    "stage_decision",
    "stage_plan",
    "summarize",
    "summarize_stage",
    "usable_cores",
    "warmup_requests",
    "whole_prompt_tokens",
    "worker_argv",
    "workers_absent",
    "write_calibration",
]


def __getattr__(name: str) -> Any:
    """A name of the face, imported from its module on first use."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
