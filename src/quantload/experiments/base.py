"""What an experiment is, what it is given, and what it gives back.

An experiment (one module or folder of this package, listed once in `registry`) declares:

  name, title     its name in settings, records and `quantload load -e`; its line in the run's view
  step, chapter   its step in run.json, and the report chapter that reads its stages
  missing         the input it needs: a function of the settings returning the one-line reason
                  it cannot run (None when it can)
  run             how it runs against one served target: plans its stages and runs them through
                  the load supervisor, returning an `ExperimentRun`
  server_flags    whether it restarts the server with other flags (`ServerControl`): those run
                  only where quantload started the server (`quantload run`); with `optional`
                  they run once on the server as it is elsewhere
  by_default      whether `load.experiments` names it unless told otherwise
  check           what it checks of its input before any server starts (`Preflight`: the
                  settings, what the llama-server build accepts, the model files): ConfigError
  report          its own part of the report, where it has one (`ExperimentReport`): what the
                  report computes of its stages, its chapter, its keys of summary.json. The name
                  of the module whose REPORT it is, which the registry loads when the report asks
                  (as a plugin is loaded): the analysis and its pandas are imported only by the
                  report, and no import ties an experiment's declaration to the analysis.

Run context: `ExperimentContext` holds the run (quantload.run_context.RunContext), the served
target, and the server control where quantload started the server (None for a URL it was given).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from quantload.config import Settings
from quantload.kvcheck import KvCheck
from quantload.llamacpp.devices import Device
from quantload.llamacpp.offload import GpuLayers
from quantload.llamacpp.server_help import ServerBuild
from quantload.load.limit_file import LimitLine
from quantload.load.summary import StageSummary
from quantload.run_context import RunContext
from quantload.served import ServedTarget

if TYPE_CHECKING:  # annotations only: declaring an experiment loads none of the report's modules
    from quantload.analysis.chapters.parts import Chapter
    from quantload.analysis.report_input import ReportInput
    from quantload.analysis.run_data import Gap

ServerFlagsUse = Literal["none", "optional", "required"]


@dataclass(frozen=True)
class ServerFlags:
    """What a variant of the served llama-server changes; None keeps the run's own setting."""

    slots: int | None = None
    ctx_per_slot: int | None = None
    cache_type: str | None = None  # K and V alike (flash attention on where a quantized V needs it)
    extra_args: tuple[str, ...] = ()  # added to the run's own flags
    label: str = ""  # how stages and logs name the variant, e.g. "-b 256 -ub 256"
    gpu_layers: GpuLayers | None = None  # -ngl: auto, all or a number


@dataclass(frozen=True)
class ServedVariant:
    """A llama-server of the same file running with other flags, and its KV cache as checked."""

    target: ServedTarget
    flags: ServerFlags
    kv: KvCheck | None = None
    kv_error: str | None = None  # why the KV cache could not be checked
    startup_log: str = ""  # what the variant's llama-server logged until it was ready


class ServerControl(Protocol):
    """Variants of a served llama-server quantload started (same file, other flags)."""

    def variant(self, flags: ServerFlags) -> AbstractContextManager[ServedVariant]:
        """The server running with `flags` for the length of the context, KV-checked; the served
        target as it was afterwards. ServerError when the variant does not start."""
        ...

    def adopt(self, flags: ServerFlags) -> ServedVariant:
        """The server restarted with `flags` for the rest of the run (a tuned run's winner);
        later variants start from them. ServerError when it does not start."""
        ...

    def server_pid(self) -> int | None:
        """The process id of the llama-server serving the target now (None when it is not running
        as a process of this machine): the soak reads its memory."""
        ...


@dataclass(frozen=True)
class ExperimentContext:
    """What one experiment run is handed: the run, the target, and control of its server."""

    run: RunContext
    target: ServedTarget
    servers: ServerControl | None = None

    @property
    def settings(self) -> Settings:
        return self.run.settings


@dataclass(frozen=True)
class ExperimentRun:
    """The stages one experiment ran, and how long they took (the time spent measuring)."""

    experiment: str
    summaries: tuple[StageSummary, ...]
    busy_s: float
    limit: LimitLine | None = None  # what a limit search found

    @property
    def problem(self) -> str | None:
        """Why the experiment counts as failed (stages that did not end ok); None when all did.

        A limit search's trials may fail on purpose (a level breaking is how it finds the limit):
        the search fails only when no trial ran at all, or when no level held and every trial
        failed hard (a server answering 503 to everything, a closed port: nothing was measured).
        """
        if self.limit is not None:
            trials = self.limit.trials
            if not trials:
                return "the limit search ran no trial"
            if self.limit.limit is None and all(trial.hard_failure for trial in trials):
                return f"no trial of the limit search could be measured ({trials[0].why})"
            return None
        failed = [s for s in self.summaries if s.status != "ok"]
        if not failed:
            return None
        first = failed[0]
        return f"{len(failed)} of {len(self.summaries)} stages {first.status}: {first.reason}"


