"""The WikiText-2 test text that perplexity is measured on: a given path, or a cached download.

The download is the archive llama.cpp's own `scripts/get-wikitext-2.sh` fetches
(`wikitext-2-raw-v1.zip` from the `ggml-org/ci` dataset on Hugging Face); quantload keeps its
`wikitext-2-raw/wiki.test.raw` member in the cache. `QUANTLOAD_HF_ENDPOINT` or `HF_ENDPOINT`
points the download at a mirror.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict

from quantload.errors import ConfigError, OfflineError

DEFAULT_ENDPOINT = "https://huggingface.co"
ARCHIVE_PATH = "datasets/ggml-org/ci/resolve/main/wikitext-2-raw-v1.zip"
ARCHIVE_MEMBER = "wikitext-2-raw/wiki.test.raw"
DATASET_NAME = "WikiText-2 raw, test split"
# The real file is about 1.3 MB; anything far smaller is not the test split.
MIN_TEXT_BYTES = 100_000
DOWNLOAD_TIMEOUT_S = 60.0

ClientFactory = Callable[[], httpx.Client]


class DatasetInfo(BaseModel):
    """Which text a perplexity was measured on, precisely enough to tell two texts apart."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    path: str
    size_bytes: int
    sha256: str


def archive_url(environ: Mapping[str, str]) -> str:
    """Where the wikitext-2-raw-v1 archive is downloaded from."""
    endpoint = environ.get("QUANTLOAD_HF_ENDPOINT") or environ.get("HF_ENDPOINT")
    endpoint = endpoint or DEFAULT_ENDPOINT
    return f"{endpoint.rstrip('/')}/{ARCHIVE_PATH}"


def cached_text_path(cache_dir: Path) -> Path:
    """Where the downloaded test text lives in quantload's cache."""
    return cache_dir / "datasets" / ARCHIVE_MEMBER


def describe_dataset(path: Path) -> DatasetInfo:
    """Name, size and SHA-256 of a text file (named WikiText-2 when it is `wiki.test.raw`)."""
    data = path.read_bytes()
    name = DATASET_NAME if path.name == Path(ARCHIVE_MEMBER).name else path.name
    return DatasetInfo(
        name=name, path=str(path), size_bytes=len(data), sha256=hashlib.sha256(data).hexdigest()
    )


def _offline_hint(cache_dir: Path, url: str) -> str:
    return (
        f"pass --dataset PATH to WikiText-2's wiki.test.raw (or set quality.dataset), or download"
        f" {url} and unzip {ARCHIVE_MEMBER} to {cached_text_path(cache_dir)}"
    )


def _fetch(url: str, client_factory: ClientFactory, hint: str) -> bytes:
    try:
        with client_factory() as client:
            response = client.get(url, follow_redirects=True)
    except httpx.HTTPError as error:
        raise OfflineError(
            f"cannot download the WikiText-2 test text ({type(error).__name__}: {error})", hint
        ) from None
    if response.status_code != 200:
        raise OfflineError(
            f"cannot download the WikiText-2 test text: {url} answered HTTP {response.status_code}",
            hint,
        )
    return response.content


def _extract(archive: bytes, url: str, hint: str) -> bytes:
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as bundle:
            text = bundle.read(ARCHIVE_MEMBER)
    except (zipfile.BadZipFile, KeyError) as error:
        raise OfflineError(f"{url} is not the wikitext-2-raw-v1 archive ({error})", hint) from None
    if len(text) < MIN_TEXT_BYTES:
        raise OfflineError(f"{ARCHIVE_MEMBER} in {url} has only {len(text)} bytes", hint)
    return text


def _default_client() -> httpx.Client:
    return httpx.Client(timeout=DOWNLOAD_TIMEOUT_S)


def download_wikitext2(
    cache_dir: Path, environ: Mapping[str, str], client_factory: ClientFactory = _default_client
) -> Path:
    """Download the archive, keep its test text in the cache, and return the text's path."""
    url = archive_url(environ)
    hint = _offline_hint(cache_dir, url)
    text = _extract(_fetch(url, client_factory, hint), url, hint)
    target = cached_text_path(cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_bytes(text)
    partial.replace(target)
    return target


def resolve_dataset(
    configured: Path | None,
    cache_dir: Path,
    environ: Mapping[str, str],
    client_factory: ClientFactory = _default_client,
) -> Path:
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
        return path
    cached = cached_text_path(cache_dir)
    if cached.is_file() and cached.stat().st_size >= MIN_TEXT_BYTES:
        return cached
    return download_wikitext2(cache_dir, environ, client_factory)
