"""The WikiText-2 test text that perplexity is measured on: a given path, or a cached download.

The download is the archive llama.cpp's own `scripts/get-wikitext-2.sh` fetches
(`wikitext-2-raw-v1.zip` from the `ggml-org/ci` dataset on Hugging Face), fetched with the Hub
client (`huggingface_hub.hf_hub_download`, as the models are): it resumes a cut download, shows
its progress, sends the token the Hub client finds (HF_TOKEN, or a saved login) and honours
HF_HUB_OFFLINE. quantload keeps the archive's `wikitext-2-raw/wiki.test.raw` member in the cache.
`QUANTLOAD_HF_ENDPOINT` or `HF_ENDPOINT` points the download at a mirror. An unreachable hub, a
missing file or a wrong archive is one OfflineError line saying how to provide the text instead.
"""

from __future__ import annotations

import codecs
import hashlib
import zipfile
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from quantload.errors import ConfigError, OfflineError
from quantload.models.sources import HF_DEFAULT_ENDPOINT, require_reachable

DEFAULT_ENDPOINT = HF_DEFAULT_ENDPOINT
DATASET_REPO = "ggml-org/ci"
ARCHIVE_FILE = "wikitext-2-raw-v1.zip"
ARCHIVE_PATH = f"datasets/{DATASET_REPO}/resolve/main/{ARCHIVE_FILE}"
ARCHIVE_MEMBER = "wikitext-2-raw/wiki.test.raw"
TRAIN_MEMBER = "wikitext-2-raw/wiki.train.raw"  # the importance matrix's calibration text
DATASET_NAME = "WikiText-2 raw, test split"
TRAIN_NAME = "WikiText-2 raw, train split"
# The real file is about 1.3 MB; anything far smaller is not the test split.
MIN_TEXT_BYTES = 100_000


class DatasetInfo(BaseModel):
    """Which text a perplexity was measured on, precisely enough to tell two texts apart."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    path: str
    size_bytes: int
    sha256: str


def hub_endpoint(environ: Mapping[str, str]) -> str:
    """The Hugging Face endpoint to download from (a mirror when one is set)."""
    endpoint = environ.get("QUANTLOAD_HF_ENDPOINT") or environ.get("HF_ENDPOINT")
    return (endpoint or DEFAULT_ENDPOINT).rstrip("/")


def archive_url(environ: Mapping[str, str]) -> str:
    """Where the wikitext-2-raw-v1 archive is downloaded from."""
    return f"{hub_endpoint(environ)}/{ARCHIVE_PATH}"


def cached_text_path(cache_dir: Path, member: str = ARCHIVE_MEMBER) -> Path:
    """Where a downloaded text of the archive (the test split by default) lives in the cache."""
    return cache_dir / "datasets" / member


def describe_dataset(path: Path) -> DatasetInfo:
    """Name, size and SHA-256 of a text file (named WikiText-2 when it is `wiki.test.raw`)."""
    data = path.read_bytes()
    names = {Path(ARCHIVE_MEMBER).name: DATASET_NAME, Path(TRAIN_MEMBER).name: TRAIN_NAME}
    name = names.get(path.name, path.name)
    return DatasetInfo(
        name=name, path=str(path), size_bytes=len(data), sha256=hashlib.sha256(data).hexdigest()
    )


def _offline_hint(cache_dir: Path, url: str) -> str:
    return (
        f"pass --dataset PATH to WikiText-2's wiki.test.raw (`make run DATASET=PATH` with make; or set"
        f" quality.dataset), or download {url} and unzip {ARCHIVE_MEMBER} to {cached_text_path(cache_dir)}"
    )


def _download_archive(cache_dir: Path, environ: Mapping[str, str], hint: str) -> Path:
    """The archive, downloaded (or resumed) by the Hub client into quantload's cache."""
    from huggingface_hub import hf_hub_download  # ~0.3 s to import: only when downloading

    endpoint = hub_endpoint(environ)
    require_reachable(endpoint, f"the WikiText-2 archive ({DATASET_REPO}/{ARCHIVE_FILE})", hint)
    try:
        path = hf_hub_download(
            repo_id=DATASET_REPO,
            filename=ARCHIVE_FILE,
            repo_type="dataset",
            local_dir=cache_dir / "datasets" / DATASET_REPO.replace("/", "--"),
            endpoint=endpoint,
            token=environ.get("HF_TOKEN") or None,
            etag_timeout=10,
        )
    except Exception as error:  # the Hub client's errors: offline, 401/404, a cut connection
        lines = str(error).strip().splitlines()
        reason = f"{type(error).__name__}: {lines[0][:160]}" if lines else type(error).__name__
        raise OfflineError(f"cannot download the WikiText-2 test text ({reason})", hint) from None
    return Path(str(path))


def _extract(archive: Path, url: str, hint: str, member: str = ARCHIVE_MEMBER) -> bytes:
    try:
        with zipfile.ZipFile(archive) as bundle:
            text = bundle.read(member)
    except (zipfile.BadZipFile, KeyError, OSError) as error:
        raise OfflineError(f"{url} is not the wikitext-2-raw-v1 archive ({error})", hint) from None
    if len(text) < MIN_TEXT_BYTES:
        raise OfflineError(f"{member} in {url} has only {len(text)} bytes", hint)
    return text


def download_wikitext2(
    cache_dir: Path, environ: Mapping[str, str], member: str = ARCHIVE_MEMBER, hint: str | None = None
) -> Path:
    """Download the archive, keep one of its texts (the test split by default) in the cache, and
    return the text's path."""
    url = archive_url(environ)
    hint = hint or _offline_hint(cache_dir, url)
    archive = _download_archive(cache_dir, environ, hint)
    try:
        text = _extract(archive, url, hint, member)
    except OfflineError:
        archive.unlink(missing_ok=True)  # not the archive: the next try downloads it again
        raise
    target = cached_text_path(cache_dir, member)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_bytes(text)
    partial.replace(target)
    return target


def check_utf8_text(path: Path, piece_bytes: int = 1 << 20) -> None:
    """ConfigError unless the whole file is UTF-8 text (llama.cpp's tokenizer dies on anything
    else with `invalid codepoint`); read in pieces, so any size is checked in bounded memory."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with path.open("rb") as handle:
        while True:
            piece = handle.read(piece_bytes)
            try:
                decoder.decode(piece, final=not piece)
            except UnicodeDecodeError as error:
                raise ConfigError(
                    f"dataset {path} is not UTF-8 text ({error.reason} at byte {offset + error.start:,})",
                    "pass a text file, such as WikiText-2's wiki.test.raw",
                ) from None
            if not piece:
                return
            offset += len(piece)


def resolve_dataset(configured: Path | None, cache_dir: Path, environ: Mapping[str, str]) -> Path:
    """The text to measure on: `configured` if given, else the cached copy, else a download."""
    if configured is not None:
        path = configured.expanduser()
        if not path.is_file():
            raise ConfigError(
                f"dataset {path} does not exist or is not a file",
                "pass --dataset PATH to WikiText-2's wiki.test.raw",
            )
        if path.stat().st_size == 0:
            raise ConfigError(f"dataset {path} is empty", "pass the WikiText-2 test text")
        check_utf8_text(path)
        return path
    cached = cached_text_path(cache_dir)
    if cached.is_file() and cached.stat().st_size >= MIN_TEXT_BYTES:
        return cached
    return download_wikitext2(cache_dir, environ)
