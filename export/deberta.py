"""DeBERTa-v2/v3's position-term indices built once per graph instead of once per layer.

transformers' `DisentangledSelfAttention.disentangled_attention_bias` picks each (query,
key) pair's relative-position score with `torch.gather`, on an int64 index it clamps and
expands to [batch x heads, L, L] in every layer and for both terms (content->position and
position->content). The index depends only on the relative positions, which the encoder
computes once and hands to every layer, so the exported graph repeated the same Expand
2 x layers times: 10% of a 2-layer Provence-width INT8 run on the CPU (docs/performance.md),
more at the real model's 24 layers.

`shared_position_indices` swaps in, while `torch.onnx.export` traces, a method that
computes the same products and gathers with the indices built at the first layer and
reused by the others (2 Expands per graph). The outputs are the same bit for bit; the
export's parity check against the unchanged PyTorch module follows. An unknown transformers
(another signature) keeps its own method, with a note.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from typing import Any, Callable

import torch

_MODULE = "transformers.models.deberta_v2.modeling_deberta_v2"
_PARAMETERS = ["self", "query_layer", "key_layer", "relative_pos", "rel_embeddings", "scale_factor"]
#: id(relative_pos) -> (relative_pos, (span, rows), c2p index, p2c index), for one export
_INDICES: dict[int, tuple[Any, ...]] = {}


def _indices(self, query_layer, key_layer, relative_pos) -> tuple[torch.Tensor, torch.Tensor]:
    """The expanded gather indices of both terms, built once per relative_pos tensor."""
    deb = sys.modules[_MODULE]
    span, rows = self.pos_ebd_size, query_layer.size(0)
    entry = _INDICES.get(id(relative_pos)) if relative_pos is not None else None
    if entry is not None and entry[0] is relative_pos and entry[1] == (span, rows):
        return entry[2], entry[3]
    rel = relative_pos
    if rel is None:
        rel = deb.build_relative_position(
            query_layer,
            key_layer,
            bucket_size=self.position_buckets,
            max_position=self.max_relative_positions,
        )
    if rel.dim() == 2:
        rel = rel.unsqueeze(0).unsqueeze(0)
    elif rel.dim() == 3:
        rel = rel.unsqueeze(1)
    elif rel.dim() != 4:
        raise ValueError(f"Relative position ids must be of dim 2 or 3 or 4. {rel.dim()}")
    rel = rel.to(device=query_layer.device, dtype=torch.long)
    c2p = (
        torch.clamp(rel + span, 0, span * 2 - 1).squeeze(0).expand([rows, query_layer.size(1), rel.size(-1)])
    )
    p2c = (
        torch.clamp(-rel + span, 0, span * 2 - 1)
        .squeeze(0)
        .expand([rows, key_layer.size(-2), key_layer.size(-2)])
    )
    if relative_pos is not None:
        _INDICES[id(relative_pos)] = (relative_pos, (span, rows), c2p, p2c)
    return c2p, p2c


def shared_bias(self, query_layer, key_layer, relative_pos, rel_embeddings, scale_factor):
    """DisentangledSelfAttention.disentangled_attention_bias with `_indices`."""
    deb = sys.modules[_MODULE]
    if key_layer.size(-2) != query_layer.size(-2):  # not self-attention: transformers' own
        return _ORIGINAL[0](self, query_layer, key_layer, relative_pos, rel_embeddings, scale_factor)
    c2p_index, p2c_index = _indices(self, query_layer, key_layer, relative_pos)
    span, heads = self.pos_ebd_size, self.num_attention_heads
    rel_embeddings = rel_embeddings[0 : span * 2, :].unsqueeze(0)
    repeat = query_layer.size(0) // heads

    def positions(proj):
        return self.transpose_for_scores(proj(rel_embeddings), heads).repeat(repeat, 1, 1)

    score = 0
    if "c2p" in self.pos_att_type:
        pos_key = positions(self.key_proj if self.share_att_key else self.pos_key_proj)
        scale = deb.scaled_size_sqrt(pos_key, scale_factor)
        c2p = torch.gather(torch.bmm(query_layer, pos_key.transpose(-1, -2)), dim=-1, index=c2p_index)
        score = score + c2p / scale.to(dtype=c2p.dtype)
    if "p2c" in self.pos_att_type:
        pos_query = positions(self.query_proj if self.share_att_key else self.pos_query_proj)
        scale = deb.scaled_size_sqrt(pos_query, scale_factor)
        p2c = torch.gather(
            torch.bmm(key_layer, pos_query.transpose(-1, -2)), dim=-1, index=p2c_index
        ).transpose(-1, -2)
        score = score + p2c / scale.to(dtype=p2c.dtype)
    return score


_ORIGINAL: list[Any] = []


@contextlib.contextmanager
def shared_position_indices(model: torch.nn.Module, log: Callable[[str], None] = lambda m: None):
    """While exporting `model`, its DeBERTa-v2/v3 attention layers share the position-term
    indices (`shared_bias`); nothing changes for other backbones."""
    deb = sys.modules.get(_MODULE)
    cls: Any = getattr(deb, "DisentangledSelfAttention", None)
    uses = cls is not None and any(isinstance(m, cls) and m.relative_attention for m in model.modules())
    if not uses:
        yield
        return
    original = cls.disentangled_attention_bias
    known = list(inspect.signature(original).parameters) == _PARAMETERS and all(
        hasattr(deb, f) for f in ("build_relative_position", "scaled_size_sqrt")
    )
    if not known:
        log(
            "note: this transformers' DeBERTa attention is not the one export.deberta knows: each layer "
            "builds its own position indices in the graph"
        )
        yield
        return
    cls.disentangled_attention_bias = shared_bias
    _ORIGINAL[:] = [original]
    log("exporting DeBERTa's position indices once for all layers")
    try:
        yield
    finally:
        cls.disentangled_attention_bias = original
        _ORIGINAL.clear()
        _INDICES.clear()
