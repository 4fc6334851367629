"""The toolchain tests' shared pieces: shell scripts standing in for the llama.cpp tools (importable
as `toolchain_fakes`: pytest puts tests/ on sys.path). Used by tests/unit/test_toolchain.py, which
only writes them, and tests/integration/test_toolchain_processes.py, which runs them."""

from __future__ import annotations

import stat
from pathlib import Path

# the four required tools as they answer quantload's start check (llama-quantize exits 1 on it)
WORKING = {
    "llama-server": 'echo "version: 1234 (abc)" >&2',
    "llama-perplexity": 'echo "version: 1234 (abc)" >&2',
    "llama-bench": 'echo "version: 1234 (abc)"',
    "llama-quantize": 'echo "usage: llama-quantize [--help] model-f32.gguf type" >&2; exit 1',
}

RPC_HELP = 'echo "Usage: ggml-rpc-server [options]" >&2'
VERSION = 'echo "version: 1234 (abc)" >&2'  # llama-imatrix's and llama-batched-bench's --version


def write_tools(folder: Path, scripts: dict[str, str]) -> None:
    """Each script as an executable `#!/bin/sh` file of its tool's name in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        tool = folder / name
        tool.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
