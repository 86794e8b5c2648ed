"""The GPU graph: what the fp16 export traces so that, at a fixed batch and length, every
node runs on ONNX Runtime's CUDA provider, attention on its fused kernels.

While `torch.onnx.export` traces (`gpu_graph`):
- attention becomes one `com.microsoft.MultiHeadAttention` per layer (query, key and value
  as [B, L, heads x head size], everything added to the scores as its `attention_bias`
  [B, heads or 1, L, L]), which the CUDA provider runs on its fused (memory-efficient)
  kernels:
  - DeBERTa-v2/v3 (Provence): its content->position and position->content terms and the
    padding mask are the bias. Each term is one MatMul and one Gather with a flat [L x L]
    index that depends on the length only, so at a fixed length it folds into an
    initializer (no per-batch Expand of an int64 index, no GatherElements);
  - every backbone whose transformers module attends through `eager_attention_forward`
    (BERT and MiniLM, XLM-R, ModernBERT with its sliding window): the additive mask it is
    handed is the bias;
- the sentence pooling returns one column per token position ([B, L]; columns past the
  block's sentences are 0), not max(sentence_ids) + 1, so the output's shape depends on
  the input's shape only (engine.pytorch.pooling.all_sentence_columns).

At a fixed shape (ONNX Runtime's free-dimension overrides, engine/backends/gpu_graph.py),
constant folding then removes every Shape node and the shape arithmetic after it, and the
session can be captured as a CUDA graph. `check_gpu_graph` folds a graph at one shape on
the CPU and lists what would not run on the CUDA provider.
"""

from __future__ import annotations

import contextlib
import math
import sys
from typing import Any, Callable

import torch

_DEBERTA = "transformers.models.deberta_v2.modeling_deberta_v2"
#: the additive mask value for a position that may not be attended (finite in fp16)
MASKED = -10000.0


class FusedAttention(torch.autograd.Function):
    """softmax(q k^T x scale + bias) v over `heads` heads of [B, L, heads x d] tensors:
    computed eagerly while tracing, exported as com.microsoft.MultiHeadAttention."""

    @staticmethod
    def forward(ctx, query, key, value, bias, heads: int, scale: float):  # noqa: D102 (torch's signature)
        b, length, width = query.shape
        d = width // heads

        def split(t):
            return t.view(b, length, heads, d).transpose(1, 2)

        scores = torch.matmul(split(query), split(key).transpose(-1, -2)) * scale + bias
        probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        return torch.matmul(probs, split(value)).transpose(1, 2).reshape(b, length, width)

    @staticmethod
    def symbolic(g, query, key, value, bias, heads, scale):  # noqa: D102
        none = g.op("prim::Constant")
        none.setType(torch._C.OptionalType.ofTensor())
        out = g.op(
            "com.microsoft::MultiHeadAttention",
            query,
            key,
            value,
            none,
            none,
            bias,
            num_heads_i=heads,
            scale_f=scale,
        )
        out.setType(query.type())
        return out


