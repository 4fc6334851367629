"""The load package's faces: each module's `__all__` names what the rest of quantload may import from
it, every name it lists is defined there, nothing outside load/ imports a name a module does not
list or a module without a list, and the package itself imports nothing (one module costs only
itself and what it imports)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "src" / "quantload"
LOAD = PACKAGE / "load"


def _module_all(module: str) -> list[str] | None:
    """The literal `__all__` of quantload.load.<module>, read from its source (None: it has none)."""
    path = LOAD / f"{module.replace('.', '/')}.py"
    if not path.is_file():
        path = LOAD / module.replace(".", "/") / "__init__.py"
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list), f"{path}: __all__ is not a literal list"
            return value
    return None


def _load_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module under quantload.load, names) for each import of a load module in `path`."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "quantload.load" or node.module.startswith("quantload.load."):
                found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [
                (alias.name, [])
                for alias in node.names
                if alias.name == "quantload.load" or alias.name.startswith("quantload.load.")
            ]
    return found


def _outside_files() -> list[Path]:
    return [
        path
        for folder in (PACKAGE, REPO / "benchmarks")
        for path in folder.rglob("*.py")
        if LOAD not in path.parents
    ]


def test_each_listed_name_is_defined_in_its_module_and_sorted() -> None:
    listed = 0
    for path in sorted(LOAD.glob("*.py")):
        names = _module_all(path.stem)
        if names is None:
            continue
        assert names == sorted(names), path.name
        module = importlib.import_module(f"quantload.load.{path.stem}")
        for name in names:
            assert getattr(module, name, None) is not None, f"{path.name}: {name}"
        listed += len(names)
    assert listed >= 50  # the names the rest of quantload uses


def test_nothing_outside_load_imports_past_a_module_face() -> None:
    wrong: dict[str, list[str]] = {}
    for path in _outside_files():
        for module, names in _load_imports(path):
            where = str(path.relative_to(REPO))
            if module == "quantload.load" or not names:
                wrong.setdefault(where, []).append(f"{module}: import a module's names, not the package")
                continue
            short = module.removeprefix("quantload.load.")
            face = _module_all(short)
            if face is None:
                wrong.setdefault(where, []).append(f"{module} has no __all__: it is load/'s own")
                continue
            outside_face = sorted(set(names) - set(face))
            if outside_face:
                wrong.setdefault(where, []).append(f"{module}: {outside_face} not in its __all__")
    assert wrong == {}


def test_only_locustfiles_enter_in_locust() -> None:
    entering = [
        str(path.relative_to(REPO))
        for path in _outside_files()
        for module, _ in _load_imports(path)
        if module.startswith("quantload.load.in_locust")
    ]
    assert entering == []
    for locustfile in (REPO / "locustfiles").glob("*.py"):
        assert {m.split(".")[2] for m, _ in _load_imports(locustfile)} <= {"in_locust"}


def test_the_package_itself_imports_nothing() -> None:
    tree = ast.parse((LOAD / "__init__.py").read_text(encoding="utf-8"))
    statements = [node for node in tree.body if not isinstance(node, ast.Expr)]
    assert statements == [], "quantload/load/__init__.py holds only its docstring (the module map)"
