"""The slots experiment's run: a limit search on the server restarted with each -np, the KV budget
split into that many slots (the experiment as a whole: the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass

from quantload.config import Settings
from quantload.errors import ConfigError, ServerError
from quantload.experiments.base import (
    ExperimentContext,
    ExperimentRun,
    Preflight,
    ServerFlags,
    experiment_run,
)
from quantload.experiments.limit_trials import run_limit_search
from quantload.experiments.variant_file import append_variant, variant_line
from quantload.kvcache import CELL_PADDING
from quantload.load.summary import StageSummary
from quantload.load.supervisor import LoadError

NAME = "slots"


@dataclass(frozen=True)
class SlotLayout:
    """One point of the experiment: slots and the context each holds, all within the budget."""

    slots: int
    ctx_per_slot: int

    @property
    def label(self) -> str:
        return f"{NAME} -np {self.slots} -c {self.slots * self.ctx_per_slot}"

    def flags(self) -> ServerFlags:
        return ServerFlags(slots=self.slots, ctx_per_slot=self.ctx_per_slot, label=self.label)


def kv_budget_cells(settings: Settings) -> int:
    """The KV cells every layout shares: `slots.kv_cells`, or the run's slots x context per slot."""
    return settings.slots.kv_cells or settings.server.slots * settings.server.ctx_per_slot


def slot_layouts(settings: Settings) -> list[SlotLayout]:
    """One layout per slot count; ConfigError when the budget does not split exactly."""
    budget = kv_budget_cells(settings)
    layouts = []
    for slots in settings.slots.counts:
        per_slot, left = divmod(budget, slots)
        if left or per_slot % CELL_PADDING or per_slot < CELL_PADDING:
            whole = CELL_PADDING * max(settings.slots.counts)
            raise ConfigError(
                f"a KV budget of {budget:,} cells does not split into {slots} slots of a whole multiple"
                f" of {CELL_PADDING} cells (llama.cpp pads each slot), so the KV cache would not stay"
                " the same size",
                f"set slots.kv_cells to a multiple of {whole:,}",
            )
        layouts.append(SlotLayout(slots, per_slot))
    return layouts


def check(preflight: Preflight) -> None:
    slot_layouts(preflight.settings)


def run(context: ExperimentContext) -> ExperimentRun:
    if context.servers is None:
        raise ConfigError(
            "the slots experiment restarts llama-server with each -np", "run it through `quantload run`"
        )
    summaries: list[StageSummary] = []
    failed: list[str] = []
    layouts = slot_layouts(context.settings)
    for layout in layouts:
        note = f"{context.target.name}: -np {layout.slots}, {layout.ctx_per_slot:,} tokens per slot"
        context.run.progress(0, None, note)
        try:
            with context.servers.variant(layout.flags()) as variant:
                searched = run_limit_search(
                    "limit_users", ExperimentContext(context.run, variant.target), variant=layout.label
                )
                summaries += searched.summaries
                append_variant(context.run.run_dir, variant_line(context.run.run_id, NAME, variant))
        except ServerError as error:  # a layout whose server cannot be had does not stop the others
            failed.append(f"-np {layout.slots}: {error.one_line()}")
    if failed:
        raise LoadError(
            f"the slots experiment searched {len(layouts) - len(failed)} of {len(layouts)} slot counts;"
            f" {'; '.join(failed)}",
            "the searches it did run are in limits.jsonl",
        )
    done = experiment_run(NAME, summaries)
    return ExperimentRun(NAME, (), done.busy_s)  # its stages are trials that may fail on purpose