def additive_bias(mask: torch.Tensor, length: int | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An attention mask as MultiHeadAttention's bias [B, 1, L, L]: 0 where attended,
    MASKED elsewhere (a 0/1 or bool mask, or an additive one clamped to stay finite in fp16)."""
    if mask.dtype == torch.bool:
        bias = torch.where(mask, 0.0, MASKED).to(dtype)
    elif mask.is_floating_point() and mask.dim() == 4:  # already additive (transformers' eager masks)
        bias = mask.to(dtype).clamp(min=MASKED)
    else:  # 1 attended, 0 not
        bias = (1.0 - mask.to(dtype)) * MASKED
    while bias.dim() < 4:
        bias = bias.unsqueeze(1)
    return bias.expand(bias.size(0), 1, length, length) if bias.size(2) == 1 else bias


# --------------------------------------------------------------------------- DeBERTa


def _flat_index(relative: torch.Tensor, span: int, sign: int, transpose: bool) -> torch.Tensor:
    """The flat [L x L] index into a [L x 2 span] score row block for DeBERTa's term: row
    i's column clamp(sign x rel[i, j] + span) (transposed for position->content)."""
    length = relative.size(-1)
    idx = torch.clamp(sign * relative + span, 0, span * 2 - 1)
    rows = torch.arange(length, dtype=idx.dtype, device=idx.device).unsqueeze(1) * (span * 2)
    flat = rows + idx
    return (flat.transpose(0, 1) if transpose else flat).reshape(-1)


#: id(relative_pos) -> (relative_pos, span, c2p flat index, p2c flat index), for one export: the
#: encoder hands every layer the same relative positions, so every layer gathers with the same two
#: indices, traced once (at a fixed shape each folds to one int64 [L x L] constant, not one per layer)
_FLAT: dict[int, tuple[Any, ...]] = {}


def _flat_indices(self, query, key, relative_pos) -> tuple[torch.Tensor, torch.Tensor]:
    """The c2p and p2c flat indices of `relative_pos`, built at the first layer that asks."""
    span = self.pos_ebd_size
    entry = _FLAT.get(id(relative_pos)) if relative_pos is not None else None
    if entry is not None and entry[0] is relative_pos and entry[1] == span:
        return entry[2], entry[3]
    rel = relative_pos
    if rel is None:
        rel = sys.modules[_DEBERTA].build_relative_position(
            query, key, bucket_size=self.position_buckets, max_position=self.max_relative_positions
        )
    rel = rel.to(dtype=torch.long).reshape(rel.size(-2), rel.size(-1))
    c2p, p2c = _flat_index(rel, span, 1, False), _flat_index(rel, span, -1, True)
    if relative_pos is not None:
        _FLAT[id(relative_pos)] = (relative_pos, span, c2p, p2c)
    return c2p, p2c


def _relative_terms(self, query, key, relative_pos, rel_embeddings) -> torch.Tensor:
    """DeBERTa's c2p + p2c scores [B, heads, L, L] (unscaled) from [B, L, width] q and k."""
    b, length, _ = query.shape
    heads, span = self.num_attention_heads, self.pos_ebd_size
    c2p_index, p2c_index = _flat_indices(self, query, key, relative_pos)
    table = rel_embeddings[0 : span * 2, :].unsqueeze(0)

    def split(t):  # [n, m, width] -> [n, heads, m, d]
        return t.view(t.size(0), t.size(1), heads, -1).transpose(1, 2)

    def gathered(scores, flat):  # [B, heads, L, 2 span] -> [B, heads, L, L]
        return scores.reshape(b, heads, -1).index_select(2, flat).view(b, heads, length, length)

    score = 0
    if "c2p" in self.pos_att_type:
        pos_key = split((self.key_proj if self.share_att_key else self.pos_key_proj)(table))
        score = score + gathered(torch.matmul(split(query), pos_key.transpose(-1, -2)), c2p_index)
    if "p2c" in self.pos_att_type:
        pos_query = split((self.query_proj if self.share_att_key else self.pos_query_proj)(table))
        score = score + gathered(torch.matmul(split(key), pos_query.transpose(-1, -2)), p2c_index)
    return score


def deberta_fused_forward(
    self,
    hidden_states,
    attention_mask,
    output_attentions=False,
    query_states=None,
    relative_pos=None,
    rel_embeddings=None,
):
    """DisentangledSelfAttention.forward as one MultiHeadAttention (self-attention only)."""
    if query_states is not None or output_attentions:
        return _ORIGINAL["deberta"](
            self, hidden_states, attention_mask, output_attentions, query_states, relative_pos, rel_embeddings
        )
    query = self.query_proj(hidden_states)
    key = self.key_proj(hidden_states)
    value = self.value_proj(hidden_states)
    factor = 1 + ("c2p" in self.pos_att_type) + ("p2c" in self.pos_att_type)
    scale = 1.0 / math.sqrt(self.attention_head_size * factor)
    bias = additive_bias(attention_mask.bool(), hidden_states.size(1), query.dtype)
    if self.relative_attention:
        bias = (
            bias + _relative_terms(self, query, key, relative_pos, self.pos_dropout(rel_embeddings)) * scale
        )
    return FusedAttention.apply(query, key, value, bias, self.num_attention_heads, scale), None


# --------------------------------------------------------------------------- eager_attention_forward


def fused_eager_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' `eager_attention_forward` ([B, heads, L, d] in, [B, L, heads, d] out)
    as one MultiHeadAttention."""
    b, _, length, _ = query.shape
    heads, d = int(query.shape[1]), int(query.shape[3])  # plain ints: attributes of the fused op
    scale = float(scaling) if scaling is not None else float(d) ** -0.5

    def merged(t):
        return t.transpose(1, 2).reshape(b, length, heads * d)

    if attention_mask is None:
        bias = torch.zeros(b, 1, length, length, dtype=query.dtype, device=query.device)
    else:
        bias = additive_bias(attention_mask[..., :length], length, query.dtype)
    out = FusedAttention.apply(merged(query), merged(key), merged(value), bias, heads, scale)
    return out.view(b, length, heads, d), None


_ORIGINAL: dict[str, Any] = {}


def _eager_modules(model: torch.nn.Module) -> list[Any]:
    """The transformers modules of `model`'s layers that define eager_attention_forward."""
    found = {}
    for m in model.modules():
        mod = sys.modules.get(type(m).__module__)
        if (
            mod is not None
            and callable(getattr(mod, "eager_attention_forward", None))
            and mod.__name__.startswith("transformers.models.")
        ):
            found[mod.__name__] = mod
    return list(found.values())


@contextlib.contextmanager
def fused_attention(model: torch.nn.Module, log: Callable[[str], None] = lambda m: None):
    """While exporting `model`, its attention traced as MultiHeadAttention (see the module
    doc); yields the number of attention implementations swapped."""
    from engine.pytorch.pooling import all_sentence_columns

    swapped: list[tuple[Any, str, Any]] = []
    deb = sys.modules.get(_DEBERTA)
    cls = getattr(deb, "DisentangledSelfAttention", None)
    if cls is not None and any(isinstance(m, cls) for m in model.modules()):
        _ORIGINAL["deberta"] = cls.forward
        swapped.append((cls, "forward", cls.forward))
        cls.forward = deberta_fused_forward
    for mod in _eager_modules(model):
        swapped.append((mod, "eager_attention_forward", mod.eager_attention_forward))
        mod.eager_attention_forward = fused_eager_attention
    if swapped:
        log(
            f"tracing attention as MultiHeadAttention ({', '.join(sorted({_short(o) for o, _, _ in swapped}))})"
        )
    else:
        log("note: no attention this exporter can fuse was found: attention stays as traced")
    try:
        with all_sentence_columns():
            yield len(swapped)
    finally:
        for owner, attr, value in reversed(swapped):
            setattr(owner, attr, value)
        _ORIGINAL.clear()
        _FLAT.clear()


def _short(owner: Any) -> str:
    name = getattr(owner, "__name__", str(owner))
    return name.rsplit(".", 1)[-1].replace("modeling_", "")


# --------------------------------------------------------------------------- the check

#: ops that compute shapes or branch: at a fixed shape none may be left (they run on the CPU)
SHAPE_OPS = ("Shape", "Size", "If", "Loop", "NonZero")
#: inputs that ONNX Runtime's CUDA kernels read on the CPU (shapes, axes, counts, bounds): at a
#: fixed shape each must be an initializer, or a node feeding it would be placed on the CPU
CPU_INPUTS = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Range": (0, 1, 2),
    "ConstantOfShape": (0,),
    "Slice": (1, 2, 3, 4),
    "Unsqueeze": (1,),
    "Squeeze": (1,),
    "ReduceSum": (1,),
    "ReduceMax": (1,),
    "ReduceMean": (1,),
    "TopK": (1,),
    "Pad": (1, 2, 3),
    "Split": (1,),
    "Resize": (1, 2, 3),
    "OneHot": (1,),
    "Clip": (1, 2),
    "CumSum": (1,),
    "Trilu": (1,),
}
CUDA_KERNELS = "ort_cuda_kernels.json"
_TYPE_NAMES = {
    1: "tensor(float)",
    2: "tensor(uint8)",
    3: "tensor(int8)",
    4: "tensor(uint16)",
    5: "tensor(int16)",
    6: "tensor(int32)",
    7: "tensor(int64)",
    9: "tensor(bool)",
    10: "tensor(float16)",
    11: "tensor(double)",
    12: "tensor(uint32)",
    13: "tensor(uint64)",
    16: "tensor(bfloat16)",
}


