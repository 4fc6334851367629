from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from quantload.errors import ModelError, OfflineError
from quantload.models.gguf_meta import read_gguf
from quantload.models.sources import HubFile, download_hub_file, resolve_source


def write_small_gguf(path: Path, file_type: int = 1) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_file_type(file_type)
    writer.add_block_count(1)
    writer.add_embedding_length(32)
    writer.add_head_count(2)
    writer.add_tensor("a.weight", np.ones((64, 32), dtype=np.float16))
    writer.add_tensor("b.weight", np.ones((32,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_summary_counts_params_and_bytes(tmp_path: Path) -> None:
    summary = read_gguf(write_small_gguf(tmp_path / "m.gguf"))
    assert (summary.architecture, summary.file_type, summary.n_tensors) == ("qwen2", "F16", 2)
    assert summary.n_params == 64 * 32 + 32
    assert summary.tensor_bytes == 64 * 32 * 2 + 32 * 4


def test_missing_and_foreign_files(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        read_gguf(tmp_path / "absent.gguf")
    other = tmp_path / "model.safetensors"
    other.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelError, match="not a GGUF file"):
        read_gguf(other)


def test_truncated_file_is_detected(tmp_path: Path) -> None:
    path = write_small_gguf(tmp_path / "m.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelError, match=r"truncated|corrupt"):
        read_gguf(path)


def test_local_source_must_be_unquantized(tmp_path: Path) -> None:
    f16 = resolve_source(str(write_small_gguf(tmp_path / "f16.gguf")), tmp_path, {})
    assert (f16.kind, f16.base_file_type) == ("local", "F16")
    q8 = write_small_gguf(tmp_path / "q8.gguf", file_type=7)
    with pytest.raises(ModelError, match="Q8_0"):
        resolve_source(str(q8), tmp_path, {})
    with pytest.raises(ModelError, match="unknown model source"):
        resolve_source("llama-70b", tmp_path, {})


class _FakeHub(BaseHTTPRequestHandler):
    """A stand-in for the Hugging Face resolve endpoint (HEAD for metadata, GET with Range)."""

    payload = b"GGUF" + bytes(range(256)) * 64

    def _headers(self, status: int, body_len: int) -> None:
        self.send_response(status)
        self.send_header("X-Repo-Commit", "0" * 40)
        self.send_header("ETag", f'"{hashlib.sha256(self.payload).hexdigest()}"')
        self.send_header("Content-Length", str(body_len))
        self.end_headers()

    def do_HEAD(self) -> None:
        self._headers(200, len(self.payload))

    def do_GET(self) -> None:
        start = 0
        if self.headers.get("Range", "").startswith("bytes="):
            start = int(self.headers["Range"][6:].split("-")[0])
        body = self.payload[start:]
        self._headers(206 if start else 200, len(body))
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def fake_hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_hub_download_from_local_stand_in(tmp_path: Path, fake_hub: str) -> None:
    item = HubFile("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-fp16.gguf")
    path = download_hub_file(item, tmp_path, {"QUANTLOAD_HF_ENDPOINT": fake_hub})
    assert path.read_bytes() == _FakeHub.payload
    again = download_hub_file(item, tmp_path, {"QUANTLOAD_HF_ENDPOINT": fake_hub})
    assert again == path


def test_offline_hub_fails_at_once_naming_alternatives(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(OfflineError) as caught:
        resolve_source("qwen2.5-0.5b", tmp_path, {"QUANTLOAD_HF_ENDPOINT": f"http://127.0.0.1:{closed_port}"})
    assert time.monotonic() - started < 10
    message = caught.value.one_line()
    assert "--model smollm2-135m" in message and "--model tiny" in message


def test_results_are_labelled_by_quant_unless_two_files_share_one(tmp_path: Path) -> None:
    from quantload.cli.result_labels import result_labels

    a = write_small_gguf(tmp_path / "model-a-F16.gguf", file_type=1)
    b = write_small_gguf(tmp_path / "model-b-F16.gguf", file_type=1)
    q8 = write_small_gguf(tmp_path / "model-a-Q8_0.gguf", file_type=7)
    quants = {path: read_gguf(path).file_type for path in (a, b, q8)}
    assert result_labels([a, q8], [quants[a], quants[q8]]) == ["F16", "Q8_0"]
    assert result_labels([a, b, q8], [quants[a], quants[b], quants[q8]]) == ["model-a-F16", "model-b-F16", "Q8_0"]


def test_a_prepared_files_source_note_is_found_beside_it(tmp_path: Path) -> None:
    from quantload.models.manifest import Manifest, ManifestEntry, save_manifest, source_note_of

    model = write_small_gguf(tmp_path / "m-F16.gguf")
    stranger = write_small_gguf(tmp_path / "other.gguf")
    entry = ManifestEntry(
        quant="F16", file=model.name, path=str(model), size_bytes=1, sha256="0" * 64, n_params=1,
        tensor_bytes=1, architecture="qwen2", file_type="F16", made_from="x", seconds=0.0,
    )  # fmt: skip
    note = "F16 reconstructed from the Q4_1 release"
    save_manifest(tmp_path / "manifest.json", Manifest(source={"note": note}, llama_cpp={}, files={"F16": entry}))
    assert source_note_of(model) == note
    assert source_note_of(stranger) is None  # not listed by the manifest beside it
    (tmp_path / "sub").mkdir()
    assert source_note_of(write_small_gguf(tmp_path / "sub" / "m.gguf")) is None  # no manifest beside it
