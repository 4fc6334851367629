"""Choosing the files of a run, checked before any work: types against llama-quantize's own list
(typos answered with the nearest names), mixes, the importance matrix each needs, the calibration
text, files the user already has (one model, whole, GGUF; a folder; a Hugging Face repo through a
local stand-in of the hub), and the one order every table uses (largest file first)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest

from quantload.config import MixSettings, PrepareSettings
from quantload.errors import ConfigError, ModelError
from quantload.llamacpp.quant_types import QuantTypes, ggml_tensor_types, parse_type_table
from quantload.models.calibration import check_calibration_file
from quantload.models.file_plan import plan_files
from quantload.models.given_files import adopt_files

HELP_TAIL = """
-----------------------------------------------------------------------------
 allowed quantization types
-----------------------------------------------------------------------------

   2  or  Q4_0    :  4.34G, +0.4685 ppl @ Llama-3-8B
  20  or  IQ2_XS  :  2.31 bpw quantization
  21  or  Q2_K_S  :  2.96G, +3.1836 ppl @ Llama-3-8B
  30  or  IQ4_XS  :  4.25 bpw non-linear quantization
  12  or  Q3_K_M  :  3.74G, +0.6569 ppl @ Llama-3-8B
  15  or  Q4_K_M  :  4.58G, +0.1754 ppl @ Llama-3-8B
  18  or  Q6_K    :  6.14G, +0.0217 ppl @ Llama-3-8B
   7  or  Q8_0    :  7.96G, +0.0026 ppl @ Llama-3-8B
   1  or  F16     : 14.00G, +0.0020 ppl @ Mistral-7B
  32  or  BF16    : 14.00G, -0.0050 ppl @ Mistral-7B
   0  or  F32     : 26.00G              @ 7B
          COPY    : only copy tensors, no quantizing
