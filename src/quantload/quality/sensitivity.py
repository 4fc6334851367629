"""The sensitivity scan: which tensors resist quantization, and the smallest mix that meets the
quality limit.

From a base type (Q4_K_M), one tensor group at a time (token_embd, output, attn_q/k/v/output,
ffn_gate/up/down) is raised to a higher type (`--tensor-type PATTERN=q8_0`) or lowered to a lower
one (q3_k); each variant is quantized from the reference, its mean KLD from the reference and its
size measured, and the file removed. Groups are ranked by KLD gained per MiB (raised: KLD the
group's extra bytes buy back; lowered: KLD each MiB saved costs). The proposal is the smallest mix
predicted (adding the groups' effects) to stay within `report.max_kld_mean_nats`: from a base over
the limit, the best-paying raises until it is met; from a base within it, the cheapest lowerings
while it still holds. It is written as a `--tensor-type-file` that `prepare.mixes` can build
(`tensor_type_file`), and built and measured here when `sensitivity.build_mix` is on.

Results go to sensitivity.json as each variant is measured (schema `quantload.sensitivity/1`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from quantload.config import QualitySettings, SensitivitySettings
from quantload.errors import ConfigError
from quantload.llamacpp.quant_types import QuantTypes
from quantload.llamacpp.quantize import QuantizeOptions, quantize
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.gguf_scan import scan_gguf
from quantload.progress import ProgressCallback, no_progress
from quantload.quality.kld_measure import KldFile, PreparedBase, compare_file, prepare_base
from quantload.quality.kld_results import FLOOR_CACHE_TYPE, KldResult, mean_error_nats
from quantload.rundir import write_json_atomic
from quantload.rundir.handle import RunDir

SCHEMA = "quantload.sensitivity/1"
MIB = float(1 << 20)
# Each group's tensors, as the regular expression llama-quantize searches tensor names with.
GROUP_PATTERNS: dict[str, str] = {
    "token_embd": r"^token_embd\.weight$",
    "output": r"^output\.weight$",
    "attn_q": r"attn_q\.weight$",
    "attn_k": r"attn_k\.weight$",
    "attn_v": r"attn_v\.weight$",
    "attn_output": r"attn_output\.weight$",
    "ffn_gate": r"ffn_gate\.weight$",
    "ffn_up": r"ffn_up\.weight$",
    "ffn_down": r"ffn_down\.weight$",
}
Direction = Literal["base", "raise", "lower", "mix"]


class Variant(BaseModel):
    """One measured file of the scan."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    direction: Direction
    group: str | None
    tensor_type: str | None
    tensors: int
    size_bytes: int
    kld_mean_nats: float
    kld_mean_error_nats: float | None
    same_top_p_pct: float
    ppl_change_pct: float
    kld_change_nats: float | None = Field(description="against the base; negative = better")
    size_change_mib: float | None = Field(description="against the base")
    kld_per_mib: float | None = Field(
        description="raise: nats of KLD removed per MiB added; lower: nats added per MiB saved"
    )
    seconds: float


class Proposal(BaseModel):
    """The smallest mix predicted to meet the limit, and the file that builds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    direction: Literal["raise", "lower", "none"]
    groups: tuple[str, ...]
    overrides: tuple[str, ...]
    predicted_kld_mean_nats: float
    predicted_size_bytes: int
    meets_limit: bool
    tensor_type_file: str | None
    why: str


class SensitivityFile(BaseModel):
    """sensitivity.json."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_id: str = Field(default=SCHEMA, alias="schema")
    reference: str
    base_type: str
    raise_to: str | None
    lower_to: str | None
    limit_kld_mean_nats: float
    chunks_scored: int
    base: Variant | None = None
    variants: tuple[Variant, ...] = ()
    skipped_groups: tuple[str, ...] = ()
    proposal: Proposal | None = None
    mix: Variant | None = None
    seconds: float = 0.0
    measured_at: str = ""

    def ranking(self, direction: Literal["raise", "lower"]) -> list[Variant]:
        """The variants of one direction, best first (raise: most KLD removed per MiB; lower:
        least KLD added per MiB saved); a variant that changed no byte (the base already had
        that type for the group) comes last."""
        chosen = [v for v in self.variants if v.direction == direction]
        sign = -1.0 if direction == "raise" else 1.0
        return sorted(chosen, key=lambda v: (v.kld_per_mib is None, sign * (v.kld_per_mib or 0.0)))

    def to_json(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)


