"""Tests that need an optional extra (pyproject.toml's [project.optional-dependencies]) skip without it, and
say how to install it: a new user's `pip install -e ".[test]"` then `python -m pytest` passes (issue 37).

Mark the test `@requires_hf` (transformers) or `@requires_lm_eval`, or call `need("transformers")` in a
helper or fixture; never a bare `import transformers` outside such a test, nor
`pytest.importorskip("transformers")` (its reason names no install line). tests/test_extras.py reads every
test file with `unguarded_imports` and fails on an extra imported any other way; CI runs the files that
touch an extra (`python tests/extraskit.py` lists them) in a `.[test]`-only environment."""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

import pytest

# The import name of each optional extra's distributions: (extra, distribution). test_extras.py checks that
# every distribution of every extra but [test] is listed here, so a new extra cannot slip past the rule.
EXTRA_MODULES = {
    "transformers": ("hf", "transformers"),
    "lm_eval": ("hf", "lm-eval"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
}
TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "speedgpt"


def install_line(module: str) -> str:
    """The skip reason: what is missing and the one command that installs it."""
    return f"needs {module}: pip install -e \".[test,{EXTRA_MODULES[module][0]}]\""


def missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


def requires(module: str) -> pytest.MarkDecorator:
    """Skip the test (before its fixtures run) where `module`'s extra is not installed."""
    return pytest.mark.skipif(missing(module), reason=install_line(module))


def need(module: str):
    """Import `module` in a helper or fixture, or skip the calling test with the install line."""
    return pytest.importorskip(module, reason=install_line(module))


requires_hf = requires("transformers")
requires_lm_eval = requires("lm_eval")
REQUIRES_NAMES = {"requires_hf": "transformers", "requires_lm_eval": "lm_eval"}


def _imports(node: ast.AST, package: str = "") -> set[str]:
    """The modules an import statement names; `from a import b` names `a` and `a.b` (b may be a module)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
        return {base} | {f"{base}.{a.name}" for a in node.names}
    return set()


def _import_time_imports(tree: ast.Module, package: str) -> set[str]:
    """What importing the file runs: its imports outside function bodies."""
    out: set[str] = set()
    stack: list[ast.AST] = [tree]
    while stack:
        for child in ast.iter_child_nodes(stack.pop()):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                out |= _imports(child, package)
                stack.append(child)
    return out


@functools.cache
def package_modules_needing_extras() -> dict[str, str]:
    """speedgpt modules whose import imports an extra (directly or through another such module):
    {module: the extra's module}. A test importing one needs the extra as much as one importing it."""
    imports = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imports[name] = _import_time_imports(ast.parse(path.read_text()), package)
    needing: dict[str, str] = {}
    grew = True
    while grew:  # to a fixed point: importing a module that needs an extra needs it too
        grew = False
        for name, modules in imports.items():
            extra = None if name in needing else next(filter(None, (extra_of(m, needing) for m in modules)), None)
            if extra:
                needing[name] = extra
                grew = True
    return needing


def extra_of(module: str, needing: dict[str, str]) -> str | None:
    """The extra's module that importing `module` needs, or None."""
    parts = module.split(".")
    if parts[0] in EXTRA_MODULES:
        return parts[0]
    return next((needing[".".join(parts[:i])] for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in needing),
                None)


def _required(mark: ast.expr) -> str | None:
    """The extra's module a decorator or pytestmark entry skips without: requires_hf, requires("x")."""
    if isinstance(mark, ast.Call) and ast.unparse(mark.func).split(".")[-1] == "requires" and mark.args:
        arg = mark.args[0]
        return arg.value if isinstance(arg, ast.Constant) else None
    return REQUIRES_NAMES.get(ast.unparse(mark).split(".")[-1])


def _marks(value: ast.expr) -> list[ast.expr]:
    return list(value.elts) if isinstance(value, (ast.List, ast.Tuple)) else [value]


def unguarded_imports(source: str, filename: str, needing: dict[str, str]) -> tuple[set[str], list[str]]:
    """(the extras' modules the file refers to, one line per import of an extra that fails instead of
    skipping without it). `needing`: package_modules_needing_extras()."""
    tree = ast.parse(source)
    guarded = {_required(m) for node in tree.body if isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
               for m in _marks(node.value)} - {None}
    touched, problems = set(guarded), []

    def visit(node: ast.AST, guards: set[str], where: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                marks = {_required(d) for d in child.decorator_list} - {None}
                touched.update(marks)
                # a copy: need() inside the function guards the rest of that function only
                visit(child, guards | marks, where if isinstance(child, ast.ClassDef) else child.name)
                continue
            if isinstance(child, ast.Call) and child.args and isinstance(child.args[0], ast.Constant):
                called = ast.unparse(child.func).split(".")[-1]
                extra = extra_of(str(child.args[0].value), needing) if called in ("importorskip", "need") else None
                if extra:
                    touched.add(extra)
                    guards.add(extra)
                    if called == "importorskip":
                        problems.append(f"{filename}:{child.lineno}: pytest.importorskip({child.args[0].value!r}) "
                                        "skips without the install line: use extraskit.need()")
            for module in sorted(_imports(child)):
                extra = extra_of(module, needing)
                if not extra:
                    continue
                touched.add(extra)
                if where is None:
                    problems.append(f"{filename}:{child.lineno}: imports {module} at module level: collection "
                                    f"fails without {extra}; import it in a test marked @requires({extra!r})")
                elif extra not in guards:
                    problems.append(f"{filename}:{child.lineno}: {where} imports {module} without "
                                    f"@requires({extra!r}) or extraskit.need({extra!r}) first")
                break
            visit(child, guards, where)

    visit(tree, set(guarded), None)
    return touched, problems


def test_files() -> list[Path]:
    return sorted(TESTS.glob("*.py"))


def files_touching_extras() -> list[Path]:
    needing = package_modules_needing_extras()
    return [p for p in test_files() if unguarded_imports(p.read_text(), p.name, needing)[0]]


if __name__ == "__main__":  # CI: the test files to run in an environment without the extras
    print(*files_touching_extras())
