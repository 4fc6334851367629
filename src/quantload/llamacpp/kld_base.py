"""The KL-divergence base logits file that `llama-perplexity --kl-divergence-base FILE` writes.

Layout, as `perplexity()` in tools/perplexity/perplexity.cpp writes it (little-endian)::

    "_logits_"                      8 bytes
    n_ctx                           uint32
    n_vocab, n_chunk                int32 each
    tokens[n_ctx * n_chunk]         int32 each: the tokenized text the chunks were cut from
    per chunk, per scored token     nv uint16 values, nv = 2 * ((n_vocab + 1) / 2) + 4
      (scored tokens per chunk: n_ctx - 1 - n_ctx/2; the first 4 values of a row hold two floats,
       the scale and the minimum of that token's log-probabilities, the rest one value per token)

The tool writes it through an unchecked `std::ofstream`: a full disk leaves a short file behind
and no error. So quantload computes the size first, checks the free space, and checks the size of
the file it got against the prediction.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from quantload.errors import ConfigError, MeasurementError
from quantload.llamacpp.perplexity import tokens_scored_per_chunk

MAGIC = b"_logits_"
HEADER = struct.Struct("<8sIii")
TOKEN_BYTES = 4
LOG_PROB_BYTES = 2
# Free space kept beyond the file itself, so writing the base never fills the disk to the brim.
DISK_HEADROOM_BYTES = 256 * 1024 * 1024


def row_values(n_vocab: int) -> int:
    """uint16 values stored per scored token: the vocabulary rounded up to even, plus 4."""
    return 2 * ((n_vocab + 1) // 2) + 4


def base_file_size_bytes(n_vocab: int, ctx_tokens: int, n_chunks: int) -> int:
    """The exact size of a base file for `n_chunks` chunks of `ctx_tokens` tokens."""
    tokens = ctx_tokens * n_chunks * TOKEN_BYTES
    log_probs = n_chunks * tokens_scored_per_chunk(ctx_tokens) * row_values(n_vocab) * LOG_PROB_BYTES
    return HEADER.size + tokens + log_probs


@dataclass(frozen=True)
class BaseHeader:
    """What a base file's header says it holds."""

    ctx_tokens: int
    n_vocab: int
    n_chunks: int

    @property
    def expected_size_bytes(self) -> int:
        """The size the whole file must have."""
        return base_file_size_bytes(self.n_vocab, self.ctx_tokens, self.n_chunks)

    @property
    def tokens_scored(self) -> int:
        """Tokens whose distributions the file holds."""
        return self.n_chunks * tokens_scored_per_chunk(self.ctx_tokens)


def read_base_header(path: Path) -> BaseHeader:
    """The header of a base file; MeasurementError if it is not one."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(HEADER.size)
    except OSError as error:
        raise MeasurementError(f"cannot read the KLD base file {path}: {error}", "measure it again") from None
    if len(raw) < HEADER.size or not raw.startswith(MAGIC):
        raise MeasurementError(
            f"{path} is not a llama-perplexity base logits file (no '_logits_' header)",
            "delete it; quantload writes a new one",
        )
    _, ctx_tokens, n_vocab, n_chunks = HEADER.unpack(raw)
    return BaseHeader(ctx_tokens=ctx_tokens, n_vocab=n_vocab, n_chunks=n_chunks)


def check_base_file(path: Path) -> BaseHeader:
    """The header of a complete base file; MeasurementError if the file is short or long."""
    header = read_base_header(path)
    size = path.stat().st_size
    if size != header.expected_size_bytes:
        raise MeasurementError(
            f"the KLD base file {path} has {size:,} bytes, but {header.n_chunks} chunks of"
            f" {header.ctx_tokens} tokens at a vocabulary of {header.n_vocab:,} need"
            f" {header.expected_size_bytes:,} (disk full while it was written, or cut short?)",
            "free disk space and measure again",
        )
    return header


def format_bytes(size_bytes: int) -> str:
    """A size for people: 1.23 GB, 77.5 MB (decimal units)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.2f} {unit}"
    return f"{size_bytes} bytes"


def check_free_space(folder: Path, needed_bytes: int, lower_with: str) -> None:
    """ConfigError naming the size and how to lower it when `folder`'s disk cannot hold the file."""
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < needed_bytes + DISK_HEADROOM_BYTES:
        raise ConfigError(
            f"the KLD base logits file needs {format_bytes(needed_bytes)} in {folder}"
            f" (plus {format_bytes(DISK_HEADROOM_BYTES)} headroom) but only {format_bytes(free)} is free",
            f"lower {lower_with}, or set toolchain.cache_dir to a bigger disk",
        )


# Files of one process: `<key>-<pid>@<host>-<hex>.logits` (a base used once) and
# `.<name>.<pid>@<host>.partial` (any base being written). A process killed outright leaves them;
# the pid says whose they are, and the host keeps another machine or container that shares the
# cache (its pids mean nothing here) from having its files taken for orphans.
OWNED_FILE = re.compile(
    r"^(?:[0-9a-f]+-(?P<pid>\d+)@(?P<host>[^/@]+)-[0-9a-f]+\.logits"
    r"|\..+\.(?P<writer>\d+)@(?P<writer_host>[^/@]+)\.partial)$"
)


def owner_tag(pid: int | None = None) -> str:
    """`<pid>@<host>` of this process (or of `pid` on this host)."""
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"
    return f"{os.getpid() if pid is None else pid}@{host}"


def partial_name(name: str, pid: int | None = None) -> str:
    """The name a base file has while this process writes it."""
    return f".{name}.{owner_tag(pid)}.partial"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphans(folder: Path) -> list[Path]:
    """Delete base files left by processes of this host that no longer run; return them."""
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    here = owner_tag().split("@", 1)[1]
    for path in folder.iterdir():
        match = OWNED_FILE.match(path.name)
        if match is None:
            continue
        pid = int(match.group("pid") or match.group("writer"))
        host = match.group("host") or match.group("writer_host")
        if host == here and pid != os.getpid() and not _alive(pid):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