def load_sensitivity_file(path: Path) -> SensitivityFile:
    """Read sensitivity.json."""
    return SensitivityFile.model_validate_json(path.read_text(encoding="utf-8"))


def group_tensors(reference: Path, groups: Sequence[str]) -> dict[str, int]:
    """How many of the reference's tensors each group's pattern matches (0: the model has none,
    e.g. `output` when the embedding is tied)."""
    names = list(scan_gguf(reference).tensors)
    return {g: sum(1 for n in names if re.search(GROUP_PATTERNS[g], n)) for g in groups}


def _variant(
    name: str, direction: Direction, group: str | None, tensor_type: str | None, tensors: int,
    result: KldResult, base: Variant | None, seconds: float,
) -> Variant:  # fmt: skip
    size = result.model_size_bytes
    kld_change = result.kld_mean_nats - base.kld_mean_nats if base is not None else None
    size_change = (size - base.size_bytes) / MIB if base is not None else None
    per_mib = None
    if kld_change is not None and size_change:
        per_mib = -kld_change / size_change if direction == "raise" else kld_change / -size_change
    return Variant(
        name=name, direction=direction, group=group, tensor_type=tensor_type, tensors=tensors,
        size_bytes=size, kld_mean_nats=result.kld_mean_nats, kld_mean_error_nats=mean_error_nats(result),
        same_top_p_pct=result.same_top_p_pct, ppl_change_pct=result.ppl_change_pct,
        kld_change_nats=kld_change, size_change_mib=size_change, kld_per_mib=per_mib,
        seconds=round(seconds, 2),
    )  # fmt: skip


def propose(scan: SensitivityFile, tensor_type_file: Path | None) -> Proposal:
    """The smallest mix predicted to stay within the limit (see the module docstring)."""
    base = scan.base
    assert base is not None
    limit = scan.limit_kld_mean_nats
    kld, size, chosen = base.kld_mean_nats, base.size_bytes, []
    if base.kld_mean_nats > limit:
        direction: Literal["raise", "lower", "none"] = "raise"
        for variant in scan.ranking("raise"):
            if kld <= limit or variant.kld_per_mib is None or (variant.kld_change_nats or 0.0) >= 0:
                break
            kld += variant.kld_change_nats or 0.0
            size += round((variant.size_change_mib or 0.0) * MIB)
            chosen.append(variant)
        why = "the base is over the limit: the groups that buy back the most KLD per MiB are raised"
    else:
        direction = "lower"
        for variant in scan.ranking("lower"):
            step = variant.kld_change_nats or 0.0
            saves = (variant.size_change_mib or 0.0) < 0
            if variant.kld_per_mib is None or not saves or kld + max(step, 0.0) > limit:
                continue
            kld += max(step, 0.0)
            size += round((variant.size_change_mib or 0.0) * MIB)
            chosen.append(variant)
        why = "the base is within the limit: the groups that cost the least KLD per MiB saved are lowered"
    if not chosen:
        direction = "none"
        why = "no group changes the base for the better at this limit: the base type is the proposal"
    overrides = tuple(f"{GROUP_PATTERNS[v.group or '']}={v.tensor_type}" for v in chosen)
    if tensor_type_file is not None:
        tensor_type_file.parent.mkdir(parents=True, exist_ok=True)
        tensor_type_file.write_text("".join(f"{line}\n" for line in overrides), encoding="utf-8")
    return Proposal(
        direction=direction, groups=tuple(v.group or "" for v in chosen), overrides=overrides,
        predicted_kld_mean_nats=kld, predicted_size_bytes=size, meets_limit=kld <= limit,
        tensor_type_file=str(tensor_type_file) if tensor_type_file is not None else None, why=why,
    )  # fmt: skip


