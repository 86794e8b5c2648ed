"""Data files, read in one place: JSONL records (an error naming the line), the progress bar
of a long run over them, and the evaluation data: sentence-labelled prune files and RAG files,
read and checked, with a clear error when one is the other. `prune run --input`, `prune eval`,
`prune fidelity`, `prune bench` (its LLMLingua-2 prompts too: load_contexts), `prune export
--precision auto`'s gate and the benchmarks read their data here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np


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
    what = exc.msg[:-3] if exc.msg.endswith(" at") else exc.msg  # "Invalid control character at"
    where = f"column {min(exc.pos, len(text)) + 1}"
    return f"{what[:1].lower()}{what[1:]} at {where}" + (
        ", the end of the line" if exc.pos >= len(text) else ""
    )


def progress(iterable, total: int, desc: str, enabled: bool):
    """`iterable` with a progress bar on stderr when `enabled` and tqdm is installed."""
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, unit="doc", mininterval=1.0)


# --------------------------------------------------------------------------- data


@dataclass
class PruneSample:
    """A passage with its sentence labels (which sentences answer)."""

    id: str
    question: str
    context: str
    spans: list[tuple[int, int]]
    labels: np.ndarray
    source: str = ""


@dataclass
class RagSample:
    """A question, its passages and which one holds the answer (gold)."""

    id: str
    question: str
    passages: list[str]
    gold: list[int]  # the passages that hold the answer
    source: str = ""


PRUNE_FIELDS = ("question", "context", "sentences", "labels")
RAG_FIELDS = ("question", "passages", "gold")
_KINDS = {
    PRUNE_FIELDS: ("a sentence-labelled prune file", "prune eval --data, prune fidelity --data"),
    RAG_FIELDS: ("a RAG file", "prune eval --rag-data, prune bench --data"),
}


def check_fields(row: Any, fields: tuple[str, ...], path: str | Path, number: int) -> dict[str, Any]:
    """`row` (the `number`-th record of `path`) as a dict with `fields`; a ValueError that
    says what the file looks like otherwise (the two data formats are easy to swap)."""
    if not isinstance(row, dict):
        raise ValueError(f"{path}: record {number} is a JSON {type(row).__name__}, not an object")
    missing = [f for f in fields if f not in row]
    if missing:
        want, _ = _KINDS[fields]
        other = next((k for k in _KINDS if k != fields and all(f in row for f in k)), None)
        hint = f"; it looks like {_KINDS[other][0]} (for {_KINDS[other][1]})" if other else ""
        raise ValueError(
            f"{path}: record {number} lacks {', '.join(missing)}: not {want} (each line holds "
            f"{', '.join(fields)}){hint}"
        )
    return row


def _records(
    path: str | Path, limit: int | None, fields: tuple[str, ...]
) -> Iterable[tuple[int, dict[str, Any]]]:
    """(index, record) of the first `limit` records of `path`, each checked for `fields`."""
    for i, row in enumerate(read_jsonl(path)):
        if limit is not None and i >= limit:
            return
        yield i, check_fields(row, fields, path, i + 1)


def load_prune_data(path: str | Path, limit: int | None = None) -> list[PruneSample]:
    """The samples of a prune-shaped JSONL file."""
    out = []
    for i, row in _records(path, limit, PRUNE_FIELDS):
        spans = [(int(s), int(e)) for s, e in row["sentences"]]
        labels = np.asarray(row["labels"], dtype=bool)
        if len(spans) != len(labels):
            raise ValueError(
                f"{path}: sample {row.get('id', i)} has {len(spans)} sentences and {len(labels)} labels"
            )
        out.append(
            PruneSample(
                str(row.get("id", i)),
                row["question"],
                row["context"],
                spans,
                labels,
                str(row.get("source") or ""),
            )
        )
    return out


def load_rag_data(path: str | Path, limit: int | None = None) -> list[RagSample]:
    """The samples of a RAG-shaped JSONL file (gold an index or a list)."""
    out = []
    for i, row in _records(path, limit, RAG_FIELDS):
        passages = list(row["passages"])
        gold = row["gold"]
        gold = [int(g) for g in gold] if isinstance(gold, list) else [int(gold)]
        if not gold or any(not 0 <= g < len(passages) for g in gold):
            raise ValueError(
                f"{path}: record {i + 1} has gold {row['gold']!r} outside its {len(passages)} passages"
            )
        out.append(
            RagSample(str(row.get("id", i)), row["question"], passages, gold, str(row.get("source") or ""))
        )
    return out


def load_contexts(path: str | Path) -> list[str]:
    """The texts of a prune or RAG file (each record's `context`, or its `passages`), each once,
    in the file's order: the tokenizer corpus and the prompts of LLMLingua-2's benchmark."""
    texts: dict[str, None] = {}
    for n, row in enumerate(read_jsonl(path), 1):
        if isinstance(row, dict) and isinstance(row.get("context"), str):
            texts[row["context"]] = None
        elif isinstance(row, dict) and isinstance(row.get("passages"), list):
            texts.update((p, None) for p in row["passages"] if isinstance(p, str))
        else:
            raise ValueError(
                f"{path}: record {n} has no context (a prune file's) nor passages (a RAG file's)"
            )
    if not texts:
        raise ValueError(f"{path}: no context in it")
    return list(texts)