def experiment_run(
    name: str, summaries: Sequence[StageSummary], limit: LimitLine | None = None
) -> ExperimentRun:
    """The run of `name` that produced `summaries`, its busy time from their start and end lines."""
    busy = sum(
        s.ended_unix_s - s.started_unix_s
        for s in summaries
        if s.started_unix_s is not None and s.ended_unix_s is not None
    )
    return ExperimentRun(name, tuple(summaries), busy, limit)


@dataclass(frozen=True)
class Preflight:
    """What an experiment may check before any server starts: the settings, what this
    llama-server build accepts, the model file of each quantization it will serve, and the devices
    the servers see besides the CPU (None where nothing asked: no RPC host, no expert placement)."""

    settings: Settings
    build: ServerBuild
    models: Mapping[str, Path] = field(default_factory=dict)
    devices: tuple[Device, ...] | None = None


def no_check(preflight: Preflight) -> None:
    """The check of an experiment whose settings say all there is to check."""


def runs_against_any_server(settings: Settings) -> str | None:
    """The `foreign` check of an experiment that measures the same against any server."""
    return None


FindingsT = TypeVar("FindingsT")


def nothing_more(*given: object) -> tuple[()]:
    """The gaps and notes of a report part that adds none of its own."""
    return ()


@dataclass(frozen=True)
class ComparedFigure(Generic[FindingsT]):
    """One figure of an experiment that `quantload compare` shows for two runs side by side: read
    from its findings for one model file (None: not measured), shown as text, which way is better.
    Shown, not decided: compare says no more than the difference."""

    name: str
    read: Callable[[FindingsT, str], float | None]  # (findings, quant)
    show: Callable[[float | None], str]
    lower_is_better: bool


@dataclass(frozen=True)
class ExperimentReport(Generic[FindingsT]):
    """An experiment's own part of the report. The report step asks the registry for every
    experiment that has one and uses it alike: `findings` computes what the report shows of it
    from the run's data (kept in `Analysis.findings` under the experiment's name), `chapter` shows
    them (its sections and figures, placed after the report chapter named by `follows`, in the
    registry's order), `summary` gives its keys of summary.json. Where `subject` is given, and the
    run meant to measure the experiment and has no stage of it, the report files a "not measured"
    note on `subject` under `gap_section` (None: no such note; its own `gaps` may say where it did
    not run). `gaps` files its other notes after every experiment's "not run" one; `quant_gaps`
    its notes of one model file each, with the model files' own (after the KL divergence's);
    `file_gaps` its notes of the one model file it is given, among that file's own (after its
    sweep's), file by file; `notes` what reading its files left out. `itl_gaps`: the report reads
    every inter-token gap of its records (RunData.itl_by_request), not only their summary.
    `compared`: its figures `quantload compare` sets side by side for each model file, after the
    capacity's.

    `within` names a chapter of the report's own that shows the experiment's sections among its
    others, where a chapter of the experiment's own would change the report's reading order (the
    flag experiments: "server_flags", whose chapter shell stays in the analysis with the tune's
    section; the trace replay: "traffic", before its lengths and reasoning sections). Its
    chapter's sections then come there, in the registry's order, and its summary keys go under
    that chapter's key of summary.json (server_flags; traffic has none: at the top level)."""

    findings: Callable[[ReportInput], FindingsT]
    chapter: Chapter
    summary: Callable[[FindingsT], Mapping[str, Any]]
    subject: str | None = None  # "the noisy neighbour"; None: no generic "not measured" note
    gap_section: str = ""  # the section its notes are filed under (Gap.section)
    follows: str = "server_flags"  # the chapter it follows (a name of analysis.chapters.CHAPTERS)
    gaps: Callable[[ReportInput, FindingsT], Sequence[Gap]] = nothing_more
    quant_gaps: Callable[[ReportInput], Sequence[Gap]] | None = None
    file_gaps: Callable[[ReportInput, str], Sequence[Gap]] | None = None  # (given, quant)
    notes: Callable[[FindingsT], Sequence[str]] = nothing_more
    itl_gaps: bool = False
    within: str | None = None  # the report's chapter that shows its sections (None: its own chapter)
    compared: tuple[ComparedFigure[FindingsT], ...] = ()


@dataclass(frozen=True)
class Experiment:
    """One experiment's declaration (see the module docstring)."""

    name: str
    title: str  # "load sweep {quant}"
    step: str
    chapter: str
    summary: str  # one line for help texts and docs
    missing: Callable[[Settings], str | None]
    run: Callable[[ExperimentContext], ExperimentRun]
    server_flags: ServerFlagsUse = "none"
    searches: bool = False  # its stages are trials that may fail on purpose (a limit search)
    by_default: bool = True
    check: Callable[[Preflight], None] = no_check
    # why it would measure nothing against a server quantload did not start (None: it measures)
    foreign: Callable[[Settings], str | None] = runs_against_any_server
    report: str | None = None  # the module of its ExperimentReport, REPORT (registry.reported)
