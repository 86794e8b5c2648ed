"""Pack blocks into model batches: sort by length, fill a token budget, pad to buckets.

The budget counts padding, as text-embeddings-inference does: a batch whose rows are
padded to length P may hold at most `max_batch_tokens // P` rows (and `max_batch_size`).
Rows of one batch share one bucket, so no row is padded past its own bucket.
Padding to a small set of lengths lets ONNX Runtime reuse its buffers and lets a Triton
server batch requests from many clients (onnxruntime/tensorrt need equal shapes).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.pipeline.encode import Block
from engine.settings import DEFAULTS

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
