"""Data files as the engine's measurements read them: JSONL records (an error naming the
line), and the progress bar of a long run over them. `prune eval`, `prune fidelity`,
`prune run --input` and `prune export --precision auto`'s gate data are read with these
(engine.tools.datasets checks the evaluation formats on top).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable


def read_jsonl(path: str | Path) -> Iterable[dict[str, Any]]:
    """The records of a JSONL file (blank lines skipped); an error naming the line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such data file")
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}: line {n}: not valid JSON: {json_error(exc, line)}") from exc


def json_error(exc: json.JSONDecodeError, line: str) -> str:
    """What is wrong with a JSON `line` and where, as a person reads it ("invalid control
    character at column 17"): the parser's words, and the column in the line, 1-based (the
    line's own newline is no column: a line cut short is faulted at its end, not at column 1
    of a next line)."""
    text = line.rstrip("\r\n")
    what = exc.msg[:-3] if exc.msg.endswith(" at") else exc.msg      # "Invalid control character at"
    where = f"column {min(exc.pos, len(text)) + 1}"
    return f"{what[:1].lower()}{what[1:]} at {where}" + (", the end of the line" if exc.pos >= len(text) else "")


def progress(iterable, total: int, desc: str, enabled: bool):
    """`iterable` with a progress bar on stderr when `enabled` and tqdm is installed."""
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, unit="doc", mininterval=1.0)
