"""Stage annotations: reading stages.jsonl and pushing to a fake Grafana."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fake_grafana import FakeGrafana
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


def test_push_adds_one_region_per_stage(stages: Path, grafana: FakeGrafana) -> None:
    assert push_stage_annotations(stages, grafana.url, credential="glsa_token") == 3
    first = grafana.annotations[0]
    assert first.path == "/api/annotations" and first.auth == "Bearer glsa_token"
    body = first.body
    assert body is not None and "dashboardUID" not in body  # org-wide: drawn once, by the tag query
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
