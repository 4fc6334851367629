"""The test tree itself: pytest imports test files by their base name (rootdir import mode, no
package `__init__` files), so two test files with one name break collection of the whole suite; and
the unit tier holds no test marked `integration`."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_base_name() -> None:
    paths_by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS_DIR.rglob("test_*.py"):
        paths_by_name[path.name].append(str(path.relative_to(TESTS_DIR)))
    shared = {name: paths for name, paths in paths_by_name.items() if len(paths) > 1}
    assert not shared, f"rename one of each: {shared}"


def test_no_unit_test_is_marked_integration() -> None:
    """An integration test (one that starts a process) lives in tests/integration; tests/unit's
    conftest.py fails any unit test that starts one."""
    marked = [
        str(path.relative_to(TESTS_DIR))
        for path in (TESTS_DIR / "unit").rglob("*.py")
        if path != Path(__file__).resolve() and "mark.integration" in path.read_text(encoding="utf-8")
    ]
    assert not marked, f"move to tests/integration: {marked}"
