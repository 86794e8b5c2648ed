"""Batch files: `prune run --input queries.jsonl --output results.jsonl`.

One JSON object per input line: `question`, `passages` (a list of strings; or `context`,
one string), and optionally `id`, `threshold`, `title`, `alpha`, `top_k`, `reorder`,
`windows`.
One output line per input line, in the same order: `{"id", "results": [...]}` (each
result as `PruneResult.to_dict()`, without the passage text the input already holds),
or `{"id", "line", "error"}` for a line that could not be processed: the other lines
are processed all the same.

Streaming with bounded memory: lines are read, run and written in groups of `group`
queries. In-process, a group's blocks are packed into batches together
(`Pruner.prune_many`), so the core runs full batches on every core; a served text
model gets the group's queries concurrently.
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from engine.errors import InputError, PruneError

OPTIONS = ("threshold", "title", "alpha", "top_k", "reorder", "windows")


def parse_line(text: str, number: int) -> tuple[Any, dict[str, Any]]:
    """(id, prune keyword arguments) of one input line; InputError if it is not usable."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise InputError(f"expected a JSON object, got a JSON {type(row).__name__}")
    ident = row.get("id", number)
    if "passages" in row:
        passages = row["passages"]
        if not isinstance(passages, list):
            raise InputError("passages must be a list of strings")
    elif "context" in row:
        passages = [row["context"]]
    else:
        raise InputError("the line has neither passages nor context")
    if "question" not in row:
        raise InputError("the line has no question")
    query = {"question": row["question"], "passages": passages}
    query.update({k: row[k] for k in OPTIONS if k in row})
    return ident, query


def _result(r) -> dict[str, Any]:
    d = r.to_dict()
    d.pop("context", None)
    return d


def _lines(stream: IO[str]) -> Iterator[tuple[int, str]]:
    for number, text in enumerate(stream, 1):
        if text.strip():
            yield number, text


def run_file(pruner: Any, source: IO[str], sink: IO[str], *, group: int = 64, progress: bool = True,
             concurrency: int = 8) -> dict[str, Any]:
    """Process every line of `source` into `sink`; returns counts and throughput."""
    t0 = time.perf_counter()
    counts = {"lines": 0, "errors": 0, "passages": 0}
    last_report = t0
    pool = None if hasattr(pruner, "prune_many") else ThreadPoolExecutor(concurrency)

    def run(items: list[tuple[int, Any, dict[str, Any] | Exception]]) -> None:
        good = [(i, q) for i, (_, _, q) in enumerate(items) if not isinstance(q, Exception)]
        queries = [q for _, q in good]
        if pool is None:
            outs = pruner.prune_many(queries)
        else:
            def one(q):
                try:
                    q = dict(q)
                    return pruner.prune(q.pop("question"), q.pop("passages"), **q)
                except PruneError as exc:
                    return exc
            outs = list(pool.map(one, queries))
        answers: dict[int, Any] = {i: o for (i, _), o in zip(good, outs)}
        for i, (number, ident, q) in enumerate(items):
            got = answers.get(i, q)
            counts["lines"] += 1
            if isinstance(got, Exception):
                counts["errors"] += 1
                record = {"id": ident, "line": number, "error": str(got)}
            else:
                counts["passages"] += len(got)
                record = {"id": ident, "results": [_result(r) for r in got]}
            sink.write(json.dumps(record, ensure_ascii=False) + "\n")

    items: list[tuple[int, Any, dict[str, Any] | Exception]] = []
    try:
        for number, text in _lines(source):
            try:
                ident, query = parse_line(text, number)
                items.append((number, ident, query))
            except InputError as exc:
                items.append((number, number, exc))
            if len(items) >= group:
                run(items)
                items = []
                now = time.perf_counter()
                if progress and now - last_report > 1.0:
                    last_report = now
                    print(f"\r{counts['lines']} lines, {counts['errors']} errors, "
                          f"{counts['lines'] / (now - t0):.0f} lines/s", end="", file=sys.stderr, flush=True)
        if items:
            run(items)
    finally:
        if pool is not None:
            pool.shutdown()
    elapsed = time.perf_counter() - t0
    if progress:
        print(f"\r{counts['lines']} lines, {counts['errors']} errors, {counts['passages']} passages in "
              f"{elapsed:.1f} s ({counts['lines'] / max(elapsed, 1e-9):.0f} lines/s)", file=sys.stderr, flush=True)
    return {**counts, "seconds": elapsed}