"""
TYPES = QuantTypes(parse_type_table("usage: llama-quantize ...\n" + HELP_TAIL), ggml_tensor_types())


def test_the_type_table_is_read_from_the_binary_help() -> None:
    assert TYPES.file_types[:3] == ("Q4_0", "IQ2_XS", "Q2_K_S") and "COPY" in TYPES.file_types
    assert parse_type_table("usage: nothing else") == ()
    assert TYPES.file_type("q4_k_m", "x") == "Q4_K_M" and TYPES.tensor_type("Q8_0", "x") == "q8_0"


def test_a_typo_is_one_line_with_the_nearest_names() -> None:
    with pytest.raises(ConfigError) as caught:
        plan_files(PrepareSettings(quants=("F16", "Q4_KM")), TYPES)
    line = caught.value.one_line()
    assert "'Q4_KM'" in line and "nearest: Q4_K_M" in line and "\n" not in line
    with pytest.raises(ConfigError, match="COPY"):  # COPY is not a file's type
        plan_files(PrepareSettings(quants=("COPY",)), TYPES)


def test_types_that_need_an_importance_matrix_get_one_or_are_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        plan_files(PrepareSettings(quants=("F16", "IQ2_XS")), TYPES)
    assert "IQ2_XS needs an importance matrix" in caught.value.one_line()
    assert "prepare.imatrix = computed" in caught.value.one_line()
    with pytest.raises(ConfigError, match="Q4_K_M-imatrix asks for an importance matrix"):
        plan_files(PrepareSettings(quants=("Q4_K_M-imatrix",)), TYPES)
    plan = plan_files(PrepareSettings(quants=("F16", "Q4_K_M", "Q4_K_M-imatrix", "IQ2_XS"), imatrix="computed"), TYPES)
    assert [(f.label, f.quant_type, f.imatrix) for f in plan.files] == [
        ("F16", "F16", False), ("Q4_K_M", "Q4_K_M", False), ("Q4_K_M-imatrix", "Q4_K_M", True),
        ("IQ2_XS-imatrix", "IQ2_XS", True),  # labelled for what it is
    ]
    assert plan.needs_imatrix and next(f.label for f in plan.without("F16").files) == "Q4_K_M"
    with pytest.raises(ConfigError, match=r"prepare\.imatrix = '/nowhere\.gguf': no such file"):
        plan_files(PrepareSettings(quants=("Q4_K_M-imatrix",), imatrix="/nowhere.gguf"), TYPES)


def test_a_mix_is_checked_and_names_its_flags(tmp_path: Path) -> None:
    listed = tmp_path / "types.txt"
    listed.write_text("ffn_down=q6_k\n")
    mix = MixSettings(name="Q4_K_M-mix", base="q4_k_m", tensor_types=("attn_v=q8_0",), tensor_type_file=listed,
                      output_tensor_type="q8_0")  # fmt: skip
    (item,) = plan_files(PrepareSettings(quants=(), mixes=(mix,)), TYPES).files
    assert item.quant_type == "Q4_K_M" and not item.imatrix
    assert item.options.flags() == [
        "--tensor-type", "attn_v=q8_0", "--tensor-type", "ffn_down=q6_k", "--output-tensor-type", "q8_0",
    ]  # fmt: skip
    bad = MixSettings(name="m", base="Q4_K_M", tensor_types=("attn_v=q8",))
    with pytest.raises(ConfigError, match=r"prepare.mixes m: 'q8' is not a ggml tensor type \(nearest: .*q8_0"):
        plan_files(PrepareSettings(quants=(), mixes=(bad,)), TYPES)
    low = MixSettings(name="low", base="Q4_K_M", tensor_types=("ffn_down=iq2_xs",))
    with pytest.raises(ConfigError, match=r"prepare\.mixes low needs an importance matrix"):
        plan_files(PrepareSettings(quants=(), mixes=(low,)), TYPES)
    with pytest.raises(ConfigError, match="name Q8_0 twice"):
        plan_files(PrepareSettings(quants=("Q8_0",), mixes=(MixSettings(name="Q8_0", base="Q8_0"),)), TYPES)
    with pytest.raises(ConfigError, match=r"more than prepare\.max_files = 2"):
        plan_files(PrepareSettings(quants=("F16", "Q8_0", "Q6_K"), max_files=2), TYPES)


def test_the_calibration_text_is_long_enough_and_never_the_scored_text(tmp_path: Path) -> None:
    scored = tmp_path / "wiki.test.raw"
    scored.write_text("".join(f" = Article {i} = \n text of the article {i} .\n" for i in range(2000)))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"is empty"):
        check_calibration_file(empty, 512, scored)
    short = tmp_path / "short.txt"
    short.write_text("a few words")
    with pytest.raises(ConfigError, match=r"too short for one chunk: 11 bytes.*at least 1024 tokens"):
        check_calibration_file(short, 512, scored)
    with pytest.raises(ConfigError, match="holds the text quality is scored on"):
        check_calibration_file(scored, 128, scored)
    superset = tmp_path / "superset.txt"
    superset.write_bytes(b"preface\n" + scored.read_bytes())
    with pytest.raises(ConfigError, match="holds the text quality is scored on"):
        check_calibration_file(superset, 128, scored)
    tail = tmp_path / "tail.txt"
    tail.write_bytes(scored.read_bytes()[-20000:])  # disjoint from the scored opening
    check_calibration_file(tail, 128, scored)


# ----------------------------------------------------------------------------- given files


def write_gguf(path: Path, file_type: int, rows: int = 64, vocab: int = 100, arch: str = "qwen2",
               imatrix: bool = False, fill: int = 1) -> Path:  # fmt: skip
    """A small GGUF whose size grows with `fill` (a longer description)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_file_type(file_type)
    writer.add_block_count(1)
    writer.add_embedding_length(32)
    writer.add_name("small")
    writer.add_description("x" * (fill * 1000))  # the size order of the files, shapes unchanged
    if imatrix:
        writer.add_string("quantize.imatrix.file", "imatrix.gguf")
        writer.add_string("quantize.imatrix.dataset", "calibration.txt")
        writer.add_int32("quantize.imatrix.chunks_count", 8)
    writer.add_tensor("token_embd.weight", np.ones((vocab, 32), dtype=np.float16))
    writer.add_tensor("blk.0.attn_q.weight", np.ones((rows, 32), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _five(folder: Path) -> list[Path]:
    folder.mkdir()
    return [
        write_gguf(folder / "m-f16.gguf", 1, fill=60), write_gguf(folder / "m-q8.gguf", 7, fill=40),
        write_gguf(folder / "m-q6.gguf", 18, fill=30), write_gguf(folder / "m-q4.gguf", 15, fill=20),
        write_gguf(folder / "m-q4i.gguf", 15, fill=19, imatrix=True),
    ]  # fmt: skip


def test_given_files_are_read_from_their_metadata_and_ordered_by_size(tmp_path: Path) -> None:
    files = _five(tmp_path / "mine")
    manifest = adopt_files(PrepareSettings(files=(str(tmp_path / "mine"),)), tmp_path, {}, {"origin": "test"})
    assert manifest.ordered_labels() == ["F16", "Q8_0", "Q6_K", "Q4_K_M", "Q4_K_M-imatrix"]
    assert list(manifest.files) == manifest.ordered_labels()
    assert manifest.reference_label() == "F16" and manifest.files["F16"].path == str(files[0].resolve())
    assert manifest.files["Q4_K_M-imatrix"].imatrix == {
        "file": "imatrix.gguf", "dataset": "calibration.txt", "chunks_count": 8,
    }
    assert manifest.files["Q4_K_M"].imatrix is None and manifest.files["Q8_0"].origin.startswith("local file")
    # one by one, without an F16: perplexity only, said plainly
    alone = adopt_files(PrepareSettings(files=(str(files[1]), str(files[3]))), tmp_path, {}, {})
    assert alone.reference_label() is None and "perplexity only" in alone.source["note"]
    with_reference = adopt_files(
        PrepareSettings(files=(str(files[3]),), reference=files[0]), tmp_path, {}, {}
    )
    assert with_reference.reference_label() == "F16" and set(with_reference.files) == {"F16", "Q4_K_M"}


def test_bad_given_files_are_one_line_each(tmp_path: Path) -> None:
    good = write_gguf(tmp_path / "a.gguf", 15)
    cases = {
        "does not exist": [str(tmp_path / "absent.gguf")],
        "is not a GGUF file": [str((tmp_path / "notes.gguf").resolve())],
        "one part of a split GGUF": [str(write_gguf(tmp_path / "m-00001-of-00002.gguf", 15))],
        "vocabulary 100 against 200 tokens": [str(good), str(write_gguf(tmp_path / "b.gguf", 7, vocab=200))],
        "architecture qwen2 against llama": [str(good), str(write_gguf(tmp_path / "c.gguf", 7, arch="llama"))],
        "tensor shapes differ": [str(good), str(write_gguf(tmp_path / "d.gguf", 7, rows=128))],
        "holds no .gguf file": [str(tmp_path / "empty")],
    }
    (tmp_path / "notes.gguf").write_text("not a model")
    (tmp_path / "empty").mkdir()
    for expected, specs in cases.items():
        with pytest.raises((ConfigError, ModelError)) as caught:
            adopt_files(PrepareSettings(files=tuple(specs)), tmp_path, {}, {})
        assert expected in caught.value.one_line() and "\n" not in caught.value.one_line(), expected
    with pytest.raises(ConfigError, match="is Q4_K_M, not F32, BF16 or F16"):
        adopt_files(PrepareSettings(files=(str(good),), reference=good), tmp_path, {}, {})


class StandInHub:
    """The two Hub endpoints the client uses for a repo of GGUFs: the tree listing
    (/api/models/REPO/tree/main) and resolve (HEAD and GET with Range), served from a folder."""

    def __init__(self, repo: str, folder: Path) -> None:
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _file(self) -> Path | None:
                path = unquote(urlsplit(self.path).path)
                prefix = f"/{repo}/resolve/main/"
                if path.startswith(prefix) and (folder / path[len(prefix) :]).is_file():
                    return folder / path[len(prefix) :]
                return None

            def _send(self, status: int, body: bytes, etag: str = "") -> None:
                self.send_response(status)
                self.send_header("X-Repo-Commit", "0" * 40)
                if etag:
                    self.send_header("ETag", f'"{etag}"')
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self) -> None:
                hub.requests.append(f"HEAD {self.path}")
                found = self._file()
                if found is None:
                    self._send(404, b"")
                    return
                data = found.read_bytes()
                self.send_response(200)
                self.send_header("X-Repo-Commit", "0" * 40)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()

            def do_GET(self) -> None:
                hub.requests.append(f"GET {self.path}")
                if urlsplit(self.path).path == f"/api/models/{repo}/tree/main":
                    tree = [{"type": "file", "path": p.name, "size": p.stat().st_size, "oid": "0" * 40}
                            for p in sorted(folder.iterdir())]  # fmt: skip
                    tree.append({"type": "file", "path": "README.md", "size": 1, "oid": "1" * 40})
                    self._send(200, json.dumps(tree).encode())
                    return
                found = self._file()
                if found is None:
                    self._send(404, b"")
                    return
                data = found.read_bytes()
                self._send(200, data, hashlib.sha256(data).hexdigest())

            def log_message(self, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> StandInHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[StandInHub]:
    _five(tmp_path / "repo")
    with StandInHub("org/small-GGUF", tmp_path / "repo") as server:
        yield server


def test_a_hugging_face_repo_of_ggufs_through_the_hub_client(tmp_path: Path, hub: StandInHub) -> None:
    environ = {"QUANTLOAD_HF_ENDPOINT": hub.url}
    cache = tmp_path / "cache"
    manifest = adopt_files(PrepareSettings(files=("hf:org/small-GGUF",)), cache, environ, {})
    assert manifest.ordered_labels() == ["F16", "Q8_0", "Q6_K", "Q4_K_M", "Q4_K_M-imatrix"]
    assert all(Path(e.path).is_relative_to(cache / "models") for e in manifest.files.values())
    assert manifest.files["Q8_0"].origin == "https://huggingface.co/org/small-GGUF (m-q8.gguf)"
    assert any(r.startswith("GET /api/models/org/small-GGUF/tree/main") for r in hub.requests)
    picked = adopt_files(PrepareSettings(files=("hf:org/small-GGUF:*q4*",)), cache, environ, {})
    assert set(picked.files) == {"Q4_K_M", "Q4_K_M-imatrix"} and picked.reference_label() is None
    with pytest.raises(ConfigError) as caught:
        adopt_files(PrepareSettings(files=("hf:org/small-GGUF",), max_files=3), cache, environ, {})
    assert "matches 5 GGUF files, more than prepare.max_files = 3" in caught.value.one_line()
    assert "glob" in caught.value.one_line()
    with pytest.raises(ConfigError, match=r"matches no \.gguf file"):
        adopt_files(PrepareSettings(files=("hf:org/small-GGUF:*IQ1*",)), cache, environ, {})
