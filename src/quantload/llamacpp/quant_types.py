"""The types llama-quantize accepts, read from the built binary's own list, and checking names
against it (a typo is answered with the nearest names).

`llama-quantize --help` ends with its table of allowed types (`tools/quantize/quantize.cpp`,
`usage()`): one line per type, `  15  or  Q4_K_M  :  4.58G, +0.1754 ppl @ Llama-3-8B`, COPY
without a number. Per-tensor overrides (`--tensor-type NAME=TYPE`, `--output-tensor-type`,
`--token-embedding-type`) take ggml tensor types instead (q8_0, q6_k, f16, ...), which gguf-py
lists (`gguf.GGMLQuantizationType`).
"""

from __future__ import annotations

import difflib
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from quantload.errors import ConfigError, ToolchainError
from quantload.llamacpp.toolchain import Toolchain

_TYPE_LINE = re.compile(r"^\s*(?:\d+\s+or\s+)?([A-Z][A-Z0-9_]*)\s+:")
_TABLE_TITLE = "allowed quantization types"
REFERENCE_TYPES: tuple[str, ...] = ("F32", "BF16", "F16")  # best precision first
NOT_A_FILE_TYPE = frozenset({"COPY"})
# llama-quantize refuses these without an importance matrix: their tensors' types are the
# low-bit ones `tensor_requires_imatrix` names (src/llama-quant.cpp: IQ1_S, IQ1_M, IQ2_XXS,
# IQ2_XS, IQ2_S, IQ3_XXS, and Q2_K inside a Q2_K_S file), by `llama_ftype_get_default_type` and
# the mixture rules. tests/integration/test_quant_types.py checks the list against the binary's
# own --dry-run, which says when a quantization "will require an imatrix".
NEEDS_IMATRIX: frozenset[str] = frozenset(
    {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"}
)
TENSOR_TYPES_NEEDING_IMATRIX: frozenset[str] = frozenset(
    {"iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs"}
)


@dataclass(frozen=True)
class QuantTypes:
    """What one llama-quantize accepts: its file types, and the ggml tensor types of overrides."""

    file_types: tuple[str, ...]
    tensor_types: tuple[str, ...]

    def file_type(self, name: str, where: str) -> str:
        """The canonical spelling of file type `name` (case-insensitive, as llama-quantize reads
        it); ConfigError naming `where` and the nearest names when it is not one."""
        upper = name.upper()
        if upper in self.file_types and upper not in NOT_A_FILE_TYPE:
            return upper
        if upper in NOT_A_FILE_TYPE:
            raise ConfigError(
                f"{where}: {name!r} is llama-quantize's copy of the source's tensors as they are, not a"
                " quantization: the file would be the reference again",
                "the reference file is listed as F16 (or BF16, F32); leave COPY out",
            )
        choices = [t for t in self.file_types if t not in NOT_A_FILE_TYPE]
        raise ConfigError(
            f"{where}: {name!r} is not a type this llama-quantize knows{_nearest(upper, choices)}",
            f"its types: {', '.join(choices)}",
        )

    def tensor_type(self, name: str, where: str) -> str:
        """A ggml tensor type for an override (lower case, e.g. q8_0); ConfigError otherwise."""
        lower = name.lower()
        if lower in self.tensor_types:
            return lower
        raise ConfigError(
            f"{where}: {name!r} is not a ggml tensor type{_nearest(lower, self.tensor_types)}",
            f"tensor types: {', '.join(self.tensor_types)}",
        )


def _nearest(name: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    return f" (nearest: {', '.join(close)})" if close else ""


def parse_type_table(help_text: str) -> tuple[str, ...]:
    """The type names in llama-quantize's usage text, in its order (empty when there is no table)."""
    _, found, table = help_text.partition(_TABLE_TITLE)
    if not found:
        return ()
    names = [m.group(1) for line in table.splitlines() if (m := _TYPE_LINE.match(line))]
    return tuple(dict.fromkeys(names))


def ggml_tensor_types() -> tuple[str, ...]:
    """Every ggml tensor type gguf-py knows, lower case (what --tensor-type parses)."""
    from gguf.constants import GGMLQuantizationType

    return tuple(kind.name.lower() for kind in GGMLQuantizationType)


def quant_types(toolchain: Toolchain) -> QuantTypes:
    """The types of this toolchain's llama-quantize (it prints them for --help and exits 1)."""
    tool = toolchain.path("llama-quantize")
    try:
        result = subprocess.run(
            [str(tool), "--help"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ToolchainError(f"{tool} --help failed: {error}", "rebuild or reinstall llama.cpp") from None
    names = parse_type_table(result.stdout + result.stderr)
    if not names:
        raise ToolchainError(
            f"{tool} --help printed no table of allowed quantization types",
            "use the pinned llama.cpp build (unset QUANTLOAD_LLAMA_BIN)",
        )
    return QuantTypes(file_types=names, tensor_types=ggml_tensor_types())
