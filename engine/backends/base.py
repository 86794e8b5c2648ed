"""The one small interface every accelerated core implements, and a call's cancellation between
two of its batches (`run_cancellable`, `check_cancelled`, `infer_batches`)."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np

from engine.errors import Cancelled
from engine.pipeline.encode import BatchingConfig, ModelBatch


class Backend(ABC):
    """Runs padded batches: `infer(batch) -> (rerank_score [B], sentence_probs [B, S])`."""

    name: str = "backend"
    #: Largest batch the core accepts in one call (None: no limit).
    max_batch_size: int | None = None

    @abstractmethod
    def infer(self, batch: ModelBatch) -> tuple[np.ndarray, np.ndarray]:
        """float32 rerank scores [B] and sentence probabilities [B, S], S = max(sentence_ids)+1."""

    def batching(self, asked: BatchingConfig) -> BatchingConfig:
        """How this core wants its batches, from what the pruner was `asked`: at most
        `max_batch_size` rows; a core with its own shapes (the GPU's fixed-shape sessions)
        says more."""
        if self.max_batch_size and self.max_batch_size < asked.max_batch_size:
            return BatchingConfig(asked.max_batch_tokens, self.max_batch_size, asked.buckets, asked.strategy)
        return asked

    def infer_many(self, batches: list[ModelBatch]) -> list[tuple[np.ndarray, np.ndarray]]:
        """All batches of one call; remote backends send them concurrently."""
        return [self.infer(b) for b in batches]

    def health(self) -> bool:
        """Whether the core answers (in-process cores always do)."""
        return True

    def close(self) -> None:
        """Release the core's resources."""
        pass

    def describe(self) -> str:
        """What runs the model, in words (for logs and /info)."""
        return self.name


# A call's cancellation: a caller that gives up on a call (the HTTP API past `--request-timeout`,
# a gRPC call past its deadline) sets the call's stop event, and the work stops at its next
# check, between two model batches, so an abandoned call frees its worker within one batch's
# time instead of running to its end. The caller runs `run_cancellable(stop, pruner.prune, ...)`
# in its pool and sets `stop` to give up; the work calls `check_cancelled()` between batches.
# A call run without a stop event (the Python API, the CLI) is never cancelled.

#: the stop event of the call running in this thread (or task), if its caller can give up on it
_STOP: ContextVar[threading.Event | None] = ContextVar("prune_call_stop", default=None)


def run_cancellable(stop: threading.Event, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` as a call that stops at its next `check_cancelled()` once `stop` is set."""
    token = _STOP.set(stop)
    try:
        return fn(*args)
    finally:
        _STOP.reset(token)


def check_cancelled() -> None:
    """Raise Cancelled if the caller of the call running here has given up on it."""
    stop = _STOP.get()
    if stop is not None and stop.is_set():
        raise Cancelled("the call was abandoned by its caller (past its deadline); its work stopped")


def infer_batches(backend: Any, batches: Sequence[Any]) -> list[Any]:
    """`backend.infer_many(batches)`, with `check_cancelled()` before each batch where the core runs them
    one after another in this thread (an in-process core: the Backend's own `infer_many`). A
    remote core, which sends a call's batches together, gets them at once: its transport's
    deadline bounds it."""
    check_cancelled()
    if getattr(type(backend), "infer_many", None) is not Backend.infer_many:
        return backend.infer_many(batches)
    out = []
    for batch in batches:
        check_cancelled()
        out.append(backend.infer(batch))
    return out
