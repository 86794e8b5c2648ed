"""LLMLingua-2's fp16 export on the GPU graph (engine/backends/gpu_graph.py): the compressor's
token probabilities with one copy of the weights, captured shapes and the process's one GPU
thread, as the pruners' graph runs."""

from __future__ import annotations

import bisect
import weakref
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.backends.base import TokenCore
from engine.backends.gpu_graph import GpuGraphBackend
from engine.backends.gpu_shared import GpuThread
from engine.errors import BackendError
from engine.pipeline.encode import BatchingConfig

#: the lengths an LLMLingua-2 chunk (at most 512 tokens) is padded to on the GPU graph
LINGUA_LENGTHS = (64, 128, 256, 384, 512)
#: chunks per batch of the compressor's GPU graph (as engine.compressor.BATCH_CHUNKS on a GPU)
LINGUA_ROWS = 16


class GpuTokenProbs(TokenCore):
    """A compressor's core on the GPU graph: an LLMLingua-2 fp16 export (GpuGraphBackend: one copy of the weights on the
    device, captured shapes, one GPU thread): each batch of chunks padded to the next of
    LINGUA_LENGTHS (positions the attention mask leaves out, whose ids do not reach the others)
    and run in the captured shape that holds its rows; `token_probs` as OrtTokenProbs's. `device`
    "cpu" runs the same sessions on the CPU provider, without CUDA graphs (the tests)."""

    name = "onnxruntime"
    #: chunks per run: the rows its shapes are sized for
    batch_chunks = LINGUA_ROWS

    def __init__(self, graph: str | Path, *, device: str = "cuda", **kwargs: Any):
        self.lengths = LINGUA_LENGTHS
        budget = BatchingConfig(max_batch_tokens=LINGUA_ROWS * self.lengths[-1], max_batch_size=LINGUA_ROWS)
        self.backend = GpuGraphBackend(
            graph, list(self.lengths), device=device, batching=budget, outputs=("token_probs",), **kwargs
        )

    def token_probs(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The graph's token_probs (float32, [B, L]) of one batch padded to its longest chunk."""
        n, length = input_ids.shape
        i = bisect.bisect_left(self.lengths, length)
        if i == len(self.lengths):
            raise BackendError(f"a chunk of {length} tokens is longer than {self.lengths[-1]}")
        pad = ((0, 0), (0, self.lengths[i] - length))
        feeds = {"input_ids": np.pad(input_ids, pad), "attention_mask": np.pad(attention_mask, pad)}
        (probs,) = self.backend.run(feeds)
        return probs[:, :length]

    def close(self) -> None:
        """The backend's close: its sessions, the weights on the device, its thread."""
        self.backend.close()

    def report(self) -> dict | None:
        """The backend's device figures (GpuGraphBackend.report)."""
        return self.backend.report()

    def describe(self) -> str:
        """The backend's description, in words."""
        return self.backend.describe()


class OnGpuThread(TokenCore):
    """A compressor's core (OrtTokenProbs on the CUDA provider, say) made and run on the process's
    GPU thread (GpuThread.shared()), as every CUDA model of the process is: a GPU graph's capture
    beside it would fail on its copies from another thread (a pruner's core runs there as
    engine.backends.merging.MergingBackend(thread=GpuThread.shared()))."""

    def __init__(self, make: Callable[[], TokenCore]):
        self.gpu = GpuThread.shared()
        try:
            self.core = self.gpu.call(make)
        except BaseException:
            self.gpu.release()
            raise
        self._let_go = weakref.finalize(self, self.gpu.release)
        self.name = self.core.name
        self.batch_chunks = self.core.batch_chunks

    def token_probs(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The core's token_probs, on the GPU thread."""
        return self.gpu.call(self.core.token_probs, input_ids, attention_mask)

    def close(self) -> None:
        """Close the core on the GPU thread, then let go of the thread."""
        if self._let_go.alive:
            if self.gpu.thread.is_alive():
                self.gpu.call(self.core.close)
            self._let_go()

    def report(self) -> dict | None:
        """The core's device figures."""
        return self.core.report()

    def describe(self) -> str:
        """The core's description, and where it runs."""
        return f"{self.core.describe()}; on the process's GPU thread"
