"""Running llama-quantize: a type, with an importance matrix and per-tensor types where asked, or
a dry run that says the size and whether an importance matrix would be needed, writing nothing."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from quantload.childproc import start_child, stop_group
from quantload.errors import ModelError
from quantload.llamacpp.toolchain import Toolchain
from quantload.progress import ProgressCallback, no_progress

_TENSOR_STEP = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]")
_QUANT_SIZE = re.compile(r"quant size\s*=\s*([\d.]+) MiB")
_NEEDS_IMATRIX = "will require an imatrix"
MIB = 1 << 20
DRY_RUN_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class QuantizeOptions:
    """How llama-quantize makes one file beyond its type (`tools/quantize/quantize.cpp` flags)."""

    imatrix: Path | None = None
    tensor_types: tuple[str, ...] = ()  # NAME=TYPE, --tensor-type (repeated)
    tensor_type_file: Path | None = None
    output_tensor_type: str | None = None
    token_embedding_type: str | None = None
    allow_requantize: bool = False
    extra: tuple[str, ...] = field(default=())

    def flags(self) -> list[str]:
        """The command-line flags, in llama-quantize's spelling."""
        flags: list[str] = []
        if self.allow_requantize:
            flags.append("--allow-requantize")
        if self.imatrix is not None:
            flags += ["--imatrix", str(self.imatrix)]
        for item in self.tensor_types:
            flags += ["--tensor-type", item]
        if self.tensor_type_file is not None:
            flags += ["--tensor-type-file", str(self.tensor_type_file)]
        if self.output_tensor_type:
            flags += ["--output-tensor-type", self.output_tensor_type]
        if self.token_embedding_type:
            flags += ["--token-embedding-type", self.token_embedding_type]
        return flags + list(self.extra)


@dataclass(frozen=True)
class DryRun:
    """What `--dry-run` said: the file's tensor bytes, and whether it needs an importance matrix."""

    quant_size_bytes: int
    needs_imatrix: bool


def _reason(log_path: Path) -> str:
    lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    wanted = ("error", "failed", "missing importance", "invalid", "malformed")
    return next((ln for ln in reversed(lines) if any(w in ln.lower() for w in wanted)),
                lines[-1] if lines else "no output")  # fmt: skip


def _run(command: list[str], log_path: Path, label: str, progress: ProgressCallback) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", encoding="utf-8") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        process = start_child(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        try:
            for line in process.stdout:
                log.write(line)
                step = _TENSOR_STEP.match(line)
                if step:
                    progress(int(step.group(1)), int(step.group(2)), label)
            return process.wait()
        finally:
            stop_group(process)  # interrupted: the tool goes too; ended: nothing of it is left


def quantize(
    toolchain: Toolchain,
    source: Path,
    target: Path,
    quant_type: str,
    log_path: Path,
    allow_requantize: bool = False,
    progress: ProgressCallback = no_progress,
    options: QuantizeOptions | None = None,
) -> None:
    """Write `target` as `quant_type` from `source`; raise ModelError with llama-quantize's reason."""
    chosen = options or QuantizeOptions()
    if allow_requantize and not chosen.allow_requantize:
        chosen = QuantizeOptions(**{**chosen.__dict__, "allow_requantize": True})
    command = [str(toolchain.path("llama-quantize")), *chosen.flags(), str(source), str(target), quant_type]
    if _run(command, log_path, quant_type, progress) != 0:
        raise ModelError(
            f"llama-quantize could not make {quant_type} from {source.name}: {_reason(log_path)[-200:]}",
            f"see {log_path}",
        )


def dry_run(
    toolchain: Toolchain,
    source: Path,
    quant_type: str,
    log_path: Path,
    options: QuantizeOptions | None = None,
) -> DryRun:
    """`llama-quantize --dry-run`: the size `quant_type` would have, and whether it needs an
    importance matrix; nothing is written."""
    chosen = options or QuantizeOptions()
    command = [str(toolchain.path("llama-quantize")), "--dry-run", *chosen.flags(), str(source), quant_type]
    if _run(command, log_path, quant_type, no_progress) != 0:
        raise ModelError(
            f"llama-quantize --dry-run {quant_type} of {source.name} failed: {_reason(log_path)[-200:]}",
            f"see {log_path}",
        )
    text = log_path.read_text(errors="replace")
    sizes = _QUANT_SIZE.findall(text)
    if not sizes:
        raise ModelError(
            f"llama-quantize --dry-run printed no quant size for {quant_type}", f"see {log_path}"
        )
    return DryRun(round(float(sizes[-1]) * MIB), _NEEDS_IMATRIX in text)
