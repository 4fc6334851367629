"""WikiText-2: a given path, the cached copy, a download through the Hub client from a local
stand-in for Hugging Face (resumed when cut, with the token), and a clear error when offline."""

from __future__ import annotations

import hashlib
import io
import socket
import threading
import time
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from quantload.errors import ConfigError, OfflineError
from quantload.quality.dataset import (
    ARCHIVE_MEMBER,
    ARCHIVE_PATH,
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


class StandInHub:
    """Hugging Face's resolve endpoint for one dataset file: HEAD for metadata, GET with Range.

    `body` is what it serves, `status` its status, `cut_first_get_at` a byte count after which
    the first GET hangs up; `requests` records (method, path, Range, Authorization)."""

    def __init__(self, body: bytes, status: int = 200) -> None:
        self.body = body
        self.status = status
        self.cut_first_get_at: int | None = None
        self.requests: list[tuple[str, str, str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _note(self, method: str) -> bool:
                hub.requests.append(
                    (method, self.path, self.headers.get("Range", ""), self.headers.get("Authorization", ""))
                )
                if self.path != f"/{ARCHIVE_PATH}" or hub.status != 200:
                    self.send_response(404 if hub.status == 200 else hub.status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return False
                return True

            def _head(self, status: int, length: int, start: int = 0) -> None:
                self.send_response(status)
                self.send_header("X-Repo-Commit", "0" * 40)
                self.send_header("ETag", f'"{hashlib.sha256(hub.body).hexdigest()}"')
                self.send_header("Content-Length", str(length))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(hub.body) - 1}/{len(hub.body)}")
                self.end_headers()

            def do_HEAD(self) -> None:
                if self._note("HEAD"):
                    self._head(200, len(hub.body))

            def do_GET(self) -> None:
                if not self._note("GET"):
                    return
                start = 0
                wanted = self.headers.get("Range", "")
                if wanted.startswith("bytes="):
                    start = int(wanted[6:].split("-")[0])
                body = hub.body[start:]
                self._head(206 if start else 200, len(body), start)
                cut = hub.cut_first_get_at
                if cut is not None:
                    hub.cut_first_get_at = None
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def gets(self) -> list[tuple[str, str, str, str]]:
        return [r for r in self.requests if r[0] == "GET"]

    def __enter__(self) -> StandInHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def hub() -> Iterator[StandInHub]:
    with StandInHub(archive()) as server:
        yield server


def closed_endpoint() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_a_given_path_is_used_as_is(tmp_path: Path) -> None:
    text = tmp_path / "wiki.test.raw"
    text.write_bytes(b"hello")
    assert resolve_dataset(text, tmp_path / "cache", {"QUANTLOAD_HF_ENDPOINT": closed_endpoint()}) == text


@pytest.mark.parametrize("make", [False, True])
def test_a_missing_or_empty_path_is_a_config_error(tmp_path: Path, make: bool) -> None:
    text = tmp_path / "wiki.test.raw"
    if make:
        text.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"wiki\.test\.raw"):
        resolve_dataset(text, tmp_path / "cache", {})


def test_download_through_the_hub_client_is_cached_and_reused(tmp_path: Path, hub: StandInHub) -> None:
    environ = {"QUANTLOAD_HF_ENDPOINT": hub.url}
    path = resolve_dataset(None, tmp_path, environ)
    assert path == cached_text_path(tmp_path)
    assert path.read_bytes() == TEXT
    assert [(method, p) for method, p, _, _ in hub.gets()] == [("GET", f"/{ARCHIVE_PATH}")]
    assert any(method == "HEAD" for method, *_ in hub.requests)  # the Hub client's metadata call
    seen = len(hub.requests)
    assert resolve_dataset(None, tmp_path, environ) == path
    assert len(hub.requests) == seen  # the cached copy: no request at all
    assert not list(path.parent.glob(".*partial"))


def test_the_hub_token_is_sent(tmp_path: Path, hub: StandInHub) -> None:
    resolve_dataset(None, tmp_path, {"QUANTLOAD_HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_test_token"})
    assert hub.gets() and all(auth == "Bearer hf_test_token" for *_, auth in hub.gets())


def test_a_cut_download_is_resumed(tmp_path: Path, hub: StandInHub, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    # the Hub client writes what it read in chunks of this size (10 MiB; the test file is 100 KiB)
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)
    hub.cut_first_get_at = len(hub.body) // 2
    environ = {"QUANTLOAD_HF_ENDPOINT": hub.url}
    try:
        path = resolve_dataset(None, tmp_path, environ)
    except OfflineError:  # the Hub client gave up on the cut: the next try resumes it
        path = resolve_dataset(None, tmp_path, environ)
    assert path.read_bytes() == TEXT
    ranges = [wanted for _, _, wanted, _ in hub.gets()]
    assert len(ranges) == 2 and ranges[0] == "", ranges
    resumed_at = int(ranges[1].removeprefix("bytes=").split("-")[0])
    assert 0 < resumed_at <= len(hub.body) // 2, ranges  # from what it had, not from the start


def test_offline_without_a_path_is_one_line_saying_how_to_provide_it(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(OfflineError) as raised:
        resolve_dataset(None, tmp_path, {"QUANTLOAD_HF_ENDPOINT": closed_endpoint()})
    assert time.monotonic() - started < 10
    message = raised.value.one_line()
    assert "\n" not in message
    assert "cannot reach 127.0.0.1" in message
    assert "--dataset PATH" in message
    assert str(cached_text_path(tmp_path)) in message
    assert not cached_text_path(tmp_path).exists()


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (404, archive(), "cannot download the WikiText-2 test text"),
        (200, b"<html>proxy login</html>", "not the wikitext-2-raw-v1 archive"),
        (200, archive(member="other.raw"), "not the wikitext-2-raw-v1 archive"),
        (200, archive(text=b"short"), "has only 5 bytes"),
    ],
)
def test_a_wrong_answer_is_refused(tmp_path: Path, status: int, body: bytes, message: str) -> None:
    with StandInHub(body, status) as hub, pytest.raises(OfflineError, match=message) as raised:
        resolve_dataset(None, tmp_path, {"QUANTLOAD_HF_ENDPOINT": hub.url})
    assert "\n" not in raised.value.one_line()
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


def test_the_importance_matrix_calibrates_on_the_train_split_from_the_same_archive(tmp_path: Path) -> None:
    from quantload.config import PrepareSettings
    from quantload.models.calibration import resolve_calibration
    from quantload.quality.dataset import TRAIN_MEMBER

    train = b" = Valkyria Chronicles III = \n" * (MIN_TEXT_BYTES // 28 + 1)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.writestr(ARCHIVE_MEMBER, TEXT)
        bundle.writestr(TRAIN_MEMBER, train)
    with StandInHub(buffer.getvalue()) as server:
        scored = resolve_dataset(None, tmp_path, {"QUANTLOAD_HF_ENDPOINT": server.url})
        calibration = resolve_calibration(PrepareSettings(), tmp_path, {"QUANTLOAD_HF_ENDPOINT": server.url}, scored)
    assert calibration == cached_text_path(tmp_path, TRAIN_MEMBER) and calibration.read_bytes() == train
    assert describe_dataset(calibration).name == "WikiText-2 raw, train split"
    # offline with nothing cached: one line saying how to give a calibration text instead
    with pytest.raises(OfflineError) as caught:
        resolve_calibration(PrepareSettings(), tmp_path / "empty", {"QUANTLOAD_HF_ENDPOINT": closed_endpoint()}, None)
    assert "prepare.calibration" in caught.value.one_line()
