"""The interfaces every core implements: `Core`, what a core of either model kind offers (its
name, health, device figures, description, close), and each kind's call: `Backend`, a pruner's
(`infer(batch) -> (rerank_score, sentence_probs)`), and `TokenCore`, a compressor's
(`token_probs(input_ids, attention_mask) -> token_probs`). One module per backend under
engine/backends/ implements them (docs/development.md, "Adding a backend")."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from engine.pipeline.encode import BatchingConfig, ModelBatch


class Core(ABC):
    """What every core offers, whichever model kind it runs: the model's graph and what runs it."""

    name: str = "core"

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


class Backend(Core):
    """A pruner's core: runs padded batches, `infer(batch) -> (rerank_score [B], sentence_probs [B, S])`."""

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


class TokenCore(Core):
    """A compressor's core (LLMLingua-2): a token classifier's probability of label 1 per token,
    `token_probs(input_ids [B, L], attention_mask [B, L]) -> float32 [B, L]`."""

    name: str = "token core"
    #: chunks per run: 1 where each chunk runs best alone, at its own length (a CPU:
    #: engine.compressor.BATCH_CHUNKS says why); the rows its shapes are sized for (the GPU graph);
    #: None: the Compressor's BATCH_CHUNKS
    batch_chunks: int | None = None

    @abstractmethod
    def token_probs(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The probabilities (float32, [B, L]) of one padded batch of chunks."""
