"""The linter and the formatter, as part of the suite: `ruff check .` with the project's
configuration (pyproject.toml) finds nothing, and `ruff format --check .` would change nothing.
Fix with `ruff check --fix .` and `ruff format .`, or by hand."""

from __future__ import annotations

import pytest

import subprocess
import sys
from pathlib import Path

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def test_the_tree_is_formatted():
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
