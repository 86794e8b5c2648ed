"""Sentence splitting with character spans.

Every span is a `(start, end)` pair into the original passage; the text is never
rewritten. Together the spans cover every non-space character of the passage (a
sentence is never lost), in order and without overlap.

How a passage is cut, outermost first:
1. blocks at blank lines and at list lines (``-``, ``*``, ``•``, ``1.``, ``2)``,
   markdown headings), so a bullet never runs into the next one;
2. inside a block, English-aware punkt boundaries (nupunkt, offline, MIT): it knows
   abbreviations ("Dr.", "U.S.", "e.g."), decimals ("3.50") and quotes;
3. inside a punkt sentence, Chinese/Japanese sentence punctuation (``。！？``), which
   needs no space after it and which punkt does not see.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import nupunkt

from engine.errors import InputError

Span = tuple[int, int]

_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")
_LIST_LINE = re.compile(r"^[ \t]*(?:[-*+•·‣◦▪▸►–—]|\(?\d{1,3}[.)]|#{1,6})[ \t]+\S", re.MULTILINE)
_CJK_END = re.compile(r"[。！？｡][」』”’）〕】\"')]*|(?<=[.!?])\s+(?=[「『（【〔\u3040-\u30ff\u4e00-\u9fff])")
_SPACE = re.compile(r"\s")


def _blocks(text: str) -> list[Span]:
    """Cut points at blank lines and list-line starts; returns non-empty raw blocks."""
    cuts = {0, len(text)}
    for m in _BLANK_LINE.finditer(text):
        cuts.add(m.end())
    for m in _LIST_LINE.finditer(text):
        cuts.add(m.start())
        # A list item ends with its line unless the next line is indented (a wrapped item).
        nl = text.find("\n", m.start())
        if nl >= 0 and nl + 1 < len(text) and text[nl + 1] not in " \t":
            cuts.add(nl + 1)
    points = sorted(cuts)
    return [(a, b) for a, b in zip(points, points[1:]) if text[a:b].strip()]


def _strip(text: str, start: int, end: int) -> Span | None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if end > start else None


def split_sentences(text: str) -> list[Span]:
    """Split `text` into sentences; returns stripped `(start, end)` character spans."""
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {type(text).__name__}")
    spans: list[Span] = []
    for b_start, b_end in _blocks(text):
        block = text[b_start:b_end]
        for s, e in nupunkt.sent_spans(block):
            cut = s
            for m in _CJK_END.finditer(block, s, e):
                piece = _strip(text, b_start + cut, b_start + m.end())
                if piece:
                    spans.append(piece)
                cut = m.end()
            piece = _strip(text, b_start + cut, b_start + e)
            if piece:
                spans.append(piece)
    # Blocks, punkt and the CJK cuts each partition what they are given, so the spans
    # cover every non-space character in order (tests/unit/test_properties.py checks it on
    # arbitrary Unicode; no input was found that a repair pass would have to fix).
    return spans


def spans_from_sentences(text: str, sentences: Sequence[str | Span]) -> list[Span]:
    """Spans for sentences the caller split: strings are located in order in `text`;
    `(start, end)` pairs are checked. Raises InputError if one cannot be placed."""
    spans: list[Span] = []
    pos = 0
    for i, sent in enumerate(sentences):
        if isinstance(sent, str):
            if not sent.strip():
                raise InputError(f"sentence {i} is empty")
            idx = text.find(sent, pos)
            if idx < 0:
                raise InputError(
                    f"sentence {i} ({sent[:40]!r}) is not found in its passage (after the previous sentence)"
                )
            start, end = idx, idx + len(sent)
        elif isinstance(sent, (tuple, list)) and len(sent) == 2 and all(isinstance(x, int) for x in sent):
            start, end = int(sent[0]), int(sent[1])
            if not (pos <= start < end <= len(text)):
                raise InputError(
                    f"sentence span {i} {tuple(sent)} is out of order or outside "
                    f"the passage (length {len(text)})"
                )
        else:
            raise InputError(f"sentence {i} must be a str or a (start, end) pair, got {type(sent).__name__}")
        stripped = _strip(text, start, end)
        if stripped is None:
            raise InputError(f"sentence {i} is only whitespace")
        spans.append(stripped)
        pos = end
    return spans


def running_offsets(positions: Sequence[int], size: Callable[[int, int], int]) -> list[int]:
    """The running total of `size(previous, position)` over ascending `positions`: code point
    offsets made into another unit's (UTF-8 bytes for the text model, UTF-16 for OpenSearch)."""
    out, pos, acc = [], 0, 0
    for p in positions:
        acc += size(pos, p)
        pos = p
        out.append(acc)
    return out