def cuda_kernels() -> dict[str, dict[str, Any]]:
    """The operators ONNX Runtime's CUDA provider implements, by domain: each op's parameters
    (per alternative: direction, name, type constraint or concrete type) and its kernels (per
    version range, the types of each constraint); from ONNX Runtime's docs/OperatorKernels.md
    (the file names its commit)."""
    import json
    from pathlib import Path

    return json.loads((Path(__file__).with_name(CUDA_KERNELS)).read_text())["ops"]


def fold(graph: str, batch: int, length: int, out: str) -> Any:
    """`graph` as ONNX Runtime sees it at batch x length (its free dimensions "batch" and
    "sequence" fixed, constant folding and the basic fusions run on the CPU provider), saved
    to `out`; the folded onnx.ModelProto."""
    import onnx
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.add_free_dimension_override_by_name("batch", int(batch))
    opts.add_free_dimension_override_by_name("sequence", int(length))
    opts.optimized_model_filepath = str(out)
    opts.log_severity_level = 3
    ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
    return onnx.load(str(out))


def typed(graph: Any, batch: int, length: int) -> Any:
    """`graph` (a path or an onnx.ModelProto) as exported, not folded, with its free dimensions
    fixed and every tensor's type inferred (ONNX Runtime's symbolic shape inference, which knows
    its contrib ops): the types each node runs at on the GPU. (Folding on the CPU provider would
    wrap every node it has no float16 kernel for in float32 casts, and hide them.)"""
    from pathlib import Path

    import onnx
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    model = (
        onnx.load(str(graph))
        if not isinstance(graph, onnx.ModelProto)
        else onnx.ModelProto.FromString(graph.SerializeToString())
    )
    fixed = {"batch": int(batch), "sequence": int(length)}
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in fixed:
                dim.dim_value = fixed[dim.dim_param]
    dump = [Path("sym_shape_infer_temp.onnx"), Path("sym_shape_infer_temp.onnx.data")]
    left = [f for f in dump if not f.exists()]
    try:
        return SymbolicShapeInference.infer_shapes(model, auto_merge=False, guess_output_rank=False)
    except Exception:  # an op it does not know: ONNX's own inference (standard ops' types)
        for f in left:  # what it saves into the working folder when it gives up
            f.unlink(missing_ok=True)
        return onnx.shape_inference.infer_shapes(model)


