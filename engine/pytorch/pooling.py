"""What the families' PyTorch modules share: sentence pooling in float32 and backbone configs.

Every family module (engine/pytorch/<family>.py) has the engine's contract as its forward:

    forward(input_ids, attention_mask, sentence_ids, token_type_ids=None)
        -> rerank_score float32 [B], sentence_probs float32 [B, S]

with S = max(sentence_ids) + 1 and sentence_ids = -1 outside the context. Softmax and
the per-sentence mean always run in float32, whatever dtype the encoder runs in.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


CONFIG_ONLY_KEYS = {
    "model_type",
    "architectures",
    "auto_map",
    "transformers_version",
    "_name_or_path",
    "torch_dtype",
    "dtype",
}


_ALL_COLUMNS = [False]


@contextlib.contextmanager
def all_sentence_columns() -> Iterator[None]:
    """While it is entered, the pooling returns one column per token position (S = L;
    columns past the block's sentences are 0): the GPU graph's outputs then have a shape
    that depends on the input's shape only (export/gpu.py). Consumers read the first
    max(sentence_ids) + 1 columns, as of any graph."""
    _ALL_COLUMNS[0] = True
    try:
        yield
    finally:
        _ALL_COLUMNS[0] = False


def sentence_onehot(sentence_ids: torch.Tensor) -> torch.Tensor:
    """[B, L] sentence ids (-1 outside the context) -> float32 one-hot [B, L, S].

    S is bounded by L in the graph itself (every sentence has at least one token), so a
    hostile id cannot make any target (CPU, CUDA, TensorRT) allocate more than B x L x L;
    ids >= L then match no column."""
    length = torch.ones_like(sentence_ids[0]).sum()  # L as a tensor: dynamic in the graph
    if _ALL_COLUMNS[0]:
        n_sent = length
    else:
        n_sent = torch.minimum((sentence_ids.max() + 1).clamp(min=0), length)
    idx = torch.arange(n_sent, device=sentence_ids.device, dtype=sentence_ids.dtype)
    return (sentence_ids.unsqueeze(-1) == idx.view(1, 1, -1)).to(torch.float32)


def pool_token_probs(token_logits: torch.Tensor, sentence_ids: torch.Tensor) -> torch.Tensor:
    """Mean keep probability of each sentence's tokens (softmax column 1), in float32."""
    keep = torch.softmax(token_logits.to(torch.float32), dim=-1)[..., 1]  # [B, L]
    onehot = sentence_onehot(sentence_ids)  # [B, L, S]
    sums = torch.bmm(keep.unsqueeze(1), onehot).squeeze(1)  # [B, S]
    counts = onehot.sum(dim=1)
    return sums / counts.clamp(min=1.0)


def pool_hidden(hidden: torch.Tensor, sentence_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean hidden state of each sentence's tokens, in float32: ([B, S, H], counts [B, S])."""
    onehot = sentence_onehot(sentence_ids)
    sums = torch.bmm(onehot.transpose(1, 2), hidden.to(torch.float32))  # [B, S, H]
    counts = onehot.sum(dim=1)
    return sums / counts.clamp(min=1.0).unsqueeze(-1), counts


def backbone_config(kind: str, raw: dict[str, Any], attn: str):
    """The transformers config of a family's backbone from a checkpoint's raw config."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(kind, **{k: v for k, v in raw.items() if k not in CONFIG_ONLY_KEYS})
    cfg._attn_implementation = attn
    return cfg
