"""Where tokens meet sentences: tokenize once, build the family's template, cut blocks, pack
them into batches; and, from the same tokens, how much of each passage the model does not see
(its `unknown_share`, the last section).

Each sentence is tokenized once (one batched call of the fast tokenizer for every
sentence of every passage), then sentences are concatenated into the family's template

    [CLS] question [SEP] (x seps_between) sentence_0 sentence_1 ... [SEP]

with `sentence_ids` giving each context token the block-local index of its sentence
(-1 for question, special and padding tokens). A passage that does not fit the window is
cut at sentence ends into blocks, each with the question in front. A single sentence
longer than a block is cut into pieces; their scores are merged token-weighted.
Nothing is truncated.

Blocks become model batches (`plan`): sorted by length, a token budget filled, padded to
buckets. The budget counts padding, as text-embeddings-inference does: a batch whose rows are
padded to length P may hold at most `max_batch_tokens // P` rows (and `max_batch_size`).
Rows of one batch share one bucket, so no row is padded past its own bucket.
Padding to a small set of lengths lets ONNX Runtime reuse its buffers and lets a Triton
server batch requests from many clients (onnxruntime/tensorrt need equal shapes).
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from engine.errors import InputError, ModelLoadError
from engine.pipeline.spec import ModelSpec
from engine.settings import DEFAULTS

MIN_CONTEXT_TOKENS = 64


@dataclass
class Unit:
    """One sentence, or one piece of a sentence longer than a block."""

    sentence: int  # index of the sentence in its passage
    token_ids: list[int]


@dataclass
class Block:
    """A model window's worth of one passage: token ids, sentence ids, its sentences."""

    passage: int  # index of the passage in the call
    first: bool  # first block of its passage: source of the reranking score
    input_ids: np.ndarray  # int64 [n], the whole template, unpadded
    sentence_ids: np.ndarray  # int64 [n]
    token_type_ids: np.ndarray  # int64 [n]
    units: list[tuple[int, int]]  # per block-local sentence slot: (sentence index, token count)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


