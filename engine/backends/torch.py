"""PyTorch: runs the checkpoint itself. The fp32 reference every backend is tested against."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.base import Backend, TokenCore
from engine.pipeline.encode import ModelBatch
from engine.errors import BackendError


class TorchBackend(Backend):
    """The fp32 PyTorch reference: a checkpoint run as its family's own code computes it."""

    name = "torch"

    def __init__(self, model, *, device: str = "cpu", dtype: str = "float32", threads: int | None = None):
        import torch

        if threads:
            torch.set_num_threads(int(threads))
        self.torch = torch
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self.model = model.to(self.device, self.dtype).eval()
        self.uses_token_type_ids = True

    def infer(self, batch: ModelBatch) -> tuple[np.ndarray, np.ndarray]:
        """(rerank_score [B], sentence_probs [B, S]) of one padded batch, in PyTorch."""
        torch = self.torch
        t = {
            k: torch.from_numpy(getattr(batch, k)).to(self.device)
            for k in ("input_ids", "attention_mask", "sentence_ids", "token_type_ids")
        }
        try:
            with torch.inference_mode():
                rerank, probs = self.model(
                    t["input_ids"], t["attention_mask"], t["sentence_ids"], t["token_type_ids"]
                )
        except Exception as exc:
            raise BackendError(f"PyTorch failed on a batch of shape {batch.shape}: {exc}") from exc
        return (
            rerank.float().cpu().numpy().astype(np.float32, copy=False),
            probs.float().cpu().numpy().astype(np.float32, copy=False),
        )

    def describe(self) -> str:
        """The device, dtype and attention, in words."""
        return f"torch {self.torch.__version__} {self.device} {str(self.dtype).replace('torch.', '')}"

    @classmethod
    def from_checkpoint(
        cls,
        path,
        *,
        family: str | None = None,
        options: dict[str, Any] | None = None,
        attn: str = "eager",
        device: str = "cpu",
        dtype: str = "float32",
        threads: int | None = None,
    ) -> tuple["TorchBackend", Any, Any]:
        """(backend, tokenizer, ModelSpec) of a checkpoint folder (or hub id)."""
        from engine.pytorch.torch_model import load_torch_model

        tm = load_torch_model(path, family=family, options=options, attn=attn)
        return cls(tm.module, threads=threads, device=device, dtype=dtype), tm.tokenizer, tm.spec


class TorchTokenProbs(TokenCore):
    """A compressor's core in PyTorch: a token classifier (LLMLingua-2), the probability of label 1
    per token."""

    name = "torch"
    #: chunks per run: one at a time, on the CPU (engine.compressor.BATCH_CHUNKS says why)
    batch_chunks = 1

    def __init__(self, model: Any, threads: int | None = None):
        import torch

        if threads:
            torch.set_num_threads(int(threads))
        self.torch = torch
        self.model = model

    @classmethod
    def load(cls, folder, vocabulary: int, threads: int | None = None, attn: str | None = None):
        """A checkpoint folder's classifier, its embeddings resized to `vocabulary` as llmlingua's."""
        from engine.pytorch.llmlingua2 import load_classifier

        return cls(load_classifier(folder, vocabulary, attn=attn), threads=threads)

    def token_probs(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """softmax(logits)[..., 1] in float32, [B, L], of one padded batch."""
        torch = self.torch
        try:
            with torch.inference_mode():
                logits = self.model(
                    input_ids=torch.from_numpy(input_ids), attention_mask=torch.from_numpy(attention_mask)
                ).logits
                return torch.softmax(logits, dim=-1)[..., 1].float().numpy()
        except Exception as exc:
            raise BackendError(f"PyTorch failed on a batch of shape {input_ids.shape}: {exc}") from exc

    def describe(self) -> str:
        """The runtime, in words."""
        return f"torch {self.torch.__version__} cpu float32"
