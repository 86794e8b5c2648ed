"""Settings (engine.settings): one table in the docs, one flag and variable each, flag over
variable over default, and a clear error for a variable that does not parse."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.settings import SETTINGS, markdown_table, setting

pytestmark = pytest.mark.unit


ROOT = Path(__file__).resolve().parents[2]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from engine.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_docs_table_is_the_settings_table():
    text = (ROOT / "docs" / "configuration.md").read_text()
    table = re.search(r"<!-- settings-table[^>]*-->\n(.*?)\n<!-- /settings-table -->", text, re.S)
    assert table and table.group(1) == markdown_table()


def test_every_flag_exists_and_reads_its_variable(monkeypatch):
    """Each setting with a flag has it on some command, with the setting's default; set
    through its variable, that command's default follows it."""
    for name in [k for k in os.environ if k.startswith("PRUNE_")]:  # as a shell without them (the suite's
        monkeypatch.delenv(name)  # workers set PRUNE_INTRA_OP_THREADS)
    subs = _subparsers()
    for s in SETTINGS.values():
        holders = [name for name, p in subs.items() if s.flag in p._option_string_actions]
        if not s.flag_too:
            assert not holders, f"{s.flag} exists on {holders}: the table says variable only"
            continue
        assert holders, f"no command takes {s.flag}"
        for name in holders:
            assert subs[name]._option_string_actions[s.flag].default == s.default, (name, s.flag)
    monkeypatch.setenv("PRUNE_MAX_BATCH_TOKENS", "1234")
    monkeypatch.setenv("PRUNE_GRPC_PORT", "9001")
    monkeypatch.setenv("PRUNE_ASK_K", "7")
    subs = _subparsers()
    assert subs["run"].parse_args(["--question", "q"]).max_batch_tokens == 1234
    assert subs["run"].parse_args(["--max-batch-tokens", "99"]).max_batch_tokens == 99  # the flag wins
    assert subs["serve"].parse_args(["--model-repository", "r"]).grpc_port == 9001
    assert subs["ask"].parse_args(["--db", "x.db", "--question", "q"]).k == 7


def test_library_defaults_follow_the_variables(monkeypatch):
    from engine.pipeline.inputs import default_limits

    monkeypatch.setenv("PRUNE_MAX_PASSAGES", "12")
    assert default_limits().max_passages == 12 and setting("max_passages") == 12
    monkeypatch.setenv("PRUNE_MAX_PASSAGES", "")
    assert setting("max_passages") == SETTINGS["max_passages"].default


@pytest.mark.parametrize(
    "variable,value,message",
    [
        ("PRUNE_MAX_BATCH_TOKENS", "lots", "PRUNE_MAX_BATCH_TOKENS='lots' is not a valid positive integer"),
        ("PRUNE_MAX_BATCH_SIZE", "0", "PRUNE_MAX_BATCH_SIZE='0' is not a valid positive integer"),
        ("PRUNE_ORT_ARENA", "bogus", "PRUNE_ORT_ARENA must be one of ('shrink', 'keep', 'off'), got 'bogus'"),
    ],
)
def test_a_bad_variable_is_a_clear_error(variable, value, message, tmp_path):
    import os

    env = {**os.environ, variable: value}
    proc = subprocess.run(
        [sys.executable, "-m", "engine", "run", "--question", "q", "--context", "c."],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_help_says_each_default_once():
    """No "(default: None)", no switch's "(default: True)", no default said twice."""
    for name, p in _subparsers().items():
        text = p.format_help()
        assert (
            "(default: None)" not in text and "(default: True)" not in text and "(default: False)" not in text
        ), name
        for action in p._actions:
            helptext = p._get_formatter()._expand_help(action) if action.help else ""
            said = len(re.findall(r"\(default[: ]|; default[: ]|\(env PRUNE_\w+; default", helptext))
            assert said <= 1, (name, action.option_strings, helptext)
