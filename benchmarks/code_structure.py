"""The shape of quantload's code: modules and lines per package, import loops, packages that import
each other, long functions and functions with many parameters (issue 34's before and after).

Imports are read with `ast` from src/quantload, those inside functions included (a deferred import
still ties two modules together), those under `if TYPE_CHECKING:` left out (a type checker's view,
never run). An import loop is a strongly connected group of modules: each
reaches every other through imports. A two-way package pair is two packages of quantload (its first
level: analysis, load, ...) where each imports something of the other.

    .venv/bin/python benchmarks/code_structure.py [--src src/quantload] [--top 10]
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LONG_FUNCTION_LINES = 60
MANY_PARAMETERS = 8


@dataclass(frozen=True)
class Module:
    name: str  # quantload.load.plan
    path: Path
    tree: ast.Module
    lines: int

    @property
    def package(self) -> str:
        """Its first-level package under quantload ('load'), or '' for a top-level module."""
        parts = self.name.split(".")
        is_package = self.path.name == "__init__.py"
        return parts[1] if len(parts) > 2 or (is_package and len(parts) == 2) else ""


def read_modules(src: Path) -> dict[str, Module]:
    """Every module under `src`, named as Python imports it (`src` may be the package's folder or
    the folder that holds it)."""
    if not (src / "__init__.py").is_file() and (src / "quantload" / "__init__.py").is_file():
        src = src / "quantload"
    modules = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        text = path.read_text(encoding="utf-8")
        modules[name] = Module(name, path, ast.parse(text), len(text.splitlines()))
    return modules


def imported(module: Module, known: set[str]) -> set[str]:
    """The modules of `known` that `module` imports (a name imported from a package counts as its
    module where there is one, else the package)."""
    found = set()
    for node in _runtime_nodes(module.tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # every name of `from X import a, b`: X.a where it is a module, else X (parents of an
            # imported module are not counted, as for `import X.a`)
            targets = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                for a in node.names
            ]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module.name:
                found.add(target)
    return found


def _type_checking_only(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of `tree` but those under `if TYPE_CHECKING:` (their `else` kept)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if _type_checking_only(node):
            assert isinstance(node, ast.If)
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def functions(module: Module) -> Iterator[tuple[str, int, int]]:
    """(qualified name, lines, parameters) of every function and method of `module`."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
            count += int(args.vararg is not None) + int(args.kwarg is not None)
            if args.args and args.args[0].arg in ("self", "cls"):
                count -= 1
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            yield f"{module.name}:{node.name}", lines, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src" / "quantload")
    parser.add_argument("--top", type=int, default=10, help="how many long functions to name")
    args = parser.parse_args()
    modules = read_modules(args.src)
    known = set(modules)
    graph = {name: imported(module, known) for name, module in modules.items()}

    per_package: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for module in modules.values():
        per_package[module.package or "(top level)"][0] += 1
        per_package[module.package or "(top level)"][1] += module.lines
    print(f"{len(modules)} modules, {sum(m.lines for m in modules.values())} lines")
    print("package: modules, lines")
    for package, (count, lines) in sorted(per_package.items()):
        print(f"  {package}: {count}, {lines}")

    groups = loops(graph)
    print(f"import loops: {len(groups)} (modules in them: {sum(len(g) for g in groups)})")
    for group in sorted(groups, key=len, reverse=True):
        shown = ", ".join(group[:6]) + (f", ... ({len(group)} modules)" if len(group) > 6 else "")
        print(f"  {shown}")

    package_edges = {
        (modules[a].package, modules[b].package)
        for a, targets in graph.items()
        for b in targets
        if modules[a].package and modules[b].package and modules[a].package != modules[b].package
    }
    two_way = sorted({tuple(sorted(edge)) for edge in package_edges if edge[::-1] in package_edges})
    print(f"two-way package pairs: {len(two_way)}")
    for first, second in two_way:
        print(f"  {first} <-> {second}")

    every = [entry for module in modules.values() for entry in functions(module)]
    long = sorted((e for e in every if e[1] > LONG_FUNCTION_LINES), key=lambda e: -e[1])
    many = sorted((e for e in every if e[2] > MANY_PARAMETERS), key=lambda e: -e[2])
    print(f"functions over {LONG_FUNCTION_LINES} lines: {len(long)} of {len(every)}")
    for name, lines, _ in long[: args.top]:
        print(f"  {name}: {lines} lines")
    print(f"functions with more than {MANY_PARAMETERS} parameters: {len(many)}")
    for name, _, count in many[: args.top]:
        print(f"  {name}: {count} parameters")


if __name__ == "__main__":
    main()