class Encoder:
    """Turns a question and sentence-split passages into model blocks for one ModelSpec."""

    def __init__(self, tokenizer: Tokenizer, spec: ModelSpec, min_context_tokens: int = MIN_CONTEXT_TOKENS):
        self.tokenizer = tokenizer
        self.spec = spec
        # Embedding models wrap each sentence in its own [CLS] ... [SEP] (2 tokens per
        # sentence) and need no closing [SEP]; the others close the block with one.
        self.per_unit = 2 if spec.family.sentence_specials else 0
        self.n_special = 1 + spec.family.seps_between + (0 if self.per_unit else 1)
        self.min_context_tokens = min_context_tokens
        self._unseen: UnseenCounter | None = None
        if spec.max_length - self.n_special < min_context_tokens + 1:
            raise ModelLoadError(f"max_length {spec.max_length} is too small for this template")

    @property
    def max_question_tokens(self) -> int:
        """The longest question that leaves `min_context_tokens` of passage per block."""
        return self.spec.max_length - self.n_special - self.min_context_tokens

    def tokenize(self, texts: list[str], counts: list[tuple[int, int]] | None = None) -> list[list[int]]:
        """Token ids of each text, without special tokens; with `counts`, each text's (unseen,
        non-space) characters appended to it (`UnseenCounter`)."""
        if not texts:
            return []
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        ids = [e.ids for e in encodings]
        if counts is not None:
            unseen = self.unseen
            counts += [unseen.count(t, i, lambda e=e: e.offsets) for t, i, e in zip(texts, ids, encodings)]
        return ids

    @property
    def unseen(self) -> UnseenCounter:
        """What counts a text's characters the model does not see as written (made once)."""
        if self._unseen is None:
            self._unseen = UnseenCounter(self.tokenizer)
        return self._unseen

    def question_ids(self, question: str) -> list[int]:
        """The question's token ids; InputError when it has none."""
        ids = self.tokenize([question])[0]
        if not ids:
            raise InputError("the question has no tokens")
        if len(ids) > self.max_question_tokens:
            raise InputError(
                f"the question is {len(ids)} tokens; this model's window of {self.spec.max_length} "
                f"tokens allows at most {self.max_question_tokens} so that each block keeps "
                f"{self.min_context_tokens} tokens for the passage. Shorten the question."
            )
        return ids

    def blocks(
        self, question: list[int], passage: int, sentences: list[list[int]], fragment: int | None = None
    ) -> list[Block]:
        """Blocks for one passage whose sentences are already tokenized. A sentence longer
        than a block (or than `fragment` tokens, when given) is cut into pieces."""
        capacity = self.spec.max_length - self.n_special - len(question)
        piece = capacity - self.per_unit
        if fragment:
            piece = min(piece, fragment)
        units: list[Unit] = []
        for i, ids in enumerate(sentences):
            if not ids:
                continue  # a sentence with no tokens gets probability 0 (see decide)
            for start in range(0, len(ids), piece):
                units.append(Unit(i, ids[start : start + piece]))
        groups: list[list[Unit]] = []
        used = capacity + 1
        for unit in units:
            cost = len(unit.token_ids) + self.per_unit
            if used + cost > capacity:
                groups.append([])
                used = 0
            groups[-1].append(unit)
            used += cost
        return [self._block(question, passage, g, k == 0) for k, g in enumerate(groups)]

    def tokenize_words(
        self, texts: list[str], counts: list[tuple[int, int]] | None = None
    ) -> list[list[int]]:
        """The ids of each text split at whitespace, every word tokenized alone: the
        `is_split_into_words` input of the OpenSearch pipeline; `counts` as `tokenize`'s."""
        words = [t.split() for t in texts]
        idx = [i for i, w in enumerate(words) if w]
        out: list[list[int]] = [[] for _ in texts]
        found: list[tuple[int, int]] = [(0, 0)] * len(texts)
        for i, e in zip(
            idx,
            self.tokenizer.encode_batch(
                [words[i] for i in idx], is_pretokenized=True, add_special_tokens=False
            ),
        ):
            out[i] = list(e.ids)
            if counts is not None:
                at = lambda t=texts[i], e=e: word_offsets(t, e.word_ids, e.offsets)  # noqa: E731
                found[i] = self.unseen.count(texts[i], out[i], at)
        if counts is not None:
            counts += found
        return out

    def windows(self, question: list[int], passage: int, sentences: list[list[int]]) -> list[Block]:
        """Token windows over the passage as the OpenSearch pipeline cuts them (the fast
        tokenizer's overflow with `only_second` truncation): the context tokens of every
        sentence in a row, windows of `window_tokens - specials - question` tokens starting
        every `that - window_stride` tokens, the last one ending at the passage's end. A
        sentence cut by a window edge is scored on the tokens the window holds. (A model
        exported with a window under `window_tokens` gets windows of its own size and a
        stride of the same share: 24 tokens for a 96-token window.)"""
        fam = self.spec.family
        total = min(fam.window_tokens, self.spec.max_length)
        # a model exported with a smaller window keeps the overlap's share of the window
        stride = fam.window_stride * total // fam.window_tokens
        size = total - self.n_special - len(question)
        if size <= stride:
            raise InputError(
                f"the question is {len(question)} tokens: too long for {total}-token windows "
                f"overlapping by {stride} (windows='sentences' has no overlap)"
            )
        firsts = [0]  # each sentence's first token in the passage
        for sent in sentences:
            firsts.append(firsts[-1] + len(sent))
        blocks: list[Block] = []
        start = 0
        while True:
            stop = min(start + size, firsts[-1])
            units = []
            for i in range(bisect.bisect_right(firsts, start) - 1, len(sentences)):
                if firsts[i] >= stop:
                    break
                if sentences[i]:  # the part of sentence i inside [start, stop)
                    units.append(Unit(i, sentences[i][max(start - firsts[i], 0) : stop - firsts[i]]))
            if units:
                blocks.append(self._block(question, passage, units, start == 0))
            if stop >= firsts[-1]:
                return blocks
            start += size - stride

    def _block(self, question: list[int], passage: int, units: list[Unit], first: bool) -> Block:
        spec = self.spec
        head = [spec.cls_id, *question, *([spec.sep_id] * spec.family.seps_between)]
        ctx_len = sum(len(u.token_ids) + self.per_unit for u in units)
        n = len(head) + ctx_len + (0 if self.per_unit else 1)
        input_ids = np.empty(n, dtype=np.int64)
        sentence_ids = np.full(n, -1, dtype=np.int64)
        token_type_ids = np.zeros(n, dtype=np.int64)
        input_ids[: len(head)] = head
        pos = len(head)
        for slot, unit in enumerate(units):
            ids = [spec.cls_id, *unit.token_ids, spec.sep_id] if self.per_unit else unit.token_ids
            k = len(ids)
            input_ids[pos : pos + k] = ids
            sentence_ids[pos : pos + k] = slot  # an embedding model pools its [CLS]/[SEP] too
            pos += k
        if not self.per_unit:
            input_ids[pos] = spec.sep_id
            token_type_ids[len(head) :] = 1
        return Block(
            passage=passage,
            first=first,
            input_ids=input_ids,
            sentence_ids=sentence_ids,
            token_type_ids=token_type_ids,
            units=[(u.sentence, len(u.token_ids)) for u in units],
        )


