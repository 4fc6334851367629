"""Workloads made for one served target from the settings: files read, the server's tokenizer asked.

`WorkloadBuilder(settings, target)` reads what a workload needs once: the prompt set, the dataset
or trace file (a bad file is a one-line error naming the line before any load starts), and, for
synthetic prompts, the target's tokenizer, chat-template overhead, slot count and context
(`quantload.load.synthetic`). Nothing here sends load.
"""

from __future__ import annotations

__all__ = ["WorkloadBuilder", "ignored_flags", "read_named_dataset"]

from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from quantload.config import Settings
from quantload.errors import ConfigError
from quantload.load.datasets import Dataset, read_dataset
from quantload.load.lengths import parse_length_distribution
from quantload.load.prompts import Prompt, estimate_tokens, select_prompts
from quantload.load.synthetic import PromptMaker, ServerTokenizer
from quantload.load.trace import TraceRequest, read_trace
from quantload.load.workloads import (
    DatasetWorkload,
    LengthsWorkload,
    PromptSetWorkload,
    SessionWorkload,
    TraceWorkload,
    Workload,
)
from quantload.progress import ProgressCallback, no_progress
from quantload.served import ServedTarget

ALL_PROMPTS = 1_000_000


def _path(text: str, cwd: Path) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else cwd / path


def read_named_dataset(
    text: str | None, key: str, cwd: Path, progress: ProgressCallback = no_progress
) -> Dataset:
    """The dataset file the setting `key` names (`text`, relative to `cwd`); a ConfigError where it
    names none."""
    if not text:
        raise ConfigError(
            f"no dataset given for this workload ({key} is unset)",
            f"set {key} to a ShareGPT JSON or JSONL file",
        )
    return read_dataset(_path(text, cwd), progress)


def ignored_flags(settings: Settings, given: Mapping[str, Any]) -> list[str]:
    """A warning line for each setting in `given` (dotted keys of the flags a user set) that the
    chosen workload does not read, naming the setting it reads instead."""
    kind = settings.workload.kind
    lines = []
    if kind != "prompts" and given.get("load.prompt_count") is not None:
        key, value, what = (
            ("sessions.count", settings.sessions.count, "conversations")
            if kind == "sessions"
            else ("workload.requests", settings.workload.requests, "requests")
        )
        variable = "QUANTLOAD_" + key.upper().replace(".", "__")
        lines.append(
            f"--prompt-count sets a stage of the prompts workload; the {kind} workload's stages send"
            f" {key} = {value} {what} each (set it in quantload.toml or {variable})"
        )
    for key, flag, reader in (
        ("workload.input_lengths", "--input-lengths", "lengths"),
        ("workload.dataset", "--dataset", "dataset"),
    ):
        if kind != reader and given.get(key) is not None:
            lines.append(f"{flag} is read by the {reader} workload only, not by {kind} (--workload {reader})")
    return lines


class WorkloadBuilder:
    """Every workload kind for one target (see the module docstring). Close it when done."""

    def __init__(
        self,
        settings: Settings,
        target: ServedTarget,
        cwd: Path | None = None,
        progress: ProgressCallback = no_progress,
    ) -> None:
        self.settings = settings
        self.target = target
        self.cwd = cwd or Path.cwd()
        self.progress = progress  # hears how the reading of a big dataset file goes
        self._tokenizer: ServerTokenizer | None = None

    # ------------------------------------------------------------------ the server's side

    @property
    def tokenizer(self) -> ServerTokenizer:
        if self._tokenizer is None:
            self._tokenizer = ServerTokenizer(self.target.url, self.target.api_key_text)
        return self._tokenizer

    @cached_property
    def maker(self) -> PromptMaker:
        return PromptMaker(self.tokenizer)

    @cached_property
    def slots_and_context(self) -> tuple[int | None, int | None]:
        return self.tokenizer.slots_and_context()

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` by the target's tokenizer."""
        return len(self.tokenizer.tokenize(text))

    def close(self) -> None:
        if self._tokenizer is not None:
            self._tokenizer.close()

    def __enter__(self) -> WorkloadBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ files

    @cached_property
    def prompts(self) -> list[Prompt]:
        """The whole prompt set within the length bounds (cycled by the workload when short)."""
        load = self.settings.load
        return select_prompts(
            load.prompts, ALL_PROMPTS, load.min_prompt_tokens, load.max_prompt_tokens, self.cwd
        )

    def dataset(self, text: str | None, key: str) -> Dataset:
        return read_named_dataset(text, key, self.cwd, self.progress)

    @cached_property
    def trace(self) -> list[TraceRequest]:
        text = self.settings.trace.path
        if not text:
            raise ConfigError("no trace given (trace.path is unset)", "set trace.path to a JSONL trace")
        return read_trace(_path(text, self.cwd))[: self.settings.trace.max_requests]

    # ------------------------------------------------------------------ workloads

    def prompt_set(self) -> PromptSetWorkload:
        return PromptSetWorkload(self.prompts, self.settings.load.prompts)

    def workload(self, kind: str | None = None) -> Workload:
        """The workload `kind` (default workload.kind)."""
        chosen = kind or self.settings.workload.kind
        work = self.settings.workload
        context = self.slots_and_context[1] if chosen != "prompts" else None
        if chosen == "prompts":
            return self.prompt_set()
        if chosen == "lengths":
            return LengthsWorkload(
                self.maker,
                parse_length_distribution(work.input_lengths),
                parse_length_distribution(work.output_lengths),
                context,
            )
        if chosen == "dataset":
            return DatasetWorkload(
                self.dataset(work.dataset, "workload.dataset"),
                self.count_tokens,
                self.maker.overhead_tokens,
                work.max_output_tokens,
                parse_length_distribution(work.output_lengths),
            )
        if chosen == "trace":
            return self.trace_workload()
        if chosen == "sessions":
            return self.sessions()
        raise ConfigError(f"unknown workload {chosen!r}", "prompts, lengths, dataset, sessions or trace")

    def trace_workload(self) -> TraceWorkload:
        return TraceWorkload(self.maker, self.trace, self.slots_and_context[1], str(self.settings.trace.path))

    def sessions(self) -> SessionWorkload:
        sessions = self.settings.sessions
        slots, context = self.slots_and_context
        if sessions.affinity == "id_slot" and slots is None:
            raise ConfigError(
                f"{self.target.url}/props does not say how many slots the server has",
                "sessions.affinity = id_slot needs llama-server's /props; use affinity none",
            )
        dataset = self.dataset(sessions.dataset, "sessions.dataset") if sessions.dataset else None
        return SessionWorkload(
            turns=sessions.turns,
            think_time_s=sessions.think_time_s,
            reply_tokens=parse_length_distribution(sessions.reply_tokens),
            maker=self.maker,
            turn_tokens=parse_length_distribution(sessions.turn_tokens) if dataset is None else None,
            dataset=dataset,
            count_tokens=self.count_tokens if dataset is not None else estimate_tokens,
            max_output_tokens=self.settings.workload.max_output_tokens,
            slots=slots if sessions.affinity == "id_slot" else None,
            context_tokens=context,
        )
