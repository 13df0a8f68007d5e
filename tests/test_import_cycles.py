"""No import circles in the speedgpt package.

The walk reads every module's imports with ast, module-level and function-level alike: a deferred
import inside a function is how a circle is usually hidden ("(stages.py builds on the config
package)"), and it still ties the two modules together, so it counts. Imports under
`if TYPE_CHECKING:` never run and do not count. Importing `a.b.c` runs the packages `a.b` first, so
an import names the module and every package above it, except the importer's own packages (a
module is always imported through them).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "speedgpt"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_names(tree: ast.AST) -> list[tuple[int, str | None, list[str]]]:
    """(level, module, names) of every import statement that runs, at any depth."""
    found = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.orelse:
                    visit_stmt(stmt)
                continue
            visit_stmt(child)

    def visit_stmt(stmt: ast.AST) -> None:
        if isinstance(stmt, ast.Import):
            found.extend((0, alias.name, []) for alias in stmt.names)
        elif isinstance(stmt, ast.ImportFrom):
            found.append((stmt.level, stmt.module, [alias.name for alias in stmt.names]))
        else:
            visit(stmt)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        targets = set()
        for level, module, names in _imported_names(ast.parse(path.read_text())):
            if level:
                base_parts = package.split(".")[:len(package.split(".")) - level + 1]
                base = ".".join(base_parts + ([module] if module else []))
            else:
                base = module or ""
            for target in [f"{base}.{n}" if f"{base}.{n}" in modules else base for n in names] or [base]:
                parts = target.split(".")
                targets |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        graph[name] = {t for t in targets if t in modules and t != name and t not in own}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_walk_sees_function_level_and_package_imports():
    graph = import_graph()
    assert "speedgpt.config" in graph["speedgpt.train.loop"]  # module level, a package
    assert "speedgpt.data.tokenize" in graph["speedgpt.train.build"]  # inside a function
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)
