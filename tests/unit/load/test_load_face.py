"""The load package's face: `__all__` names what the rest of quantload may use, every name
resolves, and nothing outside load/ reaches past it. (A name costs only its own module, seen in a
fresh interpreter: tests/integration/test_fresh_imports.py.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import quantload.load as face

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "src" / "quantload"


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert face.__all__ == sorted(face.__all__)
    for name in face.__all__:
        assert getattr(face, name) is not None, name


def _deep_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        modules = []
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        found += [m for m in modules if m.startswith("quantload.load.")]
    return found


def test_nothing_outside_load_reaches_past_its_face() -> None:
    outside = [
        path
        for folder in (PACKAGE, REPO / "benchmarks")
        for path in folder.rglob("*.py")
        if PACKAGE / "load" not in path.parents
    ]
    reaching = {str(path.relative_to(REPO)): _deep_imports(path) for path in outside}
    assert {path: modules for path, modules in reaching.items() if modules} == {}
    # Locust loads the user class and the interactive mode itself: the one door into in_locust
    for locustfile in (REPO / "locustfiles").glob("*.py"):
        assert {m.split(".")[2] for m in _deep_imports(locustfile)} <= {"in_locust"}
