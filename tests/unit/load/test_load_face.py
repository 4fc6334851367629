"""The load package's face: `__all__` names what the rest of quantload may use, every name
resolves, nothing outside load/ reaches past it, and a name costs only its own module."""

from __future__ import annotations

import ast
import subprocess
import sys
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


def test_a_name_of_the_face_costs_only_its_own_module() -> None:
    code = (
        "import sys\n"
        "from quantload.load import RequestRecord\n"
        "assert 'quantload.load.supervisor' not in sys.modules, 'the supervisor was imported'\n"
        "assert 'quantload.load.fakeserver' not in sys.modules, 'the fake server was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
