"""The test layout holds: every test module lives in the folder of its one layer and
declares that layer (`pytestmark`), and no test module imports another or the conftest
(shared helpers live in tests/utils.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]
LAYERS = ("unit", "inprocess", "server", "packaging")


def _modules():
    return sorted(TESTS.glob("*/test_*.py"))


def test_every_test_module_is_in_a_layer_folder():
    assert not list(TESTS.glob("test_*.py")), "test modules belong in tests/<layer>/"
    assert {p.parent.name for p in _modules()} <= set(LAYERS)
    assert len(_modules()) >= 40


@pytest.mark.parametrize("path", _modules(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_module_declares_exactly_its_folders_layer(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    marks = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
    ]
    assert len(marks) == 1, f"{len(marks)} pytestmark assignments"
    values = marks[0].elts if isinstance(marks[0], ast.List) else [marks[0]]
    layers = [ast.unparse(v) for v in values if ast.unparse(v).removeprefix("pytest.mark.") in LAYERS]
    assert layers == [f"pytest.mark.{path.parent.name}"], layers
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not {m for m in imported if m.startswith("tests.") and m != "tests.utils"}, imported
