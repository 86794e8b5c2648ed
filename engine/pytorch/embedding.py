"""The embedding family: any sentence-embedding encoder as a similarity highlighter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.errors import ModelLoadError
from engine.pytorch.pooling import backbone_config, pool_hidden, sentence_onehot


EMBEDDING_MODES = ("isolated", "passage", "full")

#: Similarity -> probability: p = sigmoid(scale * (cosine - shift)). Monotonic, so any
#: cosine threshold t maps to the probability threshold sigmoid(scale * (t - shift)).
EMBEDDING_DEFAULTS = {"mode": "isolated", "scale": 8.0, "shift": 0.5, "rerank": "max"}

_ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert")


class EmbeddingHighlighterModel(nn.Module):
    """A sentence-embedding encoder (sentence-transformers layout: the backbone's own
    tensor names) scoring each sentence by its cosine with the question, in one pass.

    The block is `[CLS] q [SEP] [CLS] s0 [SEP] [CLS] s1 [SEP] ...`; `mode` sets what each
    token may attend to, through an additive attention mask built from `sentence_ids`:
      - "isolated": only its own segment, with positions restarting at 0 per segment:
        exactly the embedding each sentence (and the question) would get alone;
      - "passage": sentences see the whole passage (not the question), question alone;
      - "full": everything sees everything (one ordinary forward pass).
    Embeddings are mean-pooled (or CLS) per segment; sentence_probs =
    sigmoid(scale * (cos(q, s) - shift)); rerank_score = max over sentences of
    cos(q, s) ("max") or cos(q, mean of the context tokens) ("mean").
    """

    def __init__(
        self,
        config: Any,
        *,
        mode: str = "isolated",
        pooling: str = "mean",
        scale: float = 8.0,
        shift: float = 0.5,
        rerank: str = "max",
    ):
        super().__init__()
        from transformers import AutoModel

        if mode not in EMBEDDING_MODES:
            raise ModelLoadError(f"embedding mode must be one of {EMBEDDING_MODES}, got {mode!r}")
        if pooling not in ("mean", "cls"):
            raise ModelLoadError(f"embedding pooling {pooling!r} is not supported (mean, cls)")
        if rerank not in ("max", "mean"):
            raise ModelLoadError(f"embedding rerank must be max or mean, got {rerank!r}")
        self.config = config
        self.encoder = AutoModel.from_config(config)
        self.mode, self.pooling, self.scale, self.shift, self.rerank = (
            mode,
            pooling,
            float(scale),
            float(shift),
            rerank,
        )
        self.position_offset = (int(config.pad_token_id) + 1) if config.model_type in _ROBERTA_LIKE else 0

    def forward(self, input_ids, attention_mask, sentence_ids, token_type_ids=None):
        """(rerank_score [B], sentence_probs [B, S]) as the family computes them."""
        bsz, length = input_ids.shape
        valid = attention_mask > 0
        ctx = sentence_ids >= 0
        question = valid & ~ctx
        key = torch.where(valid, sentence_ids, torch.full_like(sentence_ids, -2))
        same = key.unsqueeze(2) == key.unsqueeze(1)
        if self.mode == "isolated":
            allowed = same
        elif self.mode == "passage":
            allowed = same | (ctx.unsqueeze(2) & ctx.unsqueeze(1))
        else:
            allowed = same | (valid.unsqueeze(2) & valid.unsqueeze(1))
        neg = torch.finfo(torch.float32).min
        mask = torch.zeros(allowed.shape, dtype=torch.float32, device=input_ids.device)
        mask = mask.masked_fill(~allowed, neg).unsqueeze(1)  # [B, 1, L, L]

        onehot = sentence_onehot(sentence_ids)  # [B, L, S]
        steps = torch.arange(length, device=input_ids.device).unsqueeze(0).expand(bsz, length)
        starts = torch.argmax(onehot, dim=1)  # first token of each sentence
        if self.mode == "isolated":
            tok_start = torch.bmm(onehot, starts.to(torch.float32).unsqueeze(-1)).squeeze(-1)
            positions = steps - tok_start.to(steps.dtype)
        elif self.mode == "passage":
            first_ctx = torch.argmax(ctx.to(torch.int32), dim=1, keepdim=True)
            positions = torch.where(ctx, steps - first_ctx, steps)
        else:
            positions = steps
        positions = positions + self.position_offset
        hidden = self.encoder(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            token_type_ids=torch.zeros_like(input_ids),
        )[0].to(torch.float32)

        if self.pooling == "mean":
            sent, counts = pool_hidden(hidden, sentence_ids)
            qw = question.to(torch.float32)
            q = (hidden * qw.unsqueeze(-1)).sum(1) / qw.sum(1, keepdim=True).clamp(min=1.0)
        else:
            counts = onehot.sum(dim=1)
            sent = torch.gather(hidden, 1, starts.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
            q = hidden[:, 0]
        q = torch.nn.functional.normalize(q, dim=-1)
        sent = torch.nn.functional.normalize(sent, dim=-1)
        present = (counts > 0).to(torch.float32)
        cos = torch.bmm(sent, q.unsqueeze(-1)).squeeze(-1)  # [B, S]
        probs = torch.sigmoid(self.scale * (cos - self.shift)) * present
        if self.rerank == "max":
            rerank = (cos * present + (present - 1.0) * 2.0).max(dim=1).values
        else:
            cw = ctx.to(torch.float32)
            passage = (hidden * cw.unsqueeze(-1)).sum(1) / cw.sum(1, keepdim=True).clamp(min=1.0)
            rerank = (torch.nn.functional.normalize(passage, dim=-1) * q).sum(-1)
        return rerank, probs


def _pooling(folder: Path | None) -> str:
    """sentence-transformers' pooling mode from 1_Pooling/config.json (mean if absent)."""
    if folder is None:
        return "mean"
    for cfg in sorted(folder.glob("*Pooling*/config.json")):
        conf = json.loads(cfg.read_text())
        if conf.get("pooling_mode_cls_token"):
            return "cls"
        if conf.get("pooling_mode_mean_tokens", True):
            return "mean"
        raise ModelLoadError(f"{cfg}: only mean or CLS pooling is supported")
    return "mean"


def build(
    raw: dict[str, Any], state_names: set[str], attn: str, options: dict[str, Any], folder: Path | None
) -> nn.Module:
    """The family's module from a checkpoint's config and weight names."""
    kind = raw.get("model_type")
    if not kind:
        raise ModelLoadError("config.json has no model_type for the embedding encoder")
    opts = {**EMBEDDING_DEFAULTS, **{k: v for k, v in options.items() if v is not None}}
    return EmbeddingHighlighterModel(
        backbone_config(kind, raw, attn),
        mode=opts["mode"],
        pooling=opts.get("pooling") or _pooling(folder),
        scale=opts["scale"],
        shift=opts["shift"],
        rerank=opts["rerank"],
    )


def remap(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """sentence-transformers stores the bare backbone (sometimes under a model prefix)."""
    prefixes = {k.split(".", 1)[0] for k in state}
    strip = next((p + "." for p in ("bert", "roberta", "model") if prefixes == {p}), "")
    return {"encoder." + k.removeprefix(strip): v for k, v in state.items()}


def optional_keys(expected: set[str]) -> set[str]:
    """An embedding checkpoint may omit the unused BERT pooler."""
    return {k for k in expected if k.startswith("encoder.pooler.")}


def positions(raw: dict[str, Any]) -> int:
    """The checkpoint's window (max position embeddings usable)."""
    n = int(raw.get("max_position_embeddings", 512))
    return n - 2 if raw.get("model_type") in _ROBERTA_LIKE else n
