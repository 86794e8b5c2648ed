"""Sizes a reader can hold (docs/development.md): no function in the shipped code
(engine/, export/, triton_models/) over 100 lines, no module over 500, counted as `ruff
format` lays them out (test_lint holds the tree to it; the caps were 80 and 400 when the
lines were packed by hand). A function that grows past that is split into named steps, a
module into two with one job each."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("engine", "export", "triton_models")
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 500


def shipped_modules() -> list[Path]:
    return sorted(p for top in SHIPPED for p in (ROOT / top).rglob("*.py"))


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES, root: Path = ROOT) -> list[str]:
    """`module:line name (n lines)` for each function or method of `path` over `limit`
    lines, decorators and docstring included; the module named relative to `root`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = node.end_lineno - start + 1
            if lines > limit:
                found.append(f"{path.relative_to(root)}:{start} {node.name} ({lines} lines)")
    return found


def test_the_shipped_code_is_walked():
    modules = shipped_modules()
    assert len(modules) > 30
    assert ROOT / "engine" / "pruner.py" in modules


def test_no_function_is_over_the_cap():
    found = [f for p in shipped_modules() for f in long_functions(p)]
    assert not found, "split these into named steps:\n" + "\n".join(found)


def test_no_module_is_over_the_cap():
    found = [
        f"{p.relative_to(ROOT)} ({n} lines)"
        for p in shipped_modules()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert not found, "split these by job:\n" + "\n".join(found)


def test_a_long_function_is_found(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "probe.py"
    source = f"class A:\n    @staticmethod\n    def long():\n{body.replace('    ', '        ')}\n"
    path.write_text(source, encoding="utf-8")
    assert long_functions(path, root=tmp_path) == [f"probe.py:2 long ({MAX_FUNCTION_LINES + 2} lines)"]
    assert long_functions(path, limit=MAX_FUNCTION_LINES + 2, root=tmp_path) == []
