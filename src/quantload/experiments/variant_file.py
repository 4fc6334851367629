"""variants.jsonl (schema `quantload.variant/1`): one line per server variant the flag experiments
(batching, slots, speculation) and `quantload tune` ran, written when the variant stops.

Each line names the experiment, the server and quantization, the variant's label and the exact
flags added to the server's own, the KV cache as predicted and as the variant's server logged it
(or why it could not be checked), the memory its log reports (every model, KV, output and compute
buffer), and, for speculative decoding, whether the server speculated and its own draft counters.
The report reads these lines beside the stages and limit searches that carry the same label.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from quantload.experiments.base import ServedVariant
from quantload.load.records import JsonlAppender
from quantload.rundir.handle import RunDir
from quantload.rundir.jsonl import BadLines, iter_jsonl

VARIANT_SCHEMA = "quantload.variant/1"


class SpeculationCheck(BaseModel):
    """Whether a variant's server speculated, and what its own counters say."""

    model_config = ConfigDict(extra="ignore")

    speculating: bool
    why: str  # the reason it is not, or what shows it is
    slots_speculative: bool | None = None  # /slots `speculative` of every slot
    draft_tokens: float | None = None  # /metrics spec_decode_num_draft_tokens_total
    accepted_tokens: float | None = None  # /metrics spec_decode_num_accepted_tokens_total
    drafts: float | None = None  # /metrics spec_decode_num_drafts_total

    @property
    def acceptance(self) -> float | None:
        if not self.draft_tokens or self.accepted_tokens is None:
            return None
        return self.accepted_tokens / self.draft_tokens


class VariantLine(BaseModel):
    """One server variant as variants.jsonl keeps it."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_: str = Field(default=VARIANT_SCHEMA, alias="schema")
    run_id: str
    experiment: str
    server: str
    quant: str
    label: str
    args: list[str]
    slots: int | None = None
    ctx_per_slot: int | None = None
    kv: dict[str, Any] | None = None  # quantload.kvcheck.KvCheck.as_dict
    kv_error: str | None = None
    memory_mib: float | None = None  # every buffer the server's log reports
    speculation: SpeculationCheck | None = None
    unix_s: float

    @classmethod
    def from_json_line(cls, line: str) -> VariantLine:
        return cls.model_validate_json(line)


def memory_mib(variant: ServedVariant) -> float | None:
    """What the variant's server allocated as its log says: every buffer, MiB."""
    if variant.kv is None or not variant.kv.buffers:
        return None
    return round(sum(line.mib for line in variant.kv.buffers), 2)


def variant_line(
    run_id: str,
    experiment: str,
    variant: ServedVariant,
    speculation: SpeculationCheck | None = None,
) -> VariantLine:
    """The line of one variant that ran."""
    flags = variant.flags
    return VariantLine(
        run_id=run_id,
        experiment=experiment,
        server=variant.target.name,
        quant=variant.target.quant,
        label=flags.label,
        args=list(flags.extra_args),
        slots=flags.slots,
        ctx_per_slot=flags.ctx_per_slot,
        kv=variant.kv.as_dict() if variant.kv is not None else None,
        kv_error=variant.kv_error,
        memory_mib=memory_mib(variant),
        speculation=speculation,
        unix_s=time.time(),
    )


def append_variant(run_dir: RunDir, line: VariantLine) -> None:
    """One line appended to the run's variants.jsonl."""
    appender = JsonlAppender(run_dir.variants_path)
    try:
        appender.append_line(line.model_dump_json(by_alias=True))
    finally:
        appender.close()


def read_variants(run_dir: Path, bad: BadLines | None = None) -> list[VariantLine]:
    """Every variant line of a run folder; an unreadable one is counted in `bad`."""
    return list(iter_jsonl(RunDir(run_dir).variants_path, VariantLine.from_json_line, bad))
