"""Running llama-quantize."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from quantload.childproc import die_with_parent
from quantload.errors import ModelError
from quantload.llamacpp.toolchain import Toolchain
from quantload.progress import ProgressCallback, no_progress

_TENSOR_STEP = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]")


def quantize(
    toolchain: Toolchain,
    source: Path,
    target: Path,
    quant_type: str,
    log_path: Path,
    allow_requantize: bool = False,
    progress: ProgressCallback = no_progress,
) -> None:
    """Write `target` as `quant_type` from `source`; raise ModelError with llama-quantize's reason."""
    command = [str(toolchain.path("llama-quantize"))]
    if allow_requantize:
        command.append("--allow-requantize")
    command += [str(source), str(target), quant_type]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", encoding="utf-8") as log:
        log.write("$ " + " ".join(command) + "\n")
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=die_with_parent(),
        )
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            step = _TENSOR_STEP.match(line)
            if step:
                progress(int(step.group(1)), int(step.group(2)), quant_type)
        code = process.wait()
    if code != 0:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        reason = next((ln for ln in reversed(lines) if "error" in ln.lower() or "failed" in ln.lower()),
                      lines[-1] if lines else "no output")
        raise ModelError(
            f"llama-quantize could not make {quant_type} from {source.name}: {reason[-200:]}",
            f"see {log_path}",
        )
