"""Batch files: `prune run --input queries.jsonl --output results.jsonl` (and `prune compress
--input`'s, LLMLingua-2's: `compress_file`).

One JSON object per input line: `question`, `passages` (a list of strings; or `context`,
one string), and optionally `id` and any option of `engine.pipeline.inputs.CallOptions` (`threshold`,
`title`, `alpha`, `top_k`, `reorder`, `windows`, `splitter`, `lexical_weight`, `passage_margin`).
One output line per input line, in the same order: `{"id", "results": [...]}` (each
result as `PruneResult.to_dict()`, without the passage text the input already holds),
or `{"id", "line", "error"}` for a line that could not be processed: the other lines
are processed all the same.

Streaming with bounded memory: lines are read, run and written in groups of `group`
queries, each group through `prune_many` (the Pruner protocol): in-process, a group's
blocks are packed into batches together, so the core runs full batches on every core; a
served text model gets the group's queries concurrently.

An error record carries the line's own `id` whenever the line is a JSON object with one
(whatever else is wrong with it), else the line number. A line's options go through
`CallOptions.of`, as the Python API's keywords do: a misspelt option (`treshold`: a field
close to an option's name) is that line's error (`unknown option 'treshold'`), never a
silent default; other fields (an evaluation file's `answers`, `labels`, `source`) are the
line's own data and are left alone.
"""

from __future__ import annotations

import difflib
import json
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from engine.datafiles import json_error
from engine.errors import InputError
from engine.pipeline.inputs import OPTION_NAMES, CallOptions
from engine.pipeline.encode import UNKNOWN_SHARE_WARNING
from engine.protocol import PrunerProtocol

#: the fields of a line that are the call's options (engine.pipeline.inputs.CallOptions)
OPTIONS = OPTION_NAMES
#: the fields of a line that are not options: every other field must be one
FIELDS = ("id", "question", "passages", "context")


class LineError(InputError):
    """A line that cannot be run; `ident` is its id (or its number when it has none)."""

    def __init__(self, message: str, ident: Any):
        super().__init__(message)
        self.ident = ident


