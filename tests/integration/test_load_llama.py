"""Load generation against a real llama-server on the tiny model: stages, open loop, prompt cache,
distributed mode, and the Locust web UI in headless Chromium.

Each test is bounded (request deadlines, stage timeouts, subprocess timeouts) and talks to
127.0.0.1 only. Assertions are on counts, server-reported token numbers and causality, never on
how fast this shared machine happens to be.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from load_api import experiment
from quantload.config import LoadSettings
from quantload.llamacpp.server import LlamaServer, ServerSpec, free_port
from quantload.llamacpp.toolchain import Toolchain
from quantload.load.records import RequestRecord, StageEvent, iter_records, iter_stage_events
from quantload.served import ServedTarget
from support import require_binary

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture(scope="module")
def llama(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServedTarget]:
    """One llama-server (tiny Q4_K_M, 4 slots of 2048 tokens) shared by this module's tests."""
    logs = tmp_path_factory.mktemp("llama-load")
    spec = ServerSpec(model_path=tiny_models["Q4_K_M"], alias="tiny", slots=4, ctx_per_slot=2048)
    with LlamaServer(toolchain, spec, logs / "llama-server.log", startup_timeout_s=120) as server:
        yield ServedTarget(name="tiny", quant="Q4_K_M", model="tiny", url=server.url)


def small(**changes: object) -> LoadSettings:
    base: dict[str, object] = dict(
        users=(1, 2), repeats=2, prompt_count=4, max_prompt_tokens=200, max_tokens=8,
        ignore_eos=True, warmup_requests=1, request_timeout_s=60, stage_timeout_s=120,
        first_round_jitter_s=0.02, metrics_port=0,
    )  # fmt: skip
    base.update(changes)
    return LoadSettings.model_validate(base)


def records_of(run_dir: Path) -> list[RequestRecord]:
    return list(iter_records(run_dir / "records.jsonl"))


def ends_of(run_dir: Path) -> list[StageEvent]:
    return [e for e in iter_stage_events(run_dir / "stages.jsonl") if e.event == "stage_end"]


