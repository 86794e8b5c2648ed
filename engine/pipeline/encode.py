"""Where tokens meet sentences: tokenize once, build the family's template, cut blocks, pack
them into batches.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from engine.errors import InputError, ModelLoadError
from engine.pipeline.spec import ModelSpec
from engine.pipeline.unknown_text import UnseenCounter, word_offsets
from engine.settings import DEFAULTS

MIN_CONTEXT_TOKENS = 64

# Ordinary English words that every real vocabulary of these families covers (with
# subwords at worst): a tokenizer that maps all of them to special tokens knows no words.
_PROBE_WORDS = ("the", "city", "water", "people", "history", "government", "river", "music")


def check_vocabulary(tok: Tokenizer, embedding_rows: int, family: Any, source: str) -> None:
    """Refuse a tokenizer that does not fit the model: a vocabulary far smaller than the
    word-embedding rows, or one that knows no ordinary word (every probe word becomes
    [UNK] or another special token). transformers 5 builds such a five-token tokenizer
    ([PAD] [UNK] [CLS] [SEP] [MASK]) without a word when a checkpoint ships no vocabulary;
    the model then runs on [UNK] alone and returns probabilities that mean nothing."""
    size = tok.get_vocab_size(with_added_tokens=True)
    specials = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    probe = tok.encode(" ".join(_PROBE_WORDS), add_special_tokens=False).ids
    problem = None
    if embedding_rows > 0 and size < embedding_rows // 2:
        problem = f"its vocabulary has {size} tokens for the model's {embedding_rows} word-embedding rows"
    elif not probe or all(i in specials for i in probe):
        names = sorted({tok.id_to_token(i) or str(i) for i in probe})
        problem = (
            f"it maps ordinary words ({', '.join(_PROBE_WORDS[:4])}, ...) to {', '.join(names) or 'nothing'} "
            f"(vocabulary of {size} tokens)"
        )
    if problem:
        usual = getattr(family, "usual_tokenizer", "") or "the checkpoint's own"
        raise ModelLoadError(
            f"{source}: the tokenizer does not fit the model: {problem}. The checkpoint probably "
            f"ships no tokenizer; export again with --tokenizer (a folder or hub id; for the "
            f"{getattr(family, 'name', 'model')} family usually {usual})"
        )


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The fast tokenizer from a `tokenizer.json`, with padding and truncation off."""
    path = Path(path)
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise ModelLoadError(f"{path}: cannot load tokenizer ({exc})") from exc
    tok.no_padding()
    tok.no_truncation()
    return tok


def manifest_tokenizer(folder: str | Path, manifest: Any, family: Any) -> Tokenizer:
    """An export folder's tokenizer (the file its `engine.pipeline.spec.Manifest` names), checked
    against its model (check_vocabulary)."""
    tok = load_tokenizer(Path(folder) / manifest.tokenizer.file)
    check_vocabulary(tok, manifest.embedding_rows, family, str(folder))
    return tok


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
        non-space) characters appended to it (engine.pipeline.unknown_text)."""
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
