"""WikiText-2: a given path, the cached copy, a download, and a clear error when offline."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import httpx
import pytest

from quantload.errors import ConfigError, OfflineError
from quantload.quality.dataset import (
    ARCHIVE_MEMBER,
    MIN_TEXT_BYTES,
    archive_url,
    cached_text_path,
    describe_dataset,
    resolve_dataset,
)

TEXT = b" = Robert Boulter = \n" * (MIN_TEXT_BYTES // 20 + 1)


def archive(member: str = ARCHIVE_MEMBER, text: bytes = TEXT) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.writestr(member, text)
        bundle.writestr("wikitext-2-raw/wiki.train.raw", b"train")
    return buffer.getvalue()


def client_answering(status: int, body: bytes, seen: list[str]) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(status, content=body)

    return httpx.Client(transport=httpx.MockTransport(handle))


def no_network() -> httpx.Client:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno -3] Temporary failure in name resolution", request=request)

    return httpx.Client(transport=httpx.MockTransport(refuse))


def test_a_given_path_is_used_as_is(tmp_path: Path) -> None:
    text = tmp_path / "wiki.test.raw"
    text.write_bytes(b"hello")
    assert resolve_dataset(text, tmp_path / "cache", {}, no_network) == text


@pytest.mark.parametrize("make", [False, True])
def test_a_missing_or_empty_path_is_a_config_error(tmp_path: Path, make: bool) -> None:
    text = tmp_path / "wiki.test.raw"
    if make:
        text.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"wiki\.test\.raw"):
        resolve_dataset(text, tmp_path / "cache", {}, no_network)


def test_download_is_cached_and_reused(tmp_path: Path) -> None:
    seen: list[str] = []
    path = resolve_dataset(None, tmp_path, {}, lambda: client_answering(200, archive(), seen))
    assert path == cached_text_path(tmp_path)
    assert path.read_bytes() == TEXT
    assert seen == ["https://huggingface.co/datasets/ggml-org/ci/resolve/main/wikitext-2-raw-v1.zip"]
    assert resolve_dataset(None, tmp_path, {}, no_network) == path
    assert not list(path.parent.glob(".*partial"))


def test_offline_without_a_path_is_one_line_saying_how_to_provide_it(tmp_path: Path) -> None:
    with pytest.raises(OfflineError) as raised:
        resolve_dataset(None, tmp_path, {}, no_network)
    message = raised.value.one_line()
    assert "\n" not in message
    assert "ConnectError" in message
    assert "--dataset PATH" in message
    assert str(cached_text_path(tmp_path)) in message
    assert not cached_text_path(tmp_path).exists()


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (404, b"not found", "HTTP 404"),
        (200, b"<html>proxy login</html>", "not the wikitext-2-raw-v1 archive"),
        (200, archive(member="other.raw"), "not the wikitext-2-raw-v1 archive"),
        (200, archive(text=b"short"), "has only 5 bytes"),
    ],
)
def test_a_wrong_answer_is_refused(tmp_path: Path, status: int, body: bytes, message: str) -> None:
    with pytest.raises(OfflineError, match=message):
        resolve_dataset(None, tmp_path, {}, lambda: client_answering(status, body, []))
    assert not cached_text_path(tmp_path).exists()


def test_mirror_endpoint_is_honoured() -> None:
    assert archive_url({"QUANTLOAD_HF_ENDPOINT": "http://mirror.local/"}).startswith(
        "http://mirror.local/datasets/ggml-org/ci/"
    )
    assert archive_url({"HF_ENDPOINT": "http://hf"}).startswith("http://hf/datasets/")


def test_describe_records_size_and_hash(tmp_path: Path) -> None:
    text = tmp_path / "t.raw"
    text.write_bytes(b"abc")
    info = describe_dataset(text)
    assert info.name == "t.raw"
    assert info.size_bytes == 3
    assert info.sha256 == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_the_test_split_is_named(tmp_path: Path) -> None:
    text = tmp_path / "wiki.test.raw"
    text.write_bytes(b"x")
    assert describe_dataset(text).name == "WikiText-2 raw, test split"
