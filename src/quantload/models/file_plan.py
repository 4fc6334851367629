"""Which files prepare makes, checked before any work: every type against the built
llama-quantize's own list, every mix's overrides, and the importance matrix each one needs.

A file's label is what every table calls it: a type (`Q4_K_M`), a type quantized with the
importance matrix (`Q4_K_M-imatrix`), or a mix's name. A type llama-quantize refuses without an
importance matrix (IQ2_XS, ...) is quantized with `prepare.imatrix` and labelled `-imatrix`, or
refused in one line when there is none. The reference file (the best precision the source has:
F32, BF16 or F16) is always made first; F16/BF16/F32 in `prepare.quants` name it or a copy of it.

A mix's override `NAME=TYPE` is a regular expression llama-quantize searches every tensor name
for (std::regex): one that does not compile is refused with the parser's reason, and once the
reference is made, one that matches none of its tensors (`check_overrides_match`) is refused too,
before any quantized file is made (it would make a copy of the mix's base type).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from quantload.config import IMATRIX_MODES, MixSettings, PrepareSettings
from quantload.errors import ConfigError
from quantload.llamacpp.quant_types import (
    NEEDS_IMATRIX,
    REFERENCE_TYPES,
    TENSOR_TYPES_NEEDING_IMATRIX,
    QuantTypes,
)
from quantload.llamacpp.quantize import QuantizeOptions

IMATRIX_SUFFIX = "-imatrix"
IMATRIX_HINT = "set prepare.imatrix = computed (or the path of an imatrix file)"


@dataclass(frozen=True)
class PlannedFile:
    """One file to make from the reference: its label, llama-quantize type and options."""

    label: str
    quant_type: str
    imatrix: bool
    options: QuantizeOptions
    recipe: str  # the type and flags in words, for the manifest and for reuse

    @property
    def is_reference_type(self) -> bool:
        return self.quant_type in REFERENCE_TYPES and not self.options.flags()


@dataclass(frozen=True)
class FilePlan:
    """Every file of the run but the reference, and whether an importance matrix is needed."""

    files: tuple[PlannedFile, ...]
    imatrix: str  # prepare.imatrix: off, computed, or a path

    @property
    def needs_imatrix(self) -> bool:
        return any(f.imatrix for f in self.files)

    def without(self, reference_type: str) -> FilePlan:
        """The plan less the file that is the reference itself (made first, on its own)."""
        kept = tuple(f for f in self.files if not (f.is_reference_type and f.quant_type == reference_type))
        return replace(self, files=kept)


def imatrix_mode(prepare: PrepareSettings) -> str:
    """`prepare.imatrix` checked: off, computed, or a file that exists and is not empty."""
    mode = prepare.imatrix.strip()
    if mode.lower() in IMATRIX_MODES:
        return mode.lower()
    path = Path(mode).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"prepare.imatrix = {mode!r}: no such file", "use off, computed, or the path of an imatrix file"
        )
    if path.stat().st_size == 0:
        raise ConfigError(f"prepare.imatrix = {mode!r} is empty", "give the imatrix file llama-imatrix wrote")
    return str(path.resolve())


def _type_file(prepare: PrepareSettings, label: str, types: QuantTypes, with_imatrix: bool) -> PlannedFile:
    wanted_imatrix = label.endswith(IMATRIX_SUFFIX)
    name = label.removesuffix(IMATRIX_SUFFIX) if wanted_imatrix else label
    quant_type = types.file_type(name, "prepare.quants")
    needs = quant_type in NEEDS_IMATRIX
    if (wanted_imatrix or needs) and not with_imatrix:
        why = "needs an importance matrix (llama-quantize refuses it without one)" if needs else (
            "asks for an importance matrix, and prepare.imatrix is off"
        )
        raise ConfigError(f"prepare.quants: {label} {why}", IMATRIX_HINT)
    imatrix = wanted_imatrix or needs
    if imatrix and quant_type in REFERENCE_TYPES:
        raise ConfigError(
            f"prepare.quants: {label}: {quant_type} is not quantized, so an importance matrix does nothing",
            f"write {quant_type}",
        )
    shown = f"{quant_type}{IMATRIX_SUFFIX}" if imatrix else quant_type
    return PlannedFile(shown, quant_type, imatrix, QuantizeOptions(), shown)


def _overrides(mix: MixSettings, types: QuantTypes) -> tuple[tuple[str, ...], list[str]]:
    """The mix's NAME=TYPE overrides, checked; and every tensor type it names."""
    where = f"prepare.mixes {mix.name}"
    checked, named = [], []
    lines = list(mix.tensor_types)
    if mix.tensor_type_file is not None:
        path = mix.tensor_type_file.expanduser()
        if not path.is_file():
            raise ConfigError(f"{where}: tensor_type_file {path} does not exist", "check the path")
        lines += path.read_text(encoding="utf-8", errors="replace").split()
    for item in lines:
        pattern, eq, kind = item.partition("=")
        if not eq or not pattern or not kind:
            raise ConfigError(f"{where}: {item!r} is not NAME=TYPE", "e.g. attn_v=q8_0")
        try:
            re.compile(pattern)
        except re.error as error:
            raise ConfigError(
                f"{where}: {pattern!r} is not a pattern llama-quantize can read ({error})",
                r"give a tensor name or a regular expression searched in tensor names, e.g. attn_v or"
                r" blk\.[0-3]\.attn_v",
            ) from None
        checked.append(f"{pattern}={types.tensor_type(kind, where)}")
        named.append(kind.lower())
    return tuple(checked), named


