"""Concurrent calls merged on a core that runs in this process (`merge_calls`: on for the GPU
graph, which merges on its own GPU thread; here for any other in-process core, where asked).

A call's batches are padded to a length bucket; the batches of concurrent calls that wait at the
same length are joined into one run (TEI's queue, router/src/infer.rs; infinity's batch handler),
up to the core's rows and the token budget, and each call is handed back its own rows and its own
sentence columns (max(sentence_ids) + 1 of its rows, what the core would have returned for its
batch alone). One thread runs the core: it takes the first batch waiting and every later batch of
its length that still fits, so nothing waits on purpose for company; batches arrive together when
the core is busy, which is when joining them pays.

What merging changes: a row's numbers are computed beside other calls' rows. An fp32 graph's rows
do not see each other; ONNX Runtime's dynamic INT8 takes its activation scales per batch, so an
INT8 call's probabilities then depend on its company (as Triton's `join_requests` says), and
merging is not used there unless asked.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from engine.backends.base import Backend
from engine.backends.gpu_shared import GpuThread
from engine.pipeline.encode import BatchingConfig, ModelBatch

_ARRAYS = ("input_ids", "attention_mask", "sentence_ids", "token_type_ids")


class MergingBackend(Backend):
    """`core` behind a queue that merges concurrent callers' batches of one length (module doc).
    `thread`: the queue's thread; by default one of its own, on a GPU the process's GPU thread
    (GpuThread.shared(): every CUDA model's work on one thread, as the GPU graph's captures need),
    which this backend lets go of when closed. `merge` False: the batches run one by one there."""

    def __init__(
        self,
        core: Backend,
        batching: BatchingConfig | None = None,
        thread: GpuThread | None = None,
        merge: bool = True,
    ):
        self.core = core
        self.name = core.name
        self.max_batch_size = core.max_batch_size
        self.input_names = getattr(core, "input_names", None)
        self.budget = core.batching(batching or BatchingConfig())
        self.merge = merge
        self.thread = thread or GpuThread(name="prune-merge")  # a queue of its own, not the GPU's
        let_go = self.thread.release if thread is not None else self.thread.stop
        self._let_go = weakref.finalize(self, let_go)
        self.merged = {"runs": 0, "batches": 0}

    def __getattr__(self, name: str) -> Any:
        """The core's attributes (its session, provider, TensorRT fallback), as the core's own."""
        if name == "core":
            raise AttributeError(name)
        return getattr(self.core, name)

    def batching(self, asked: BatchingConfig) -> BatchingConfig:
        """The core's batching (the budget merged runs stay within)."""
        self.budget = self.core.batching(asked)
        return self.budget

    def infer(self, batch: ModelBatch) -> tuple[np.ndarray, np.ndarray]:
        """(rerank_score [B], sentence_probs [B, S]) of `batch`, run with the batches of other
        callers waiting at its length."""
        if not self.merge:
            return self.thread.call(self.core.infer, batch)
        rows, length = batch.shape
        cfg = self.budget
        limit = max(rows, min(cfg.max_batch_size, cfg.row_budget(length) // length))
        return self.thread.merge((id(self), length), rows, limit, self._run, batch)

    def _run(self, batches: list[ModelBatch]) -> list[tuple[np.ndarray, np.ndarray]]:
        if len(batches) == 1:
            return [self.core.infer(batches[0])]
        merged = ModelBatch(
            *(np.concatenate([getattr(b, name) for b in batches]) for name in _ARRAYS),
            [i for b in batches for i in b.blocks],
        )
        self.merged["runs"] += 1
        self.merged["batches"] += len(batches)
        rerank, probs = self.core.infer(merged)
        out, at = [], 0
        for b in batches:
            n = b.shape[0]
            columns = int(b.sentence_ids.max()) + 1 if b.sentence_ids.size else 0
            out.append((rerank[at : at + n].copy(), probs[at : at + n, : max(columns, 0)].copy()))
            at += n
        return out

    def report(self) -> dict[str, Any] | None:
        """The core's figures, and the merged runs."""
        return {
            **(self.core.report() or {}),
            "merged_runs": self.merged["runs"],
            "merged_batches": self.merged["batches"],
        }

    def health(self) -> bool:
        """The core's."""
        return self.core.health()

    def close(self) -> None:
        """Close the core on the queue's thread, then let go of the thread."""
        if self._let_go.alive:
            if self.thread.thread.is_alive():
                self.thread.call(self.core.close)
            self._let_go()

    def describe(self) -> str:
        """The core's description, and that concurrent calls are merged."""
        where = "; on the process's GPU thread" if self.thread.thread.name == "prune-gpu" else ""
        return f"{self.core.describe()}" + ("; concurrent calls merged" if self.merge else "") + where
