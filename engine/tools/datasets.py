"""The evaluation data files: sentence-labelled prune files and RAG files (JSONL), read
and checked, with a clear error when one is the other (on engine.measure.datafiles' JSONL reader, whose
progress bar is offered here too). `prune eval`, `prune fidelity`, `prune bench` and the
benchmarks read their data here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from engine.measure.datafiles import progress  # noqa: F401 (re-exported: the tools' progress bar)
from engine.measure.datafiles import read_jsonl


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
    gold: list[int]              # the passages that hold the answer
    source: str = ""


PRUNE_FIELDS = ("question", "context", "sentences", "labels")
RAG_FIELDS = ("question", "passages", "gold")
_KINDS = {PRUNE_FIELDS: ("a sentence-labelled prune file", "prune eval --data, prune fidelity --data"),
          RAG_FIELDS: ("a RAG file", "prune eval --rag-data, prune bench --data")}


def check_fields(row: Any, fields: tuple[str, ...], path: str | Path, number: int) -> dict[str, Any]:
    """`row` (the `number`-th record of `path`) as a dict with `fields`; a ValueError that
    says what the file looks like otherwise (the two data formats are easy to swap)."""
    if not isinstance(row, dict):
        raise ValueError(f"{path}: record {number} is a JSON {type(row).__name__}, not an object")
    missing = [f for f in fields if f not in row]
    if missing:
        want, _ = _KINDS[fields]
        other = next((k for k in _KINDS if k != fields and all(f in row for f in k)), None)
        hint = (f"; it looks like {_KINDS[other][0]} (for {_KINDS[other][1]})" if other else "")
        raise ValueError(f"{path}: record {number} lacks {', '.join(missing)}: not {want} (each line holds "
                         f"{', '.join(fields)}){hint}")
    return row


def _records(path: str | Path, limit: int | None, fields: tuple[str, ...]) -> Iterable[tuple[int, dict[str, Any]]]:
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
            raise ValueError(f"{path}: sample {row.get('id', i)} has {len(spans)} sentences and {len(labels)} labels")
        out.append(PruneSample(str(row.get("id", i)), row["question"], row["context"], spans, labels,
                               str(row.get("source") or "")))
    return out


def load_rag_data(path: str | Path, limit: int | None = None) -> list[RagSample]:
    """The samples of a RAG-shaped JSONL file (gold an index or a list)."""
    out = []
    for i, row in _records(path, limit, RAG_FIELDS):
        passages = list(row["passages"])
        gold = row["gold"]
        gold = [int(g) for g in gold] if isinstance(gold, list) else [int(gold)]
        if not gold or any(not 0 <= g < len(passages) for g in gold):
            raise ValueError(f"{path}: record {i + 1} has gold {row['gold']!r} outside its {len(passages)} passages")
        out.append(RagSample(str(row.get("id", i)), row["question"], passages, gold, str(row.get("source") or "")))
    return out
