"""Sentence splitting with character spans.

Every span is a `(start, end)` pair into the original passage; the text is never
rewritten. Together the spans cover every non-space character of the passage (a
sentence is never lost), in order and without overlap.

How a passage is cut, outermost first:
1. blocks at blank lines and at list lines (``-``, ``*``, ``•``, ``1.``, ``2)``,
   markdown headings), so a bullet never runs into the next one;
2. inside a block, cut points from three sources, taken together (the block is then cut at
   every point, so nothing is lost):
   - English-aware punkt boundaries (nupunkt, offline, MIT): it knows abbreviations
     ("Dr.", "U.S.", "e.g."), decimals ("3.50") and quotes;
   - Chinese/Japanese sentence punctuation (a run of ``。！？``), which needs no space after
     it and which punkt does not see; closing brackets and quotes after it (``」』”）``)
     stay with the sentence they close, an ASCII ``"`` only when it closes one (an odd
     number of ``"`` before it in the block): one that opens a quotation starts the next
     sentence, as ``「『“`` always do. Latin ``.!?`` and a space before Chinese or
     Japanese text also cut, but not after a word with an inner period (``e.g.``,
     ``U.S.``) or an English title (``Dr.``);
   - a sentence-final acronym: an all-capitals word of 2-4 letters and a period (``IA.``,
     ``UE.``, ``EUA.``), then a capitalized sentence (``IA. A funcionalidade``, ``EUA. Os
     dados``). nupunkt takes several of them for abbreviations (its list matches ``ia``,
     ``pt`` or ``ad`` whatever their case) and refuses the cut; English abbreviations
     written in capitals (``DR.``, ``ST.``, ``NO.``) and words with inner periods
     (``U.S.``) are left to nupunkt;
3. enumerators: ``1.``, ``2)``, ``(3)`` (one to three digits) are never a sentence of their
   own, whatever script follows them: one at a line start stays with its line (``1. 给定问题``
   as ``1. Context pruning``), one in the middle of a line starts the sentence that follows it
   (``steps: 1. Retrieve. 2. Prune.`` is ``steps:`` | ``1. Retrieve.`` | ``2. Prune.``).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence

import nupunkt

from engine.errors import InputError

Span = tuple[int, int]

_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")
_LIST_LINE = re.compile(r"^[ \t]*(?:[-*+•·‣◦▪▸►–—]|\(?\d{1,3}[.)]|#{1,6})[ \t]+\S", re.MULTILINE)
#: a run of CJK sentence enders; what may follow it is read by _closers
_CJK_END = re.compile(r"[。！？｡]+")
#: what closes a sentence after a CJK ender: brackets and quotes that close (an ASCII `"`
#: only when it closes a quotation: _closers counts them)
_CLOSERS = frozenset("」』”’）〕】》〉｣\"')")
#: Latin sentence punctuation, spaces, then Chinese or Japanese text (the cut is before that text)
_LATIN_BEFORE_CJK = re.compile(r"[.!?]\s+(?=[「『（【〔“\u3040-\u30ff\u4e00-\u9fff])")
#: the word before a period (read backwards from it)
_WORD_BEFORE = re.compile(r"\S*$")
#: an acronym and its period, then spaces and a word (_acronym_cuts reads the word)
_ACRONYM = re.compile(r"(?<![\w.])(\w{2,4})\.\s+(?=(\w+)(?:\s+(\w+))?)")
#: English abbreviations that are no sentence end, as they are written in capitals or in
#: front of Chinese or Japanese text ("DR. SMITH", "Dr. 田中"): no acronym cut after them
_TITLES = frozenset(
    "mr mrs ms dr prof st mt no nos vol fig co corp inc ltd jr sr vs gen col lt sgt rev "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
#: an enumerator alone (a piece that is only one joins what follows it)
_ENUMERATOR = re.compile(r"\(?\d{1,3}[.)]")
#: an enumerator after a colon at a piece's end ("steps: 1."): the cut moves before it
_COLON_ENUMERATOR = re.compile(r"(?:[:]\s+|：\s*)(\(?\d{1,3}[.)])\s*$")


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


def _cjk_cuts(block: str) -> set[int]:
    """Cuts after each run of CJK enders and the closers that follow it; an ASCII `"` there
    closes (and stays) only when an odd number of `"` come before it in the block."""
    quotes = [i for i, c in enumerate(block) if c == '"'] if '"' in block else []
    cuts = set()
    for m in _CJK_END.finditer(block):
        end = m.end()
        while end < len(block) and block[end] in _CLOSERS:
            if block[end] == '"' and bisect.bisect_left(quotes, end) % 2 == 0:
                break  # an even number before it: this one opens the next quotation
            end += 1
        cuts.add(end)
    for m in _LATIN_BEFORE_CJK.finditer(block):
        word = _WORD_BEFORE.search(block, max(0, m.start() - 20), m.start()).group().lower()
        if "." not in word and word.strip("([{\"'“「") not in _TITLES:
            cuts.add(m.end())
    return cuts


def _acronym_cuts(block: str) -> set[int]:
    """Cuts after an all-capitals acronym of 2-4 letters and its period when a capitalized
    sentence follows: a word with a lower-case letter, or a one-letter word (``A``, ``O``)
    and then a lower-case one (all-capitals text is left to nupunkt)."""
    cuts = set()
    for m in _ACRONYM.finditer(block):
        word, nxt, after = m.group(1), m.group(2), m.group(3)
        if not (word.isalpha() and word.isupper()) or word.lower() in _TITLES or not nxt[0].isupper():
            continue
        if any(c.islower() for c in nxt) or (len(nxt) == 1 and after and after[0].islower()):
            cuts.add(m.end())
    return cuts


def _enumerators_kept(block: str, cuts: list[int]) -> list[int]:
    """The cuts with none that leaves an enumerator alone: a piece that is only one joins
    what follows it, and one after a colon at a piece's end moves to the next piece."""
    out: list[int] = []
    prev = 0
    for cut in cuts:
        piece = block[prev:cut]
        if _ENUMERATOR.fullmatch(piece.strip()):
            continue  # the enumerator starts the next piece: no cut here
        m = _COLON_ENUMERATOR.search(piece)
        if m:
            out.append(prev + m.start(1))
            prev = cut
            continue
        out.append(cut)
        prev = cut
    return out


def _cuts(block: str) -> list[int]:
    """Where a block is cut (positions inside it, ascending): punkt's boundaries, the CJK
    cuts and the acronym cuts, less those that leave an enumerator alone."""
    cuts = {e for _, e in nupunkt.sent_spans(block)} | _cjk_cuts(block) | _acronym_cuts(block)
    return _enumerators_kept(block, sorted(c for c in cuts if 0 < c < len(block)))


def split_sentences(text: str) -> list[Span]:
    """Split `text` into sentences; returns stripped `(start, end)` character spans."""
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {type(text).__name__}")
    spans: list[Span] = []
    for b_start, b_end in _blocks(text):
        block = text[b_start:b_end]
        cuts = _cuts(block)
        for a, b in zip([0, *cuts], [*cuts, len(block)]):
            piece = _strip(text, b_start + a, b_start + b)
            if piece:
                spans.append(piece)
    # Each block is cut at points inside it, so the spans cover every non-space character in
    # order (tests/unit/test_properties.py checks it on arbitrary Unicode).
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
