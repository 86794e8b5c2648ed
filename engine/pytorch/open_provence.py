"""OpenProvence / Zilliz semantic-highlight: a sequence-classification reranker (XLM-R or
ModernBERT) with a pruning head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.errors import ModelLoadError
from engine.pytorch.pooling import backbone_config, pool_token_probs


class _PruningHead(nn.Module):
    """OpenProvence's pruning head. With `use_weighted_pooling` checkpoints also carry
    `pooling_weights` (Linear(h, 1)); the original head creates it and its forward never
    uses it, so it is loaded (no tensor is unexpected) and, as there, not applied."""

    def __init__(self, hidden_size: int, num_labels: int = 2, weighted_pooling: bool = False):
        super().__init__()
        self.classifier = nn.Linear(hidden_size, num_labels)
        if weighted_pooling:
            self.pooling_weights = nn.Linear(hidden_size, 1)


OPEN_PROVENCE_BACKBONES = ("xlm-roberta", "roberta", "modernbert")


class OpenProvenceModel(nn.Module):
    """OpenProvence / zilliz semantic-highlight: `ranking_model.*` (a whole
    XLMRobertaForSequenceClassification or ModernBertForSequenceClassification, one label =
    rerank logit) and `pruning_head.classifier.*` (Linear(h, 2)). The encoder runs once
    for both heads.

    The pruning head reads the original code's `hidden_states[-1]`. For ModernBERT, under
    the transformers 4.x that the original code runs on, that is the last layer's output
    *before* ModernBERT's final LayerNorm (transformers 5 returns it after), so the state is
    taken at the final norm's input. Attention is eager (global and sliding-window masks),
    which exports to ONNX."""

    def __init__(self, base_config: Any, pruning_hidden: int | None = None, weighted_pooling: bool = False):
        super().__init__()
        from transformers import AutoModelForSequenceClassification

        if base_config.model_type not in OPEN_PROVENCE_BACKBONES:
            raise ModelLoadError(
                f"open_provence checkpoints on a {base_config.model_type!r} "
                f"backbone are not supported ({', '.join(OPEN_PROVENCE_BACKBONES)} are)"
            )
        self.config = base_config
        self.ranking_model = AutoModelForSequenceClassification.from_config(base_config)
        self.pruning_head = _PruningHead(
            pruning_hidden or base_config.hidden_size, weighted_pooling=weighted_pooling
        )
        self.modernbert = base_config.model_type == "modernbert"
        if self.modernbert:
            self._pre_norm: list[torch.Tensor] = []
            self.ranking_model.model.final_norm.register_forward_pre_hook(
                lambda module, args: self._pre_norm.append(args[0])
            )

    def forward(self, input_ids, attention_mask, sentence_ids, token_type_ids=None):
        """(rerank_score [B], sentence_probs [B, S]) as the family computes them."""
        if self.modernbert:
            self._pre_norm.clear()
            rerank = self.ranking_model(input_ids=input_ids, attention_mask=attention_mask).logits
            hidden = self._pre_norm.pop()
            return rerank[:, 0].to(torch.float32), pool_token_probs(
                self.pruning_head.classifier(hidden), sentence_ids
            )
        hidden = self.ranking_model.base_model(input_ids=input_ids, attention_mask=attention_mask)[0]
        rerank = self.ranking_model.classifier(hidden)[:, 0].to(torch.float32)
        return rerank, pool_token_probs(self.pruning_head.classifier(hidden), sentence_ids)


def build(
    raw: dict[str, Any], state_names: set[str], attn: str, options: dict[str, Any], folder: Path | None
) -> nn.Module:
    """The family's module from a checkpoint's config and weight names."""
    base = dict(raw.get("base_model_config") or {})
    if not base:
        raise ModelLoadError("open_provence config.json has no base_model_config")
    kind = base.get("model_type", "xlm-roberta")
    base.setdefault("num_labels", 1)
    cfg = backbone_config(kind, base, attn)
    cfg.model_type = kind
    pruning = raw.get("pruning_config") or {}
    weighted = (
        bool(pruning.get("use_weighted_pooling")) or "pruning_head.pooling_weights.weight" in state_names
    )
    return OpenProvenceModel(cfg, pruning.get("hidden_size"), weighted_pooling=weighted)


def remap(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Older OpenProvence checkpoints store the backbone without the `ranking_model.` prefix."""
    if any(k.startswith("ranking_model.") for k in state):
        return state
    return {(k if k.startswith("pruning_head.") else "ranking_model." + k): v for k, v in state.items()}


def _offset(raw: dict[str, Any]) -> int:
    """Positions XLM-R reserves before the first token (ModernBERT's rotary ones: none)."""
    return 0 if (raw.get("base_model_config") or {}).get("model_type") == "modernbert" else 2


def positions(raw: dict[str, Any]) -> int:
    """The checkpoint's window (max position embeddings usable)."""
    base = raw.get("base_model_config") or {}
    return int(base.get("max_position_embeddings", 514)) - _offset(raw)


def max_length(raw: dict[str, Any]) -> int:
    """The config's own `max_length` (512 if unset), within what the positions allow."""
    limit = positions(raw)
    return min(int(raw.get("max_length") or min(limit, 512)), limit)
