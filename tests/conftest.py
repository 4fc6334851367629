"""Shared fixtures: the llama.cpp toolchain, the tiny synthetic models, WikiText-2 test data.

Integration fixtures skip with a reason when a tool is missing, unless QUANTLOAD_REQUIRE_INTEGRATION=1
(set by CI), where a missing tool fails the test instead of hiding it.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fake_grafana import FakeGrafana
from quantload.config import ToolchainSettings
from quantload.llamacpp.toolchain import Toolchain, ensure_llama_source, find_toolchain
from quantload.models.prepare import prepare_models
from quantload.models.prepared import PREPARED_DIR
from quantload.paths import cache_root
from support import CI_API_KEY, GRAFANA_ANNOTATIONS_JSON, clean_env, missing, run_quantload

REPO_ROOT = Path(__file__).resolve().parent.parent
LONG_TESTS_ENV = "QUANTLOAD_LONG_TESTS"


# The tiers `make test` runs, in its order, and what each one needs: said as each begins.
TIERS = {
    "unit": "pure logic with fakes, no process started, seconds each",
    "integration": "processes: the real llama.cpp tools, Prometheus, Locust, Chromium, quantload itself",
    "e2e": "quantload run end to end, compose, hosts in network namespaces: minutes each",
}


def pytest_collection(session: pytest.Session) -> None:
    """Say that collecting has begun: importing every test module takes a while."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("collecting the tests (every test module is imported first)")


class TierLines:
    """A line as each tier begins, and, past the unit tier, the name of each test as it starts
    (they run for minutes where a dot would be all there is to see)."""

    def __init__(self, reporter: Any) -> None:
        self.reporter = reporter
        self.tier = ""

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        parts = nodeid.split("/")
        tier = parts[1] if parts[0] == "tests" and len(parts) > 2 else parts[0]
        if tier not in TIERS:
            return
        if tier != self.tier:
            self.tier = tier
            self.reporter.write_line("")
            self.reporter.write_line(f"== {tier} tests: {TIERS[tier]} ==", bold=True)
        if tier != "unit" and self.reporter.verbosity <= 0:
            self.reporter.write_line(f"   {nodeid}")


@pytest.hookimpl(trylast=True)  # after the terminal reporter is set up
def pytest_configure(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        config.pluginmanager.register(TierLines(reporter), "quantload-tier-lines")


# Warnings are errors (pyproject.toml), with one kept exception outside the unit tier: an unclosed
# file or socket (ResourceWarning) is shown in the summary, not failed. Those tiers start real
# processes and kill them mid-stream on purpose; what a killed child leaves (its pipes, a Docker
# engine's socket) is reported by the garbage collector in whichever later test runs it, or after
# the last test, so as an error it fails a test, or the session, that did nothing wrong. The unit
# tier holds them as errors again (its tests' own marks), keeping the configuration's ignores.
UNIT_TIER_ERRORS = ("error::ResourceWarning", "error::pytest.PytestUnraisableExceptionWarning")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `long` run only where QUANTLOAD_LONG_TESTS=1 (`make test-long`); unclosed
    files and sockets are errors again in tests/unit."""
    unit = Path(__file__).parent / "unit"
    ignores = [line for line in config.getini("filterwarnings") if line.startswith("ignore:")]
    unit_filters = pytest.mark.filterwarnings(*UNIT_TIER_ERRORS, *ignores)  # the last one given wins
    for item in items:
        if unit in item.path.parents:
            item.add_marker(unit_filters)
    if os.environ.get(LONG_TESTS_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"a long end-to-end run: `make test-long` ({LONG_TESTS_ENV}=1) runs it")
    for item in items:
        if item.get_closest_marker("long") is not None:
            item.add_marker(skip)


def _toolchain_settings() -> ToolchainSettings:
    llama_bin = os.environ.get("QUANTLOAD_LLAMA_BIN")
    return ToolchainSettings(llama_bin=Path(llama_bin) if llama_bin else None)


@pytest.fixture(scope="session")
def toolchain() -> Toolchain:
    """The llama.cpp tools, found without building (run 'quantload toolchain' first)."""
    found = find_toolchain(_toolchain_settings(), os.environ)
    if found is None:
        missing("llama.cpp tools not built: run 'quantload toolchain'")
    assert found is not None
    return found


@pytest.fixture(scope="session")
def tiny_models(toolchain: Toolchain) -> dict[str, Path]:
    """F16, Q8_0 and Q4_K_M files of the tiny synthetic Qwen2 model: {quant: path}."""
    out = cache_root(None, os.environ) / PREPARED_DIR / "tiny"  # the folder `quantload run` uses
    settings = _toolchain_settings()
    manifest = prepare_models(
        "tiny",
        out,
        toolchain,
        cache_root(None, os.environ),
        os.environ,
        functools.partial(ensure_llama_source, settings, os.environ),
    )
    return {quant: out / entry.file for quant, entry in manifest.files.items()}


@pytest.fixture(scope="session")
def wikitext_test_raw() -> Path:
    """WikiText-2 test split for tests only (the product never reads this folder).

    QUANTLOAD_TEST_WIKITEXT, else `shared/data/wikitext-2-raw/wiki.test.raw` beside the checkout
    or beside any folder above it.
    """
    configured = os.environ.get("QUANTLOAD_TEST_WIKITEXT")
    candidates = [Path(configured)] if configured else []
    candidates += [
        folder / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw" for folder in REPO_ROOT.parents
    ]
    for path in candidates:
        if path.is_file():
            return path
    missing("WikiText-2 test data not found: set QUANTLOAD_TEST_WIKITEXT to wiki.test.raw")
    raise AssertionError("unreachable")


@pytest.fixture(autouse=True)
def _no_quantload_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see no QUANTLOAD_* configuration from the developer's shell."""
    for name in list(os.environ):
        if name.startswith("QUANTLOAD_") and name not in (
            "QUANTLOAD_LLAMA_BIN",
            "QUANTLOAD_REQUIRE_INTEGRATION",
            "QUANTLOAD_TEST_WIKITEXT",
        ):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def ci_run(
    toolchain: Toolchain,
    tiny_models: dict[str, Path],
    wikitext_test_raw: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The run directory of one complete `quantload run --model tiny --profile ci` (a few minutes).

    Shared by every test that reads a run (e2e checks, report tests); tests that change it work
    on a copy.
    """
    out = tmp_path_factory.mktemp("ci-run")
    env = clean_env()
    grafana = FakeGrafana(expected_auth="Bearer glsa_ci", lifetime_s=1800)
    env["QUANTLOAD_OBSERVE__GRAFANA_URL"] = grafana.url
    env["QUANTLOAD_OBSERVE__GRAFANA_TOKEN"] = "glsa_ci"
    env["QUANTLOAD_SERVER__API_KEY"] = CI_API_KEY  # the servers require it; no file may show it
    try:
        result = run_quantload(
            [
                "run",
                "--model",
                "tiny",
                "--profile",
                "ci",
                "--out",
                str(out),
                "--dataset",
                str(wikitext_test_raw),
            ],
            cwd=out,
            env=env,
        )
    finally:
        grafana.close()
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    pushed = [seen.body for seen in grafana.annotations]
    (out / GRAFANA_ANNOTATIONS_JSON).write_text(json.dumps(pushed), encoding="utf-8")
    return run_dir


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    """A fake Grafana that takes any credentials; closed after the test (unit and integration
    tiers)."""
    fake = FakeGrafana()
    yield fake
    fake.close()
