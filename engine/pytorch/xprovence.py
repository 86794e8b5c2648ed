"""XProvence (naver/xprovence-reranker-bgem3-v2, and v1): XLM-RoBERTa with rerank and token heads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.pytorch.pooling import backbone_config, pool_token_probs


class XProvenceModel(nn.Module):
    """naver/xprovence-reranker-bgem3-v2 and v1: `roberta.*` (with pooler), `classifier.*` on the
    pooled output (rerank logit = column 0), `token_classifier.*` (Linear(h, 2))."""

    def __init__(self, config: Any):
        super().__init__()
        from transformers import XLMRobertaModel

        self.config = config
        self.roberta = XLMRobertaModel(config)
        self.classifier = nn.Linear(config.hidden_size, getattr(config, "num_labels", 1))
        self.token_classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, input_ids, attention_mask, sentence_ids, token_type_ids=None):
        """(rerank_score [B], sentence_probs [B, S]) as the family computes them."""
        out = self.roberta(input_ids=input_ids, attention_mask=attention_mask)
        rerank = self.classifier(out.pooler_output)[:, 0].to(torch.float32)
        return rerank, pool_token_probs(self.token_classifier(out.last_hidden_state), sentence_ids)


def build(
    raw: dict[str, Any], state_names: set[str], attn: str, options: dict[str, Any], folder: Path | None
) -> nn.Module:
    """The family's module from a checkpoint's config and weight names."""
    return XProvenceModel(backbone_config("xlm-roberta", raw, attn))


def positions(raw: dict[str, Any]) -> int:
    """XLM-R's positions start after padding_idx + 1."""
    return int(raw.get("max_position_embeddings", 512)) - 2
