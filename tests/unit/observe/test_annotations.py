"""Stage annotations: reading stages.jsonl and pushing to a fake Grafana."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from quantload.observe.annotations import push_stage_annotations, read_stage_spans


def _event(kind: str, unix_s: float, quant: str, users: int, repeat: int = 0) -> str:
    return json.dumps(
        {
            "event": kind,
            "unix_s": unix_s,
            "server": f"srv-{quant}",
            "quant": quant,
            "experiment": "sweep",
            "stage_users": users,
            "repeat": repeat,
        }
    )


@pytest.fixture
def stages(tmp_path: Path) -> Path:
    path = tmp_path / "stages.jsonl"
    path.write_text(
        "\n".join(
            [
                _event("stage_start", 100.0, "F16", 1),
                _event("stage_start", 100.5, "Q8_0", 1),
                "not json",
                _event("stage_end", 110.0, "F16", 1),
                _event("stage_end", 111.0, "Q8_0", 1),
                _event("stage_start", 120.0, "F16", 2),
                json.dumps({"event": "stage_end", "unix_s": 125.0}),
            ]
        )
        + "\n"
    )
    return path


def test_open_loop_stages_pair_by_stage_id(tmp_path: Path) -> None:
    path = tmp_path / "stages.jsonl"
    lines = []
    for index, (rate, start) in enumerate(((0.5, 10.0), (1.0, 20.0))):
        base = {
            "server": "s",
            "quant": "F16",
            "experiment": "open_loop",
            "stage_users": None,
            "stage_rate_rps": rate,
            "repeat": 0,
            "stage_id": f"st{index}",
        }
        lines.append(json.dumps({**base, "event": "stage_start", "unix_s": start}))
        lines.append(json.dumps({**base, "event": "stage_end", "unix_s": start + 5}))
    path.write_text("\n".join(lines))
    spans = read_stage_spans(path)
    assert [(s.start_s, s.end_s) for s in spans] == [(10.0, 15.0), (20.0, 25.0)]
    assert spans[1].text == "open_loop: 1 req/s on F16 (s), repeat 0"


def test_spans_pair_starts_with_ends(stages: Path) -> None:
    spans = read_stage_spans(stages)
    assert [(s.quant, s.users, s.start_s, s.end_s) for s in spans] == [
        ("F16", 1, 100.0, 110.0),
        ("Q8_0", 1, 100.5, 111.0),
        ("F16", 2, 120.0, 125.0),
    ]
    assert spans[0].text == "sweep: 1 users on F16 (srv-F16), repeat 0"
    assert read_stage_spans(stages.parent / "missing.jsonl") == []


class _FakeGrafana:
    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any], str | None]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._reply({"database": "ok"} if self.path == "/api/health" else {})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.posts.append((self.path, body, self.headers.get("Authorization")))
                self._reply({"id": len(fake.posts), "message": "Annotation added"})

            def _reply(self, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def grafana() -> Iterator[_FakeGrafana]:
    fake = _FakeGrafana()
    yield fake
    fake.httpd.shutdown()
    fake.httpd.server_close()


def test_push_adds_one_region_per_stage(stages: Path, grafana: _FakeGrafana) -> None:
    assert push_stage_annotations(stages, grafana.url, token="glsa_token") == 3
    path, body, auth = grafana.posts[0]
    assert path == "/api/annotations" and auth == "Bearer glsa_token"
    assert body["dashboardUID"] == "quantload-overview"
    assert (body["time"], body["timeEnd"]) == (100_000, 110_000)
    assert body["tags"] == ["quantload", "stage", "F16", "sweep"]


def test_unreachable_or_unset_grafana_is_skipped_quietly(
    stages: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert push_stage_annotations(stages, None) == 0
    with caplog.at_level("INFO", logger="quantload.observe.annotations"):
        assert push_stage_annotations(stages, "http://127.0.0.1:1", timeout_s=0.5) == 0
    assert all(record.exc_info is None for record in caplog.records)
    assert "did not take stage annotations" in caplog.text
