"""Every file and folder name of a run directory is defined once, in quantload.rundir, and code
reaches those files through RunDir (RunPaths), never by joining a name onto a folder itself."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import quantload
from quantload import rundir
from quantload.rundir import RunPaths
from quantload.rundir.handle import RunDir

SOURCE = Path(quantload.__file__).parent
RUNDIR_PACKAGE = SOURCE / "rundir"
FILE_SUFFIXES = (".json", ".jsonl", ".csv", ".md", ".html")
NAME_SUFFIXES = ("_JSON", "_JSONL", "_CSV", "_MD", "_HTML", "_DIR")
# File and folder names defined outside quantload.rundir because they are not in a run directory:
# (module, constant) -> where the file is.
NOT_IN_A_RUN_DIRECTORY: dict[tuple[str, str], str] = {
    ("load/calibration_file.py", "CALIBRATION_DIR"): "the calibration folder beside the run directories",
    ("load/calibration_file.py", "LATEST_JSON"): "in the calibration folder",
    ("llamacpp/build.py", "BUILD_MARKER"): "in llama.cpp's build folder in the cache",
    ("llamacpp/build.py", "CONFIGURE_RECORD"): "in llama.cpp's build folder in the cache",
    ("analysis/document.py", "TEMPLATE_NAME"): "the report template shipped with quantload",
    ("analysis/compare.py", "COMPARE_MD"): "in a comparison's own folder (compare-<A>-vs-<B>)",
    ("analysis/compare.py", "COMPARE_HTML"): "in a comparison's own folder (compare-<A>-vs-<B>)",
    ("analysis/compare.py", "COMPARE_CSV"): "in a comparison's own folder (compare-<A>-vs-<B>)",
    ("assets.py", "PACKAGED_DIR"): "inside the installed package",
    ("models/prepared.py", "PREPARED_DIR"): "in the cache (prepared model files)",
    ("roofline/probe.py", "PROBE_DIR"): "in the cache (the machine probe's result)",
}


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(SOURCE).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(SOURCE.rglob("*.py"))
    ]


def _string_constants(tree: ast.Module) -> dict[str, str]:
    """The module-level `NAME = "text"` assignments of a module."""
    found: dict[str, str] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        target = node.target if isinstance(node, ast.AnnAssign) else target
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
            found[target.id] = value.value
    return found


def _looks_like_a_file_name(name: str, value: str) -> bool:
    return value.endswith(FILE_SUFFIXES) or name.endswith(NAME_SUFFIXES)


def _run_names() -> dict[str, str]:
    """quantload.rundir's file and folder names, by constant."""
    tree = ast.parse((RUNDIR_PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    return {
        name: value for name, value in _string_constants(tree).items() if _looks_like_a_file_name(name, value)
    }


def test_file_names_are_defined_in_rundir_only() -> None:
    found: dict[tuple[str, str], str] = {}
    for module, tree in _modules():
        if module == "rundir/__init__.py":
            continue
        for name, value in _string_constants(tree).items():
            if _looks_like_a_file_name(name, value):
                found[(module, name)] = value
    strays = {key: value for key, value in found.items() if key not in NOT_IN_A_RUN_DIRECTORY}
    assert not strays, f"define run-directory names in quantload.rundir (or allow them here): {strays}"
    stale = set(NOT_IN_A_RUN_DIRECTORY) - set(found)
    assert not stale, f"allowed names no longer defined: {stale}"


def test_no_two_run_names_share_a_file() -> None:
    names = _run_names()
    by_value: dict[str, list[str]] = {}
    for name, value in names.items():
        by_value.setdefault(value, []).append(name)
    assert {value: both for value, both in by_value.items() if len(both) > 1} == {}
    assert "load-summary.json" in names.values() and "summary.json" in names.values()


def test_layout_lists_every_name() -> None:
    layout = rundir.__doc__ or ""
    assert [value for value in _run_names().values() if value not in layout] == []


def test_run_paths_reach_every_name(tmp_path: Path) -> None:
    files = RunDir(tmp_path)
    reached: set[str] = set()
    for attribute in dir(RunPaths):
        if attribute.startswith("_") or attribute == "holds_run_files":
            continue
        value = getattr(files, attribute)
        if callable(value):
            assert len(inspect.signature(value).parameters) == 1, attribute
            value = value("x")
        if isinstance(value, Path) and value != tmp_path:
            reached.add(value.relative_to(tmp_path).parts[0])
    assert sorted(set(_run_names().values()) - reached) == []
    assert files.plan_path("sweep-1") == tmp_path / "load-plans" / "sweep-1.json"
    assert files.tensor_types_path("Q4_K_M") == tmp_path / "tensor-types-Q4_K_M.txt"
    assert files.log_path("prometheus.log") == tmp_path / "logs" / "prometheus.log"


def test_holds_run_files(tmp_path: Path) -> None:
    files = RunPaths(tmp_path)
    assert not files.holds_run_files()
    files.logs.mkdir(exist_ok=True)
    assert not files.holds_run_files()
    files.kv_path.write_text("{}", encoding="utf-8")
    assert files.holds_run_files()


def test_no_module_joins_a_run_name_onto_a_folder() -> None:
    """`folder / KV_JSON` outside quantload.rundir: use RunDir(folder).kv_path."""
    names = set(_run_names())
    joins = []
    for module, tree in _modules():
        if module.startswith("rundir/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                right = node.right
                name = right.id if isinstance(right, ast.Name) else getattr(right, "attr", None)
                if name in names:
                    joins.append(f"{module}:{node.lineno} / {name}")
    assert joins == []