def _op_version(node: Any, opsets: dict[str, int]) -> int:
    """The version of `node`'s operator in a model of these opsets (ai.onnx: the schema in force)."""
    domain = node.domain or "ai.onnx"
    opset = opsets.get(node.domain or "", opsets.get(domain, 1))
    if domain != "ai.onnx":
        return opset
    import onnx

    try:
        return onnx.defs.get_schema(node.op_type, max_inclusive_version=opset, domain="").since_version
    except Exception:
        return opset


def _type_problems(node: Any, kernel: dict[str, Any], version: int, types: dict[str, int]) -> list[str]:
    """What in `node`'s input and output types no CUDA kernel of its op at `version` takes."""
    rows = [k for k in kernel["kernels"] if k["versions"][0] <= version <= (k["versions"][1] or version)]
    where = f"{node.op_type} {node.name!r}"
    if not rows:
        spans = ", ".join(f"{lo}-{hi or ''}" for lo, hi in (k["versions"] for k in kernel["kernels"]))
        return [f"{where}: the CUDA provider has no kernel for version {version} (it has {spans})"]
    best: list[str] | None = None
    for params in kernel["params"]:
        ins = [p for p in params if p[0] == "in"]
        outs = [p for p in params if p[0] == "out"]
        found = []
        for kind, names, formal in (("input", node.input, ins), ("output", node.output, outs)):
            for i, tensor in enumerate(names):
                if not tensor or not formal:
                    continue
                constraint = formal[min(i, len(formal) - 1)][2]  # a variadic parameter repeats
                actual = _TYPE_NAMES.get(types.get(tensor, 0))
                if actual is None:
                    found.append(f"{where}: {kind} {i} ({tensor}) has no inferred type")
                    continue
                allowed = (
                    [constraint]
                    if constraint.startswith("tensor(")
                    else sorted({t for k in rows for t in k["types"].get(constraint, [])})
                )
                if allowed and actual not in allowed:
                    found.append(
                        f"{where}: {kind} {i} ({tensor}) is {actual}; the CUDA provider's {node.op_type} "
                        f"(version {version}) takes {constraint} in {', '.join(allowed)}"
                    )
        if not found:
            return []
        best = found if best is None or len(found) < len(best) else best
    return best or []


