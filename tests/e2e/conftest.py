"""A failed e2e test shows what its module says about the failure (the compose e2e: every one-shot
job's whole log), as sections of the test's report."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if not report.failed or report.when != "call":
        return
    sections: Callable[[pytest.Item], list[tuple[str, str]]] | None = getattr(
        getattr(item, "module", None), "failure_sections", None
    )
    if sections is not None:
        for title, text in sections(item):
            report.sections.append((title, text))
