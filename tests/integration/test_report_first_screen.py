"""report.html in headless Chromium at 1,400 x 900 pixels: the answer box is on the first screen
(no scrolling to reach it) and the main table needs no horizontal scroll bar.

The report holds no script; this test measures a copy of it with one added, which writes the
layout's numbers into the page that Chromium's --dump-dom prints.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from quantload.analysis import build_report
from quantload.config import SloSettings
from quantload.llamacpp.server import free_port
from quantload.slo import Slo
from support import require_binary
from unit.analysis.analysis_synthetic import mark_busy, write_kv, write_quality, write_synthetic_run

pytestmark = pytest.mark.integration

WIDTH, HEIGHT = 1400, 900
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", f"--window-size={WIDTH},{HEIGHT}",
]  # fmt: skip
QUANTS = ("F16", "Q8_0", "Q4_K_M")
MEASURE = """<script>
window.addEventListener("load", () => {
  const box = document.querySelector("div.decision").getBoundingClientRect();
  const table = document.getElementById("quant-table");
  const wrap = table.closest(".table-wrap");
  const found = {
    viewWidth: window.innerWidth, viewHeight: window.innerHeight,
    boxTop: box.top, boxBottom: box.bottom, boxRight: box.right,
    tableTop: table.getBoundingClientRect().top,
    wrapScroll: wrap.scrollWidth, wrapClient: wrap.clientWidth,
    pageScroll: document.documentElement.scrollWidth,
  };
  document.body.setAttribute("data-layout", JSON.stringify(found));
});
</script></body>"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A busy run's report (the answer box at its tallest) of three files at four load levels."""
    slow = {(quant, 8): 1.0 for quant in QUANTS}
    run = write_synthetic_run(tmp_path_factory.mktemp("chromium") / "run", quants=QUANTS,
                              users_levels=(1, 2, 4, 8), repeats=2, requests=40, ttft_added_s=slow)  # fmt: skip
    write_quality(run, {"F16": {"f16": (0.0, 0.0)}, "Q8_0": {"f16": (0.004, 0.0002)}, "Q4_K_M": {"f16": (0.06, 0.003)}})
    write_kv(run, QUANTS)
    mark_busy(run, ["Q8_0-sweep-0", "Q8_0-sweep-1", "Q8_0-sweep-2"], 0.58)
    slo = Slo.of(SloSettings(ttft_s=0.35, tpot_s=0.1, ttft_percentile="p50", tpot_percentile="p50",
                             max_failed_frac=0.25))  # fmt: skip
    return build_report(run, f"http://127.0.0.1:{free_port()}", slo=slo).html


def _layout(page: Path, profile: Path) -> dict[str, float]:
    chromium = require_binary("chromium", "apt-get install -y chromium")
    measured = page.with_name("measured.html")
    measured.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE, 1), encoding="utf-8")
    dom = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom",
         measured.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    ).stdout  # fmt: skip
    found = re.search(r'data-layout="([^"]+)"', dom)
    assert found is not None, f"Chromium laid out no page: {dom[:300]}"
    values: dict[str, float] = json.loads(found.group(1).replace("&quot;", '"'))
    return values


def test_the_answer_is_on_the_first_screen_and_the_table_fits_its_width(report: Path, tmp_path: Path) -> None:
    layout = _layout(report, tmp_path / "profile")
    assert layout["viewWidth"] == WIDTH and layout["viewHeight"] <= HEIGHT
    assert layout["boxTop"] >= 0 and layout["boxBottom"] <= layout["viewHeight"], layout  # seen without scrolling
    assert layout["boxRight"] <= layout["viewWidth"]
    assert layout["wrapScroll"] <= layout["wrapClient"], layout  # the main table has no horizontal scroll
    assert layout["pageScroll"] <= layout["viewWidth"], layout  # nor has the page
    assert layout["tableTop"] > layout["boxBottom"]


def test_a_screenshot_at_1400_pixels_shows_the_box_in_its_colours(report: Path, tmp_path: Path) -> None:
    from PIL import Image  # matplotlib's dependency; only the screenshot needs it

    chromium = require_binary("chromium", "apt-get install -y chromium")
    shot = tmp_path / "first-screen.png"
    subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
         report.resolve().as_uri()],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert shot.is_file(), "Chromium wrote no screenshot"
    image = Image.open(shot).convert("RGB")
    assert image.size == (WIDTH, HEIGHT)
    colours = image.getcolors(1 << 24) or []
    box_blue = sum(count for count, rgb in colours if rgb == (0xEA, 0xF1, 0xFB))  # the box's --verdict-bg
    warning = sum(count for count, rgb in colours if rgb == (0xFF, 0xF6, 0xE0))  # the busy line's --warn-bg
    assert box_blue > 50_000 and warning > 10_000, (box_blue, warning)
