"""The one small interface every accelerated core implements."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from engine.pipeline.encode import BatchingConfig, ModelBatch


class Backend(ABC):
    """Runs padded batches: `infer(batch) -> (rerank_score [B], sentence_probs [B, S])`."""

    name: str = "backend"
    #: Largest batch the core accepts in one call (None: no limit).
    max_batch_size: int | None = None
    #: Whether `infer_many` sends a call's batches together (a remote core, its transport's deadline
    #: bounding them); else a call's batches run one by one, its cancellation checked between them
    #: (engine.cancellation.infer_batches).
    sends_together: bool = False

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

    def report(self) -> dict | None:
        """The device's figures (the GPU graph's memory, captured shapes, merged runs) for /info and
        /metrics; None for a core without any."""
        return None

    def describe(self) -> str:
        """What runs the model, in words (for logs and /info)."""
        return self.name