# Multiples of 32: on the RAG workload (SQuAD paragraphs, 20 per query) padding is 8% of
# the tokens, against 27% with 64/128/256/384/512 (measured, see benchmarks/).
DEFAULT_BUCKETS = tuple(range(32, 513, 32))
STRATEGIES = ("sorted", "fixed", "longest")


@dataclass(frozen=True)
class BatchingConfig:
    """How blocks become padded batches: buckets, the token budget, the batch size."""

    max_batch_tokens: int = DEFAULTS.max_batch_tokens
    max_batch_size: int = DEFAULTS.max_batch_size
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    # "sorted": length-sorted token budget, a batch per bucket; "fixed": input order, fixed size;
    # "longest": from the longest block down, every row padded to its batch's longest (fewer,
    # fuller runs: a call that fits the budget is one run, as a GPU wants)
    strategy: str = "sorted"

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if self.max_batch_tokens < 1:
            raise ValueError("max_batch_tokens must be >= 1")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}")
        if not self.buckets or any(b < 1 for b in self.buckets):
            raise ValueError("buckets must be positive lengths")

    def buckets_for(self, max_length: int) -> tuple[int, ...]:
        """The buckets below the window, the window itself, and, for windows longer than
        the largest bucket (--max-length above 512), every multiple of 512 in between."""
        longer = set(range(((max(self.buckets) // 512) + 1) * 512, max_length, 512))
        return tuple(sorted({b for b in self.buckets if b < max_length} | longer | {max_length}))

    def row_budget(self, padded: int) -> int:
        """Tokens a batch of rows padded to `padded` may hold: `max_batch_tokens`, and past
        512 tokens less in proportion to the length, so that attention's L x L memory per
        batch stays what it is at 512 (one row always fits)."""
        return self.max_batch_tokens if padded <= 512 else self.max_batch_tokens * 512 // padded


@dataclass
class ModelBatch:
    """What a backend runs: padded int64 arrays, plus which blocks the rows are."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    sentence_ids: np.ndarray
    token_type_ids: np.ndarray
    blocks: list[int]

    def inputs(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The batch's arrays by graph input name."""
        return {n: getattr(self, n) for n in names}

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, padded length)."""
        return self.input_ids.shape  # type: ignore[return-value]


def padded_length(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `n` tokens; ValueError past the largest."""
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"block of {n} tokens exceeds the largest bucket {buckets[-1]}")
    return buckets[i]


def plan(lengths: Sequence[int], cfg: BatchingConfig, max_length: int) -> list[tuple[int, list[int]]]:
    """Group block indices into batches; returns (padded length, indices) per batch."""
    buckets = cfg.buckets_for(max_length)
    if cfg.strategy == "fixed":
        out = []
        for s in range(0, len(lengths), cfg.max_batch_size):
            idx = list(range(s, min(s + cfg.max_batch_size, len(lengths))))
            out.append((padded_length(max(lengths[i] for i in idx), buckets), idx))
        return out
    if cfg.strategy == "longest":
        return _longest_first(lengths, cfg, buckets)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[tuple[int, list[int]]] = []
    current: list[int] = []
    pad = 0
    for i in order:
        p = padded_length(lengths[i], buckets)
        # A new bucket starts a new batch: mixing lengths would pad short rows to the long.
        if current and (
            p != pad or (len(current) + 1) * p > cfg.row_budget(p) or len(current) >= cfg.max_batch_size
        ):
            batches.append((pad, current))
            current = []
        current.append(i)
        pad = p
    if current:
        batches.append((pad, current))
    return batches


def _longest_first(
    lengths: Sequence[int], cfg: BatchingConfig, buckets: Sequence[int]
) -> list[tuple[int, list[int]]]:
    """Batches taken from the longest block down, each padded to its first (longest) row's
    bucket and filled while rows x that length fit the budget."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[tuple[int, list[int]]] = []
    while order:
        pad = padded_length(lengths[order[0]], buckets)
        rows = max(1, min(cfg.max_batch_size, cfg.row_budget(pad) // pad))
        batches.append((pad, order[:rows]))
        order = order[rows:]
    return batches


def collate(blocks: Sequence[Block], indices: Sequence[int], length: int, pad_id: int) -> ModelBatch:
    """One padded batch of the blocks at `indices`, `length` tokens wide."""
    n = len(indices)
    input_ids = np.full((n, length), pad_id, dtype=np.int64)
    attention = np.zeros((n, length), dtype=np.int64)
    sentence_ids = np.full((n, length), -1, dtype=np.int64)
    token_types = np.zeros((n, length), dtype=np.int64)
    for row, i in enumerate(indices):
        b = blocks[i]
        k = len(b)
        input_ids[row, :k] = b.input_ids
        attention[row, :k] = 1
        sentence_ids[row, :k] = b.sentence_ids
        token_types[row, :k] = b.token_type_ids
    return ModelBatch(input_ids, attention, sentence_ids, token_types, list(indices))


# How much of a passage the model does not see as written: its `unknown_share`, the share of its
# non-space characters that reach the model as something else: inside the tokenizer's unknown
# token (`[UNK]`, `<unk>`, whatever the tokenizer names it), covered by no token (dropped), or
# changed by the tokenizer's normalizer beyond case and compatibility forms (a mark stripped:
# `ã` -> `a`, `パ` -> `ハ`; full-width `Ａ` -> `a` is the same letter and counts as seen). Measured
# on the tokens the pruner makes anyway, over the passage's sentences. An English vocabulary (the
# default model's) sees Chinese and Japanese largely as `[UNK]` and stripped marks; a result whose
# share is over `UNKNOWN_SHARE_WARNING` says so on every surface (a CLI warning, an HTTP API log
# line), naming the multilingual models (`MULTILINGUAL`).

#: a passage with more of its characters unseen than this is flagged. Measured with the default
#: model's tokenizer (docs/quality.md): on tests/data/ptjazh-prune.jsonl, Chinese passages 0.49-0.74
#: (median 0.58), Japanese 0.24-0.42 (0.31), Portuguese 0.02-0.05 (0.04); English, squad-dev's 300
#: and coqa-dev's 347 documents, at most 0.04 (median 0). Chosen between Portuguese's highest and
#: Japanese's lowest, a factor of three above the one and 1.6 below the other
UNKNOWN_SHARE_WARNING = 0.15

#: what to run instead on such text: the multilingual models the engine exports (docs/families.md)
MULTILINGUAL = (
    "XProvence (prune export --model naver/xprovence-reranker-bgem3-v2 --out build/xprovence) or Zilliz's "
    "bilingual model (prune export --model zilliz/semantic-highlight-bilingual-v1 --out build/zilliz-bilingual), "
    "then --model build/xprovence or build/zilliz-bilingual"
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
    """Counts a text's unseen characters (the section's comment) for one tokenizer."""

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
        normalizer changes (the section's comment)."""
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


def unknown_shares(counts: Sequence[tuple[int, int]], sentences_per_passage: Sequence[int]) -> list[float]:
    """Each passage's unknown share from its sentences' (unseen, non-space) counts, in order."""
    out, pos = [], 0
    for n in sentences_per_passage:
        part = counts[pos : pos + n]
        pos += n
        total = sum(t for _, t in part)
        out.append(round(sum(u for u, _ in part) / total, 4) if total else 0.0)
    return out


def unknown_warning(results: Sequence[Any]) -> str | None:
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