def scan_sensitivity(
    toolchain: Toolchain,
    reference: Path,
    text: Path,
    cache: Path,
    quality: QualitySettings,
    settings: SensitivitySettings,
    limit_nats: float,
    types: QuantTypes,
    out_dir: Path,
    progress: ProgressCallback = no_progress,
    log_dir: Path | None = None,
    on_step: Callable[[str], None] | None = None,
) -> SensitivityFile:
    """Run the scan (see the module docstring); sensitivity.json and tensor-types-<BASE>.txt are
    written in `out_dir`, the json after every measured variant."""
    base_type = types.file_type(settings.base, "sensitivity.base")
    raise_to = types.tensor_type(settings.raise_to, "sensitivity.raise_to") if settings.raise_to else None
    lower_to = types.tensor_type(settings.lower_to, "sensitivity.lower_to") if settings.lower_to else None
    if raise_to is None and lower_to is None:
        raise ConfigError("sensitivity.raise_to and sensitivity.lower_to are both empty", "set one of them")
    started = time.monotonic()
    counts = group_tensors(reference, settings.groups)
    groups = [g for g in settings.groups if counts[g]]
    files = RunDir(out_dir)
    logs = log_dir or files.logs_path
    work = files.sensitivity_work_path
    work.mkdir(parents=True, exist_ok=True)
    json_path = files.sensitivity_path
    quality = quality.model_copy(update={"kld_cache_types": (FLOOR_CACHE_TYPE,)})
    plan: list[tuple[str, Direction, str | None, str | None]] = [("base", "base", None, None)]
    plan += [(f"{g}={raise_to}", "raise", g, raise_to) for g in groups if raise_to]
    plan += [(f"{g}={lower_to}", "lower", g, lower_to) for g in groups if lower_to]
    steps = len(plan) + 2 + (1 if settings.build_mix else 0)
    progress(0, steps, "KLD base")
    base_log = logs / "sensitivity-kld-base.log"
    prepared = prepare_base(toolchain, reference, text, cache, quality, log_path=base_log)
    scan = SensitivityFile(
        reference=reference.name, base_type=base_type, raise_to=raise_to, lower_to=lower_to,
        limit_kld_mean_nats=limit_nats, chunks_scored=prepared.record.chunks_scored,
        skipped_groups=tuple(g for g in settings.groups if not counts[g]),
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )  # fmt: skip
    try:
        for index, (name, direction, group, kind) in enumerate(plan, start=1):
            progress(index, steps, name)
            if on_step is not None:
                on_step(name)
            pattern = [f"{GROUP_PATTERNS[group]}={kind}"] if group else []
            variant = _measure(
                toolchain, reference, base_type, tuple(pattern), name, direction, group, kind,
                counts.get(group or "", 0), scan.base, prepared, quality, work, logs,
            )  # fmt: skip
            if direction == "base":
                scan = scan.model_copy(update={"base": variant})
            else:
                scan = scan.model_copy(update={"variants": (*scan.variants, variant)})
            write_json_atomic(json_path, scan.to_json())
        proposal = propose(scan, files.tensor_types_path(base_type))
        scan = scan.model_copy(update={"proposal": proposal})
        write_json_atomic(json_path, scan.to_json())
        if settings.build_mix and proposal.overrides:
            progress(steps - 1, steps, "proposed mix")
            mix = _measure(
                toolchain, reference, base_type, proposal.overrides, f"{base_type}-mix", "mix", None, None,
                0, scan.base, prepared, quality, work, logs,
            )  # fmt: skip
            scan = scan.model_copy(update={"mix": mix})
    finally:
        if prepared.remove_after_use:
            prepared.path.unlink(missing_ok=True)
        for leftover in work.glob("*.gguf*"):
            leftover.unlink(missing_ok=True)
        if work.is_dir() and not any(work.iterdir()):
            work.rmdir()
    scan = scan.model_copy(update={"seconds": round(time.monotonic() - started, 1)})
    write_json_atomic(json_path, scan.to_json())
    progress(steps, steps, "done")
    return scan


def _measure(
    toolchain: Toolchain, reference: Path, base_type: str, overrides: tuple[str, ...], name: str,
    direction: Direction, group: str | None, kind: str | None, tensors: int, base: Variant | None,
    prepared: PreparedBase, quality: QualitySettings, work: Path, logs: Path,
) -> Variant:  # fmt: skip
    """Quantize one variant, compare it with the base logits, remove it."""
    started = time.monotonic()
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)
    target = work / f"{safe}.gguf"
    try:
        quantize(
            toolchain, reference, target, base_type, logs / f"sensitivity-quantize-{safe}.log",
            options=QuantizeOptions(tensor_types=overrides),
        )  # fmt: skip
        result = compare_file(
            toolchain, prepared, KldFile(name, target), FLOOR_CACHE_TYPE, reference, quality,
            log_path=logs / f"sensitivity-kld-{safe}.log",
        )  # fmt: skip
    finally:
        target.unlink(missing_ok=True)
    return _variant(name, direction, group, kind, tensors, result, base, time.monotonic() - started)
