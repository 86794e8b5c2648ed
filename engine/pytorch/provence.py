"""Provence (naver/provence-reranker-debertav3-v1): DeBERTa-v3 with rerank and token heads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.pytorch.pooling import backbone_config, pool_token_probs


class ProvenceModel(nn.Module):
    """naver/provence-reranker-debertav3-v1: `deberta.*`, `pooler.dense.*`,
    `classifier.*` (rerank logit = column 0), `token_classifier.*` (Linear(h, 2))."""

    def __init__(self, config: Any):
        super().__init__()
        from transformers.models.deberta_v2.modeling_deberta_v2 import ContextPooler, DebertaV2Model

        self.config = config
        self.deberta = DebertaV2Model(config)
        self.pooler = ContextPooler(config)
        self.classifier = nn.Linear(self.pooler.output_dim, getattr(config, "num_labels", 1))
        self.token_classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, input_ids, attention_mask, sentence_ids, token_type_ids=None):
        """(rerank_score [B], sentence_probs [B, S]) as the family computes them."""
        hidden = self.deberta(input_ids=input_ids, attention_mask=attention_mask)[0]
        rerank = self.classifier(self.pooler(hidden))[:, 0].to(torch.float32)
        return rerank, pool_token_probs(self.token_classifier(hidden), sentence_ids)


def build(
    raw: dict[str, Any], state_names: set[str], attn: str, options: dict[str, Any], folder: Path | None
) -> nn.Module:
    """The family's module from a checkpoint's config and weight names."""
    return ProvenceModel(backbone_config("deberta-v2", raw, attn))
