"""No import circle between kerneltriage's modules: each module's module-level imports (those under
`if TYPE_CHECKING:` too, which a type checker follows) read statically with `ast`, and the graph they make has no
cycle. Imports inside functions are left out: they are how a module defers a framework or a heavy dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import kerneltriage

ROOT = Path(kerneltriage.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _module_level(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements a module runs (or a type checker reads) at its top level: in `if` and `try` blocks
    too, never in a function's or a class's body."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            found += _module_level(node.body) + _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            found += _module_level(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                found += _module_level(handler.body)
    return found


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The kerneltriage modules `name` imports at module level. `from pkg import sub` names the submodule `sub`
    (not `pkg`, whose __init__ any import of a submodule runs anyway)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _module_level(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
            continue
        base = node.module or ""
        if node.level:
            parent = package.split(".")[:len(package.split(".")) - node.level + 1]
            base = ".".join(parent + ([base] if base else []))
        for alias in node.names:
            found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {module for module in found if module in modules and module != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = stack[stack.index(node):]
                    del stack[stack.index(node):]
                    if len(component) > 1:
                        found.append(sorted(component))
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                work.append((step, iter(sorted(graph[step]))))
            elif step in stack:
                low[node] = min(low[node], index[step])
    return found


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    inside = set(component)
    return "; ".join(f"{name} → {', '.join(sorted(graph[name] & inside))}" for name in component)


def test_no_module_imports_itself_through_others() -> None:
    graph = import_graph()
    assert len(graph) > 150 and "kerneltriage.engine.backend" in graph["kerneltriage.bench.ab"]  # it reads them all
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(_describe(component, graph) for component in found)


def test_a_planted_circle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