def check_overrides_match(plan: FilePlan, tensor_names: Sequence[str]) -> None:
    """ConfigError for a mix override that matches none of the model's tensors (`tensor_names`,
    the reference's)."""
    for item in plan.files:
        for override in item.options.tensor_types:
            pattern = override.partition("=")[0]
            if not any(re.search(pattern, name) for name in tensor_names):
                examples = ", ".join(sorted(tensor_names)[:4])
                raise ConfigError(
                    f"prepare.mixes {item.label}: {override} matches none of the model's tensors, so the"
                    f" file would be its base type {item.quant_type} (tensors are named like {examples})",
                    "name a part of tensor names, e.g. attn_v or ffn_down",
                )


def _mix_file(mix: MixSettings, types: QuantTypes, with_imatrix: bool) -> PlannedFile:
    where = f"prepare.mixes {mix.name}"
    base = types.file_type(mix.base, f"{where} base")
    overrides, named = _overrides(mix, types)
    output = types.tensor_type(mix.output_tensor_type, where) if mix.output_tensor_type else None
    embedding = types.tensor_type(mix.token_embedding_type, where) if mix.token_embedding_type else None
    needs = base in NEEDS_IMATRIX or bool(set(named) & TENSOR_TYPES_NEEDING_IMATRIX)
    if (needs or mix.imatrix) and not with_imatrix:
        why = "needs an importance matrix (its types are refused without one)" if needs else (
            "asks for an importance matrix, and prepare.imatrix is off"
        )
        raise ConfigError(f"{where} {why}", IMATRIX_HINT)
    options = QuantizeOptions(
        tensor_types=overrides, output_tensor_type=output, token_embedding_type=embedding
    )  # the file's overrides are passed one by one, so the recipe says them all
    with_matrix = " with the importance matrix" if needs or mix.imatrix else ""
    recipe = " ".join([base, *options.flags()]) + with_matrix
    return PlannedFile(mix.name, base, needs or mix.imatrix, options, recipe)


def plan_files(prepare: PrepareSettings, types: QuantTypes) -> FilePlan:
    """The files `prepare` asks for, checked (ConfigError naming the setting and the fix)."""
    mode = imatrix_mode(prepare)
    with_imatrix = mode != "off"
    files = [_type_file(prepare, label, types, with_imatrix) for label in prepare.quants]
    files += [_mix_file(mix, types, with_imatrix) for mix in prepare.mixes]
    seen: set[str] = set()
    for item in files:
        if item.label in seen:
            raise ConfigError(
                f"prepare.quants and prepare.mixes name {item.label} twice", "give every file its own label"
            )
        seen.add(item.label)
    if len(files) > prepare.max_files:
        raise ConfigError(
            f"prepare asks for {len(files)} files, more than prepare.max_files = {prepare.max_files}",
            "measure fewer at once, or raise prepare.max_files",
        )
    return FilePlan(tuple(files), mode)
