"""The `quant` and `model` labels of a target, read from `/props` when not configured.

`/props` gives `model_ftype` (llama.cpp's name of the file type, e.g. "Q4_K - Medium") and
`model_path`. The quant label is the ftype in file-name spelling (Q4_K_M); the model label is
the GGUF file's stem with the quant removed (`tiny-Q4_K_M.gguf` -> `tiny`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

UNKNOWN = "unknown"
_SIZE_SUFFIX = {"Small": "S", "Medium": "M", "Large": "L"}
_QUANT_IN_NAME = re.compile(
    r"(?:^|[-_.])((?:I?Q\d+(?:_[0-9A-Z]+)*)|BF16|F16|FP16|F32)(?=$|[-_.])", re.IGNORECASE
)


@dataclass(frozen=True)
class Discovered:
    """Labels learnt from a server; empty strings when it did not say."""

    quant: str
    model: str


def quant_from_ftype(ftype: str) -> str:
    """`"Q4_K - Medium"` -> `"Q4_K_M"`, `"Q8_0"` -> `"Q8_0"`, `"all F32"` -> `"F32"`."""
    text = ftype.replace("(guessed)", "").strip()
    if text.startswith("all "):
        text = text[4:]
    base, _, rest = text.partition(" - ")
    suffix = _SIZE_SUFFIX.get(rest.strip())
    base = base.strip().replace(" ", "_")
    return f"{base}_{suffix}" if suffix and base.endswith("_K") else base


def quant_from_filename(path: str) -> str:
    """The quantization named in a GGUF file name, upper-cased, or '' when none is."""
    match = _QUANT_IN_NAME.search(PurePath(path).stem)
    if match is None:
        return ""
    quant = match[1].upper()
    return "F16" if quant == "FP16" else quant


def model_from_filename(path: str) -> str:
    """The GGUF file's stem without its quantization part."""
    stem = PurePath(path).stem
    match = _QUANT_IN_NAME.search(stem)
    if match is not None:
        stem = (stem[: match.start()] + stem[match.end() :]).strip("-_.")
    return stem


def discover(props: Any) -> Discovered:
    """Labels from a decoded `/props` answer (anything else gives empty labels)."""
    if not isinstance(props, dict):
        return Discovered("", "")
    path = props.get("model_path")
    path = path if isinstance(path, str) else ""
    ftype = props.get("model_ftype")
    quant = quant_from_ftype(ftype) if isinstance(ftype, str) and ftype else ""
    return Discovered(quant or quant_from_filename(path), model_from_filename(path) if path else "")