def parse_line(text: str, number: int, options: CallOptions | None = None) -> tuple[Any, dict[str, Any]]:
    """(id, prune keyword arguments) of one input line, its options over `options`;
    LineError if it is not usable."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LineError(f"not valid JSON: {json_error(exc, text)}", number) from None
    if not isinstance(row, dict):
        raise LineError(f"expected a JSON object, got a JSON {type(row).__name__}", number)
    ident = row.get("id", number)
    try:
        return ident, _query(row, options)
    except InputError as exc:
        raise LineError(str(exc), ident) from None


def _query(row: dict[str, Any], options: CallOptions | None = None) -> dict[str, Any]:
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
    return {
        "question": row["question"],
        "passages": passages,
        "options": CallOptions.of(options, **_options(row)),
    }


def _options(row: dict[str, Any]) -> dict[str, Any]:
    """A line's options: its fields named as CallOptions' options, and those that look
    like one misspelt (so `CallOptions.of` refuses them); other fields are the line's own
    data (an evaluation file's labels, a source) and are left alone."""
    return {
        k: v
        for k, v in row.items()
        if k not in FIELDS
        and (k in OPTION_NAMES or difflib.get_close_matches(k, OPTION_NAMES, n=1, cutoff=0.8))
    }


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _result(r) -> dict[str, Any]:
    d = r.to_dict()
    d.pop("context", None)
    return d


def _lines(stream: IO[str]) -> Iterator[tuple[int, str]]:
    for number, text in enumerate(stream, 1):
        if text.strip():
            yield number, text


def run_file(
    pruner: PrunerProtocol,
    source: IO[str],
    sink: IO[str],
    *,
    group: int = 64,
    progress: bool = True,
    options: CallOptions | None = None,
) -> dict[str, Any]:
    """Process every line of `source` into `sink` (a line's options over `options`, the
    command line's); returns counts (lines, errors, passages, those over
    UNKNOWN_SHARE_WARNING: `unknown`) and throughput."""
    t0 = time.perf_counter()
    counts = {"lines": 0, "errors": 0, "passages": 0, "unknown": 0}
    last_report = t0

    def run(items: list[tuple[int, Any, dict[str, Any] | Exception]]) -> None:
        good = [(i, q) for i, (_, _, q) in enumerate(items) if not isinstance(q, Exception)]
        outs = pruner.prune_many([q for _, q in good])
        answers: dict[int, Any] = {i: o for (i, _), o in zip(good, outs)}
        for i, (number, ident, q) in enumerate(items):
            got = answers.get(i, q)
            counts["lines"] += 1
            if isinstance(got, Exception):
                counts["errors"] += 1
                record = {"id": ident, "line": number, "error": str(got)}
            else:
                counts["passages"] += len(got)
                counts["unknown"] += sum(
                    r.unknown_share is not None and r.unknown_share > UNKNOWN_SHARE_WARNING for r in got
                )
                record = {"id": ident, "results": [_result(r) for r in got]}
            sink.write(json.dumps(record, ensure_ascii=False) + "\n")

    items: list[tuple[int, Any, dict[str, Any] | Exception]] = []
    for number, text in _lines(source):
        try:
            ident, query = parse_line(text, number, options)
            items.append((number, ident, query))
        except LineError as exc:
            items.append((number, exc.ident, exc))
        if len(items) >= group:
            run(items)
            items = []
            now = time.perf_counter()
            if progress and now - last_report > 1.0:
                last_report = now
                print(
                    f"\r{_n(counts['lines'], 'line')}, {_n(counts['errors'], 'error')}, "
                    f"{counts['lines'] / (now - t0):.0f} lines/s",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
    if items:
        run(items)
    elapsed = time.perf_counter() - t0
    if progress:
        print(
            f"\r{_n(counts['lines'], 'line')}, {_n(counts['errors'], 'error')}, "
            f"{_n(counts['passages'], 'passage')} in "
            f"{elapsed:.1f} s ({counts['lines'] / max(elapsed, 1e-9):.0f} lines/s)",
            file=sys.stderr,
            flush=True,
        )
    return {**counts, "seconds": elapsed}


def compress_file(
    compressor: Any,
    source: IO[str],
    sink: IO[str],
    *,
    defaults: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """`prune compress --input`: each line a JSON object with `POST /v1/compress`'s fields (`context`
    and any of compress's options; `id`), over `defaults` (the command line's options); each
    output line `{"id", ...the result's fields}`, or `{"id", "line", "error"}` for a line that
    cannot be compressed (an unknown field among them), the other lines compressed all the same.
    Returns the counts and the time."""
    from engine.pipeline.option_schema import unknown_name
    from engine.pipeline.lingua_decide import CompressOptions

    names = list(CompressOptions.__dataclass_fields__)
    t0 = time.perf_counter()
    counts = {"lines": 0, "errors": 0}
    for number, text in _lines(source):
        counts["lines"] += 1
        ident: Any = number
        try:
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InputError(f"not valid JSON: {json_error(exc, text)}") from None
            if not isinstance(row, dict):
                raise InputError(f"expected a JSON object, got a JSON {type(row).__name__}")
            ident = row.get("id", number)
            unknown = [k for k in row if k not in ("id", "context", *names)]
            if unknown:
                raise InputError(unknown_name(unknown[0], ["id", "context", *names]))
            if "context" not in row:
                raise InputError("the line has no context")
            arguments = {**(defaults or {}), **{k: v for k, v in row.items() if k not in ("id", "context")}}
            record = {"id": ident, **compressor.compress(row["context"], **arguments).to_dict()}
        except InputError as exc:
            counts["errors"] += 1
            record = {"id": ident, "line": number, "error": str(exc)}
        sink.write(json.dumps(record, ensure_ascii=False) + "\n")
    elapsed = time.perf_counter() - t0
    if progress:
        print(
            f"{_n(counts['lines'], 'line')}, {_n(counts['errors'], 'error')} in {elapsed:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return {**counts, "seconds": elapsed}
