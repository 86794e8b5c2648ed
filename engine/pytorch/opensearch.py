"""OpenSearch's semantic highlighter (opensearch-semantic-highlighter-v1): a BERT sentence tagger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.pytorch.pooling import backbone_config, pool_hidden


class OpenSearchHighlighterModel(nn.Module):
    """opensearch-semantic-highlighter-v1: `bert.*` and `classifier.*` (Linear(h, 2))
    over mean-pooled sentence states. No rerank head: rerank_score is 0."""

    def __init__(self, config: Any, with_pooler: bool = False):
        super().__init__()
        from transformers import BertModel

        self.config = config
        self.bert = BertModel(config, add_pooling_layer=with_pooler)
        self.classifier = nn.Linear(config.hidden_size, getattr(config, "num_labels", 2))

    def forward(self, input_ids, attention_mask, sentence_ids, token_type_ids=None):
        """(rerank_score [B], sentence_probs [B, S]) as the family computes them."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[
            0
        ]
        pooled, counts = pool_hidden(hidden, sentence_ids)
        logits = self.classifier(pooled.to(self.classifier.weight.dtype)).to(torch.float32)
        probs = torch.softmax(logits, dim=-1)[..., 1] * (counts > 0).to(torch.float32)
        rerank = torch.zeros(input_ids.shape[0], dtype=torch.float32, device=input_ids.device)
        return rerank, probs


def build(
    raw: dict[str, Any], state_names: set[str], attn: str, options: dict[str, Any], folder: Path | None
) -> nn.Module:
    """The family's module from a checkpoint's config and weight names."""
    with_pooler = any(n.startswith("bert.pooler.") for n in state_names)
    return OpenSearchHighlighterModel(backbone_config("bert", raw, attn), with_pooler)
