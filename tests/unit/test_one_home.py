"""Each runtime choice and default has one home (#56): the sets of values below are written
only where they are defined, and no other module writes a default of its own for them.
Read from the source (ast), so a second copy fails here whatever it is named."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engine.pipeline.inputs import TITLE_RULES, WINDOWS
from engine.settings import SETTINGS, TORCH_ATTENTIONS, TORCH_DTYPES

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "export", "triton_models")

#: a set of values -> the one module that may write it
HOMES = {
    frozenset(SETTINGS["ort_arena"].choices): "engine/settings.py",
    frozenset(SETTINGS["ort_denormals"].choices): "engine/settings.py",
    frozenset(TORCH_DTYPES): "engine/settings.py",
    frozenset(TORCH_ATTENTIONS): "engine/settings.py",
    frozenset(TITLE_RULES): "engine/pipeline/inputs.py",
    frozenset(WINDOWS): "engine/pipeline/inputs.py",
}
#: names whose default must come from engine.settings (DEFAULTS.<setting>), never a literal
DEFAULTED = ("arena", "denormals", "join_requests")


def _modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def _string_sets(tree):
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Tuple, ast.List, ast.Set))
            and len(node.elts) >= 2
            and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
        ):
            yield node.lineno, frozenset(e.value for e in node.elts)


def _literal_defaults(tree):
    """(line, name) of every parameter or class field named after a DEFAULTED setting whose
    default is a string literal."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args + node.args.kwonlyargs
            defaults = (
                [None] * (len(node.args.args) - len(node.args.defaults))
                + list(node.args.defaults)
                + list(node.args.kw_defaults)
            )
            pairs = [(a.arg, d) for a, d in zip(args, defaults)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            pairs = [(node.target.id, node.value)]
        else:
            continue
        for name, default in pairs:
            if (
                any(k in name for k in DEFAULTED)
                and isinstance(default, ast.Constant)
                and isinstance(default.value, str)
            ):
                yield default.lineno, name


def test_each_set_of_choices_is_written_once():
    copies = [
        f"{path}:{line}: {sorted(values)} (its home: {HOMES[values]})"
        for path, tree in _modules()
        for line, values in _string_sets(tree)
        if values in HOMES and path != HOMES[values]
    ]
    assert not copies, "\n".join(copies)


def test_no_module_writes_its_own_default_for_a_setting():
    literal = [
        f"{path}:{line}: {name}" for path, tree in _modules() for line, name in _literal_defaults(tree)
    ]
    assert not literal, "\n".join(literal)


def test_the_scan_finds_a_copy():
    # the scanner itself: a second tuple of the arena modes and a literal default are found
    tree = ast.parse('MODES = ("shrink", "keep", "off")\ndef f(arena: str = "shrink"): pass\n')
    assert [v for _, v in _string_sets(tree)] == [frozenset({"shrink", "keep", "off"})]
    assert [n for _, n in _literal_defaults(tree)] == ["arena"]
