"""Imports read from the source with `ast` (nothing is imported): which modules of a package
import which, to check layering rules and cycles without running any of it.

Every import statement counts, inside functions too (a lazy import still runs, later), except
those under `if TYPE_CHECKING:`, which never run. Importing `a.b.c` also runs the packages `a.b`
and `a` that the importing module is not already inside.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

#: module -> the modules it imports (of any package: filter by prefix)
Graph = dict[str, set[str]]


def modules_of(directory: Path, package: str) -> dict[str, Path]:
    """Every module under `directory`, the folder of `package`, by its dotted name."""
    found = {}
    for path in sorted(directory.rglob("*.py")):
        parts = list(path.relative_to(directory).with_suffix("").parts)
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join([package, *parts])] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    return skipped


def imported_names(module: str, path: Path) -> Iterator[str]:
    """The dotted names `module` imports: `a.b` for `import a.b`, and both `a.b` and `a.b.x` for
    `from a.b import x` (x may be a submodule or a name in a.b)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_only(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([base] if base else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def module_graph(directory: Path, package: str) -> Graph:
    """Each module of `package` and the modules of `package` it imports (run when imported)."""
    modules = modules_of(directory, package)
    graph: Graph = {}
    for module, path in modules.items():
        own = {module.rsplit(".", n)[0] for n in range(module.count(".") + 1)}
        targets: set[str] = set()
        for name in imported_names(module, path):
            parts = name.split(".")
            for n in range(1, len(parts) + 1):
                prefix = ".".join(parts[:n])
                if prefix in modules and prefix not in own:
                    targets.add(prefix)
        graph[module] = targets
    return graph


def external_imports(directory: Path, package: str, prefix: str) -> dict[str, set[str]]:
    """Each module of `package` that imports something under `prefix`, with what it imports."""
    found: dict[str, set[str]] = {}
    for module, path in modules_of(directory, package).items():
        hits = {
            name
            for name in imported_names(module, path)
            if name == prefix or name.startswith(prefix + ".")
        }
        if hits:
            found[module] = hits
    return found


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)
