"""Stage annotations pushed by the load path itself (`run_plan`, `quantload load`) to a fake Grafana.

The fast tests run the real `quantload.load.supervisor.run_plan` with its Locust process swapped
(its `layout`) for a tiny Python process that writes the plan's stage lines; the slow one runs
`quantload load` end to end against the fake llama-server.

Moved from tests/unit/observe/test_grafana_push.py, whose other tests start no process.
"""

from __future__ import annotations

import base64
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from fake_grafana import FakeGrafana
from load_api import context, open_loop_of, sweep_of
from quantload.cli.main import main as cli_main
from quantload.config import LoadSettings, ObserveSettings
from quantload.llamacpp.server import free_port
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.plan import LoadPlan
from quantload.load.processes import LoadProcess
from quantload.load.prompts import Prompt
from quantload.load.records import iter_stage_events
from quantload.load.supervisor import run_plan
from quantload.served import ServedTarget

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.25  # stage i runs from T0 + 10 i to T0 + 10 i + 5
TARGET = ServedTarget(name="fake", quant="Q8_0", model="m", url="http://127.0.0.1:9")
PROMPTS = [Prompt("p0", "plain", 3)]
LOAD = LoadSettings(users=(1, 2), repeats=1, warmup_requests=0, metrics_port=0)
LOGGER = "quantload.observe.annotations"
APPEND = "import sys; open(sys.argv[2], 'a').write(open(sys.argv[1]).read())"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class StageLinesOnly:
    """A stand-in for run_plan's Locust processes: one that appends the plan's stage lines."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def processes(self, plan_path: Path, run_dir: Path, invocation: str) -> list[LoadProcess]:
        plan = LoadPlan.model_validate_json(plan_path.read_text(encoding="utf-8"))
        lines = []
        for stage in plan.stages:
            start = T0 + 10 * stage.index
            lines.append(plan.stage_event(stage, "stage_start", start).model_dump_json(by_alias=True))
            lines.append(plan.stage_event(stage, "stage_end", start + 5).model_dump_json(by_alias=True))
        prepared = self.folder / f"{plan.invocation}.lines"
        prepared.write_text("\n".join(lines) + "\n", encoding="utf-8")
        argv = (sys.executable, "-c", APPEND, str(prepared), str(run_dir / "stages.jsonl"))
        return [LoadProcess("local", argv, f"locust-{invocation}-local.log")]


@pytest.fixture
def fake_locust(tmp_path: Path) -> StageLinesOnly:
    """run_plan's Locust process becomes one that appends the plan's stage_start/stage_end lines."""
    return StageLinesOnly(tmp_path)


@pytest.fixture
def token_grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana(expected_auth="Bearer glsa_abc")
    yield fake
    fake.close()


@pytest.fixture
def basic_grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana(expected_auth=_basic("ops", "p,1=x"))
    yield fake
    fake.close()


def _sweep(invocation: str) -> LoadPlan:
    return sweep_of(LOAD, TARGET, PROMPTS, "run-1", invocation)


def test_run_plan_pushes_its_stages_with_a_token(
    tmp_path: Path, token_grafana: FakeGrafana, fake_locust: StageLinesOnly
) -> None:
    # a stage of an earlier invocation already in stages.jsonl is not pushed again
    earlier = _sweep("sweep-old")
    (tmp_path / "stages.jsonl").write_text(
        earlier.stage_event(earlier.stages[0], "stage_start", T0 - 100).model_dump_json(by_alias=True)
        + "\n"
        + earlier.stage_event(earlier.stages[0], "stage_end", T0 - 90).model_dump_json(by_alias=True)
        + "\n",
        encoding="utf-8",
    )
    observe = ObserveSettings(grafana_url=token_grafana.url, grafana_token=SecretStr("glsa_abc"))
    summaries = run_plan(
        _sweep("sweep-new"), context(tmp_path, LOAD, observe=observe.model_dump()), layout=fake_locust
    ).summaries
    assert [s.status for s in summaries] == ["ok", "ok"]
    posts = token_grafana.annotations
    assert [p.auth for p in posts] == ["Bearer glsa_abc"] * 2
    assert [p.body for p in posts] == [
        {
            "panelId": None,
            "time": round((T0 + 10 * i) * 1000),
            "timeEnd": round((T0 + 10 * i + 5) * 1000),
            "tags": ["quantload", "stage", "Q8_0", "sweep"],
            "text": f"sweep: {users} users on Q8_0 (fake), repeat 0",
        }
        for i, users in enumerate((1, 2))
    ]


def test_each_invocation_pushes_only_its_own_stages_with_basic_auth(
    tmp_path: Path, basic_grafana: FakeGrafana, fake_locust: StageLinesOnly
) -> None:
    observe = ObserveSettings(
        grafana_url=basic_grafana.url, grafana_user="ops", grafana_password=SecretStr("p,1=x")
    )
    run_plan(_sweep("sweep-a"), context(tmp_path, LOAD, observe=observe.model_dump()), layout=fake_locust)
    assert len(basic_grafana.annotations) == 2
    rates = open_loop_of(LOAD, TARGET, PROMPTS, (0.5, 1.0, 2.0), "run-1", "open_loop-b")
    run_plan(rates, context(tmp_path, LOAD, observe=observe.model_dump()), layout=fake_locust)
    posts = basic_grafana.annotations
    assert len(posts) == 2 + 3
    assert {p.auth for p in posts} == {_basic("ops", "p,1=x")}
    texts = [p.body["text"] for p in posts if p.body is not None]
    assert len(set(texts)) == len(texts) == 5
    assert texts[2:] == [f"open_loop: {r:g} req/s on Q8_0 (fake), repeat 0" for r in (0.5, 1.0, 2.0)]
    assert [p.body["tags"][-1] for p in posts if p.body is not None] == ["sweep"] * 2 + ["open_loop"] * 3
    starts = [e.unix_s for e in iter_stage_events(tmp_path / "stages.jsonl") if e.event == "stage_start"]
    assert [p.body["time"] for p in posts if p.body is not None] == [round(s * 1000) for s in starts]


def test_no_grafana_url_means_no_request(
    tmp_path: Path, grafana: FakeGrafana, fake_locust: StageLinesOnly
) -> None:
    observe = ObserveSettings(grafana_token=SecretStr("glsa_abc"))
    run_plan(_sweep("sweep-1"), context(tmp_path, LOAD, observe=observe.model_dump()), layout=fake_locust)
    run_plan(_sweep("sweep-2"), context(tmp_path, LOAD), layout=fake_locust)
    assert grafana.seen == []


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{closed}",  # nothing listens
        "http://ops:hunter2@127.0.0.1:{closed}",  # credentials in the URL never reach the log
        "grafana:3000",  # no scheme
        "http://127.0.0.1:notaport",
    ],
)
def test_an_unreachable_grafana_costs_one_line_not_the_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, url: str, fake_locust: StageLinesOnly
) -> None:
    observe = ObserveSettings(grafana_url=url.format(closed=free_port()))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        summaries = run_plan(
            _sweep("sweep-1"), context(tmp_path, LOAD, observe=observe.model_dump()), layout=fake_locust
        ).summaries
    assert [s.status for s in summaries] == ["ok", "ok"]
    lines = [r for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING and lines[0].exc_info is None
    assert "did not take stage annotations (0 of 2 added)" in lines[0].getMessage()
    assert "hunter2" not in caplog.text


@pytest.mark.parametrize("fake", ["wrong password", "garbage"])
def test_a_grafana_that_refuses_or_babbles_costs_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fake: str, fake_locust: StageLinesOnly
) -> None:
    grafana = FakeGrafana(expected_auth=_basic("admin", "right"), garbage=fake == "garbage")
    try:
        password = SecretStr("wrong" if fake == "wrong password" else "right")
        observe = ObserveSettings(grafana_url=grafana.url, grafana_user="admin", grafana_password=password)
        with caplog.at_level(logging.INFO, logger=LOGGER):
            summaries = run_plan(
                _sweep("sweep-1"), context(tmp_path, LOAD, observe=observe.model_dump()), layout=fake_locust
            ).summaries
    finally:
        grafana.close()
    assert [s.status for s in summaries] == ["ok", "ok"]
    assert grafana.annotations == []
    lines = [r for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "did not take stage annotations" in lines[0].getMessage()


@pytest.mark.slow
def test_quantload_load_annotates_every_stage_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, basic_grafana: FakeGrafana
) -> None:
    """`quantload load` with two experiments: Locust processes, a fake llama-server, fake Grafana."""
    for name in [n for n in os.environ if n.startswith("QUANTLOAD_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTLOAD_OBSERVE__GRAFANA_URL", basic_grafana.url)
    monkeypatch.setenv("QUANTLOAD_OBSERVE__GRAFANA_USER", "ops")
    monkeypatch.setenv("QUANTLOAD_OBSERVE__GRAFANA_PASSWORD", "p,1=x")
    monkeypatch.setenv("QUANTLOAD_LOAD__OPEN_LOOP_REQUESTS", "4")
    out = tmp_path / "run"
    with FakeServer(FakeScript(ttft_ms=(1, 3), itl_ms=(1, 2), tokens=2)) as fake:
        code = cli_main([
            "load", "--url", fake.url, "--name", "fake", "--quant", "Q4_K_M", "--out", str(out),
            "-e", "sweep", "-e", "open_loop", "--users", "1,2", "--repeats", "1", "--rates", "20",
            "--prompt-count", "2", "--max-tokens", "2", "--metrics-port", "0", "--run-id", "cli-run",
        ])  # fmt: skip
    assert code == 0
    events = list(iter_stage_events(out / "stages.jsonl"))
    starts = {e.stage_id: e for e in events if e.event == "stage_start"}
    ends = {e.stage_id: e for e in events if e.event == "stage_end"}
    assert len(starts) == 3
    posts = [p.body for p in basic_grafana.annotations if p.body is not None]
    assert {p.auth for p in basic_grafana.annotations} == {_basic("ops", "p,1=x")}
    assert sorted((p["time"], p["timeEnd"]) for p in posts) == sorted(
        (round(starts[i].unix_s * 1000), round(ends[i].unix_s * 1000)) for i in starts
    )
    assert [p["text"] for p in posts] == [
        "sweep: 1 users on Q4_K_M (fake), repeat 0",
        "sweep: 2 users on Q4_K_M (fake), repeat 0",
        "open_loop: 20 req/s on Q4_K_M (fake), repeat 0",
    ]
    assert all(p["tags"][:3] == ["quantload", "stage", "Q4_K_M"] for p in posts)