def gpu_graph_problems(graph: str, batch: int, length: int, folded_out: str) -> list[str]:
    """What in `graph` (an exported GPU graph) would not run on ONNX Runtime's CUDA provider
    at batch x length. On the graph folded at that shape (`fold`, saved to `folded_out`):
    shape and control-flow nodes, and shape inputs computed at run time. On the graph as
    exported with that shape's types (`typed`): ops the provider has no kernel for, at the
    node's version, and every input and output whose type no kernel of its op takes. [] for a
    GPU graph."""
    return folded_problems(fold(graph, batch, length, folded_out)) + kernel_problems(
        typed(graph, batch, length)
    )


def folded_problems(model: Any) -> list[str]:
    """Shape and control-flow nodes, and shape inputs computed at run time, in a folded graph."""
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    problems = []
    for n in model.graph.node:
        where = f"{n.op_type} {n.name!r}"
        if n.op_type in SHAPE_OPS:
            problems.append(f"{where}: a shape or control-flow node is left at a fixed shape")
        for k in CPU_INPUTS.get(n.op_type, ()):
            if k < len(n.input) and n.input[k] and n.input[k] not in constants:
                problems.append(
                    f"{where}: input {k} ({n.input[k]}) is computed at run time and read on the CPU"
                )
    return problems


def kernel_problems(model: Any) -> list[str]:
    """Ops without a CUDA kernel and types no kernel takes, in a typed graph (`typed`)."""
    kernels = cuda_kernels()
    opsets = {o.domain: o.version for o in model.opset_import}
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)
    }
    types.update({t.name: t.data_type for t in model.graph.initializer})
    problems = []
    for n in model.graph.node:
        if n.op_type == "Constant":
            continue
        kernel = kernels.get(n.domain or "ai.onnx", {}).get(n.op_type)
        if kernel is None:
            problems.append(
                f"{n.op_type} {n.name!r}: the CUDA provider has no kernel for "
                f"{n.domain or 'ai.onnx'}.{n.op_type}"
            )
            continue
        problems += _type_problems(n, kernel, _op_version(n, opsets), types)
    return problems