class Scraper:
    """Polls the load generator's /metrics while a run goes on."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=1).text
                if "quantload_ttft_seconds_count{" in text:
                    self.seen.append(text)
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def test_closed_loop_stages_with_the_cache_controlled(llama: ServedTarget, tmp_path: Path) -> None:
    port = free_port()
    with Scraper(port) as scraper:
        summaries = experiment("sweep", llama, small(metrics_port=port), tmp_path, "it-sweep")
    assert [(s.users, s.repeat, s.status) for s in summaries] == [
        (1, 0, "ok"), (2, 0, "ok"), (1, 1, "ok"), (2, 1, "ok"),
    ]  # fmt: skip
    records = records_of(tmp_path)
    measured = [r for r in records if not r.warmup]
    # each stage sends its 4 prompts, then the same again until its level is decided (5 s at most)
    assert len(measured) >= 16 and len([r for r in records if r.warmup]) == 4
    for record in measured:
        assert record.ok, record.error
        assert record.cache_prompt is False
        assert record.completion_tokens == 8  # ignore_eos: output length fixed by max_tokens
        assert record.timings is not None and record.timings["cache_n"] == 0  # no prompt reuse
        assert record.prompt_tokens is not None and record.prompt_tokens > 0
        assert record.ttft_s is not None and record.e2e_s is not None
        assert 0 < record.ttft_s <= record.e2e_s
        assert record.tpot_s is not None and record.tpot_s > 0
        assert record.itl_count >= 1
        assert record.connection_reused is False  # llama-server closes after every stream
    # the same prompts in the same order at every stage
    by_stage: dict[str, list[str]] = {}
    for record in measured:
        by_stage.setdefault(record.stage_id or "", []).append(record.prompt_id)
    assert len({tuple(sorted(set(ids))) for ids in by_stage.values()}) == 1
    assert all(s.ttft_p50_s is not None and s.ok >= 4 and s.level_outcome is not None for s in summaries)
    for summary in summaries:  # goodput: the requests that met the SLO (1 s TTFT, 100 ms TPOT) on their own
        mine = [r for r in measured if r.stage_id == summary.stage_id]
        met = [r for r in mine if (r.ttft_s or 9) <= 1.0 and (r.tpot_s or 0) <= 0.1 and r.within_deadline]
        assert summary.good == len(met)
    assert scraper.seen, "the load generator's /metrics never showed a TTFT observation"
    text = scraper.seen[-1]
    # traffic of no [[tenants]] carries the tenant label empty
    assert 'quantload_ttft_seconds_count{experiment="sweep",quant="Q4_K_M",server="tiny",tenant=""}' in text
    assert "quantload_requests_total{" in text and "_created" not in text


def test_open_loop_poisson_arrivals(llama: ServedTarget, tmp_path: Path) -> None:
    load = small(open_loop_requests=8, open_loop_users=4, warmup_requests=0, rates_rps=(4.0,))
    summaries = experiment("open_loop", llama, load, tmp_path, "it-open")
    assert [(s.experiment, s.rate_rps, s.status, s.ok) for s in summaries] == [
        ("open_loop", 4.0, "ok", 8)
    ]
    records = records_of(tmp_path)
    assert len(records) == 8
    intended = sorted(r.intended_unix_s for r in records)
    assert intended[-1] - intended[0] > 0.1
    for record in records:
        assert record.ttft_from_intended_s == pytest.approx((record.ttft_s or 0) + record.lag_s)


def test_prompt_cache_experiment(llama: ServedTarget, tmp_path: Path) -> None:
    load = small(prefix_tokens=1500, prefix_requests=3, prefix_users=1, repeats=1)
    summaries = experiment("prefix_cache", llama, load, tmp_path, "it-prefix")
    assert [(s.cache_prompt, s.status, s.ok) for s in summaries] == [
        (False, "ok", 3),
        (True, "ok", 3),
    ]
    ends = ends_of(tmp_path)
    assert all(e.prefix_tokens is not None and abs(e.prefix_tokens - 1500) <= 30 for e in ends)
    assert "prefix primed" in (ends[1].server_state or "")
    measured = [r for r in records_of(tmp_path) if not r.warmup]
    off = [r.timings for r in measured if not r.cache_prompt]
    on = [r.timings for r in measured if r.cache_prompt]
    assert off and on and all(t is not None for t in off + on)
    assert all(t["cache_n"] == 0 and t["prompt_n"] >= 1470 for t in off if t)  # all recomputed
    assert all(t["cache_n"] >= 1470 and t["prompt_n"] < 300 for t in on if t)  # prefix reused
    print(
        "prefix experiment TTFT p50 ms: off",
        round((summaries[0].ttft_p50_s or 0) * 1000),
        "on",
        round((summaries[1].ttft_p50_s or 0) * 1000),
    )


def test_distributed_master_and_two_workers(llama: ServedTarget, tmp_path: Path) -> None:
    load = small(workers=2, users=(2,), repeats=1)
    summaries = experiment("sweep", llama, load, tmp_path, "it-dist")
    assert [s.status for s in summaries] == ["ok"] and summaries[0].ok >= 4  # then sent until decided
    measured = [r for r in records_of(tmp_path) if not r.warmup]
    assert len(measured) == summaries[0].requests and all(r.ok for r in measured)
    assert len({r.worker for r in measured}) == 2  # one user on each worker
    (end,) = ends_of(tmp_path)
    assert end.workers == 2 and end.requests_done == len(measured) and end.level_outcome is not None


def test_locust_web_ui_shows_ttft_and_tpot_rows(llama: ServedTarget, tmp_path: Path) -> None:
    chromium = shutil.which("chromium-browser") or require_binary("chromium", "apt-get install -y chromium")
    web_port = free_port()
    env = {**os.environ, "QUANTLOAD_LOAD__MAX_TOKENS": "8"}
    locust = subprocess.Popen(
        [
            sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "chat_stream.py"),
            "--host", llama.url, "--web-host", "127.0.0.1", "--web-port", str(web_port),
            "--autostart", "-u", "2", "-r", "2", "-t", "90s", "--ql-server", "tiny",
            "--ql-quant", "Q4_K_M", "--ql-metrics-port", "0",
        ],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        rows: dict[str, int] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                stats = httpx.get(f"http://127.0.0.1:{web_port}/stats/requests", timeout=2).json()
                rows = {s["name"]: s["num_requests"] for s in stats["stats"]}
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if rows.get("TTFT", 0) >= 2 and rows.get("TPOT", 0) >= 2:
                break
            time.sleep(0.5)
        assert rows.get("TTFT", 0) >= 2 and rows.get("TPOT", 0) >= 2, rows
        url = f"http://127.0.0.1:{web_port}/"
        common = [chromium, *CHROMIUM_FLAGS, "--window-size=1400,900", "--virtual-time-budget=10000"]
        dom = subprocess.run(
            [*common, f"--user-data-dir={tmp_path / 'chrome-dom'}", "--dump-dom", url],
            capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
        shot = tmp_path / "locust-ui.png"
        subprocess.run(
            [*common, f"--user-data-dir={tmp_path / 'chrome-shot'}", f"--screenshot={shot}", url],
            capture_output=True, timeout=90, check=False,
        )  # fmt: skip
    finally:
        locust.terminate()
        try:
            locust.wait(15)
        except subprocess.TimeoutExpired:
            locust.kill()
            locust.wait(5)
    cells = _row_cells(dom.stdout)
    for name in ("TTFT", "TPOT"):
        assert name in cells, f"no {name} row in the rendered UI"
        numbers = [c for c in cells[name] if _is_number(c)]
        assert len(numbers) >= 5 and int(numbers[0]) >= 2, cells[name]  # requests, then timings
    from PIL import Image  # matplotlib's dependency; only this test needs it

    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 900)
    colors = image.getcolors(1 << 24) or []
    assert len(colors) > 50, "the screenshot is blank"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _row_cells(html: str) -> dict[str, list[str]]:
    """{row name: cell texts} of the statistics table, from the rendered DOM."""
    rows: dict[str, list[str]] = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", html, flags=re.S):
        cells = [
            re.sub(r"<[^>]+>", "", cell).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)
        ]
        if len(cells) >= 3:
            rows[cells[1]] = cells[2:]
    return rows


def test_dump_of_the_ui_parser() -> None:
    html = "<table><tr><td>LLM</td><td>TTFT</td><td>4</td><td>0</td><td>630</td></tr></table>"
    assert _row_cells(html) == {"TTFT": ["4", "0", "630"]}
