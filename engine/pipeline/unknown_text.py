"""How much of a passage the model does not see as written: its `unknown_share`.

A passage's share of non-space characters that reach the model as something else: inside
the tokenizer's unknown token (`[UNK]`, `<unk>`, whatever the tokenizer names it), covered
by no token (dropped by the tokenizer), or changed by the tokenizer's own normalizer beyond
case and compatibility forms (an accent or a voicing mark stripped: `ã` -> `a`, `パ` -> `ハ`;
full-width `Ａ` -> `a` is the same letter and counts as seen). Measured on the tokens the
pruner makes anyway (one tokenization per sentence; the offsets come with them), over the
passage's sentences.

An English vocabulary (the default model's, all-MiniLM-L6-v2's uncased WordPiece) sees
Chinese and Japanese text largely as `[UNK]` and stripped marks, and its scores there mean
little; a result whose share is over `UNKNOWN_SHARE_WARNING` says so on every surface (a
warning on the CLI, a log line in the HTTP API), naming the multilingual models (`MULTILINGUAL`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any


#: a passage with more of its characters unseen than this is flagged. Measured with the default
#: model's tokenizer (docs/quality.md): on tests/data/ptjazh-prune.jsonl, Chinese passages 0.49-0.74
#: (median 0.58), Japanese 0.24-0.42 (0.31), Portuguese 0.02-0.05 (0.04); English, squad-dev's 300
#: and coqa-dev's 347 documents, at most 0.04 (median 0). Chosen between Portuguese's highest and
#: Japanese's lowest, a factor of three above the one and 1.6 below the other
UNKNOWN_SHARE_WARNING = 0.15

#: what to run instead on such text: the multilingual models the engine exports (docs/families.md)
MULTILINGUAL = (
    "XProvence (prune export --model naver/xprovence-reranker-bgem3-v1 --out xprovence) or Zilliz's "
    "bilingual model (prune export --model zilliz/semantic-highlight-bilingual-v1 --out zilliz-bilingual), "
    "then --model FOLDER"
)

_WORD = re.compile(r"\S+")
#: the ASCII control characters that are not spaces (a tokenizer drops them)
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f]")


def unknown_id(tok: Any) -> int | None:
    """The id of the tokenizer's unknown token, whatever its name (None: it has none, as a
    byte-level BPE): the model's `unk_token` (WordPiece, BPE), else (a Unigram model keeps only
    an id) the token a private-use character becomes when that token's name says unknown."""
    name = getattr(tok.model, "unk_token", None)
    if name:
        return tok.token_to_id(name)
    for i in tok.encode("\U000f0000", add_special_tokens=False).ids:  # with a Metaspace "▁" before it
        if "unk" in (tok.id_to_token(i) or "").lower():
            return i
    return None


class UnseenCounter:
    """Counts a text's unseen characters (module docstring) for one tokenizer."""

    def __init__(self, tok: Any):
        self.unk = unknown_id(tok)
        self.normalizer = tok.normalizer
        self._changed: dict[str, bool] = {}  # character -> changed by the normalizer
        # whether every printable ASCII character is seen as written (a real vocabulary's are): then
        # ASCII text without an unknown token is all seen, and its offsets need not be read
        probe = " ".join(chr(c) for c in range(33, 127))
        e = tok.encode(probe, add_special_tokens=False)
        self.ascii_seen = self._unseen(probe, e.ids, e.offsets) == 0

    def changed(self, c: str) -> bool:
        """Whether the normalizer changes the character beyond case and compatibility forms."""
        known = self._changed.get(c)
        if known is None:
            out = self.normalizer.normalize_str(c).strip() if self.normalizer is not None else c
            known = unicodedata.normalize("NFKC", out).lower() != unicodedata.normalize("NFKC", c).lower()
            self._changed[c] = known
        return known

    def count(
        self, text: str, ids: Sequence[int], offsets: Callable[[], Sequence[tuple[int, int]]]
    ) -> tuple[int, int]:
        """(unseen, non-space) characters of `text` tokenized as `ids`; `offsets` gives the
        tokens' character offsets, asked for only where the text is not plain ASCII or holds an
        unknown token (reading them costs more than the rest: English text skips it)."""
        total = _chars(text)
        if self.ascii_seen and self.unk not in ids and text.isascii() and not _CONTROL.search(text):
            return 0, total
        return self._unseen(text, ids, offsets()), total

    def _unseen(self, text: str, ids: Sequence[int], offsets: Sequence[tuple[int, int]]) -> int:
        """The unseen characters of `text`: those in no token but an unknown one, and those the
        normalizer changes (module docstring)."""
        pieces, end = [], 0  # the text the tokens cover (unknown tokens left out), in order
        for a, b in sorted(o for i, o in zip(ids, offsets) if i != self.unk and o[1] > o[0]):
            if b > end:
                pieces.append(text[max(a, end) : b])
                end = b
        seen = "".join(pieces)
        changed = [c for c in set(seen) if not c.isascii() and self.changed(c)]
        return _chars(text) - _chars(seen) + sum(seen.count(c) for c in changed)


def _chars(text: str) -> int:
    """The non-space characters of `text` (what str.split() does not split at)."""
    return len("".join(text.split()))


def word_offsets(text: str, word_ids: Sequence[int | None], offsets: Sequence[tuple[int, int]]):
    """Offsets into `text` of the tokens of `text.split()` tokenized word by word (the
    `is_split_into_words` input): each token's offsets are its word's own."""
    starts = [m.start() for m in _WORD.finditer(text)]
    return [(0, 0) if w is None else (starts[w] + a, starts[w] + b) for w, (a, b) in zip(word_ids, offsets)]


def shares(counts: Sequence[tuple[int, int]], sentences_per_passage: Sequence[int]) -> list[float]:
    """Each passage's unknown share from its sentences' (unseen, non-space) counts, in order."""
    out, pos = [], 0
    for n in sentences_per_passage:
        part = counts[pos : pos + n]
        pos += n
        total = sum(t for _, t in part)
        out.append(round(sum(u for u, _ in part) / total, 4) if total else 0.0)
    return out


def warning(results: Sequence[Any]) -> str | None:
    """The one line a call's results (PruneResults) warrant, naming the passages whose
    `unknown_share` is over UNKNOWN_SHARE_WARNING (None: none is)."""
    over = [
        (r.index, r.unknown_share)
        for r in results
        if r.unknown_share is not None and r.unknown_share > UNKNOWN_SHARE_WARNING
    ]
    if not over:
        return None
    worst = max(s for _, s in over)
    which = ", ".join(str(i) for i, _ in sorted(over)[:10]) + (", ..." if len(over) > 10 else "")
    return (
        f"{len(over)} of {len(results)} passage(s) (index {which}) are largely unknown to this model's "
        f"vocabulary (up to {worst:.0%} of their characters unseen: [UNK], dropped, or marks stripped); "
        f"its scores mean little there. For such text use a multilingual model: {MULTILINGUAL}"
    )
