"""Graph optimization, INT8 (CPU) and FP16 (GPU) variants of an exported fp32 graph.

- optimize: ONNX Runtime's transformer optimizer (`model_type="bert"`). BERT and XLM-R
  get fused Attention, SkipLayerNormalization and Gelu; DeBERTa gets the LayerNorm and
  Gelu fusions only (ONNX Runtime has no fusion for its disentangled attention); the
  embedding family's custom attention mask is not a pattern the fuser knows. Each
  SkipLayerNormalization is then split back into Add + LayerNormalization, faster on the
  CPU provider (`unfuse_skip_layer_norm`). The result is saved, so a session does not
  redo this at every start.
- int8: dynamic quantization of the encoder's weight MatMuls (and fused Attention)
  only. The heads, the softmax, the sentence pooling and every activation x activation
  MatMul stay float32. Weight type and per-channel are chosen by measured fidelity
  (`benchmarks/results/` and docs/precisions.md), not by default.
- fp16: float16 weights and compute with float32 inputs/outputs; Softmax, the heads and
  the sentence pooling, and (for DeBERTa, which overflows in fp16) LayerNormalization
  stay float32. Runs on the CPU provider for tests; it is for GPUs.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto

# The nodes of the backbone carry these in their exported names (BERT, DeBERTa and XLM-R:
# ".../encoder/layer.N/..."; ModernBERT: ".../layers.N/..."); the heads and the
# sentence pooling do not (they are "/model/MatMul", "/model/token_classifier/MatMul"...).
_ENCODER_MARKERS = ("/encoder/layer", "/layers.", "Attention_")


def in_encoder(node: onnx.NodeProto) -> bool:
    """Whether `node` is part of the backbone's layers: its name says so, or, for a node the
    optimizer fused and named after its op ("Gelu_AddBias_0", "SkipLayerNorm_AddBias_3"), an
    output it writes does (the fused nodes keep the output names of the nodes they replace).
    Inputs do not count: a head reads the last layer's output."""
    return any(m in name for m in _ENCODER_MARKERS for name in (node.name, *node.output))


@contextlib.contextmanager
def _quiet_ort_logs():
    """ONNX Runtime's optimizer and quantizer log warnings that are expected here, on the
    root logger and on loggers named after their own modules (imported as top-level
    `fusion_*`): the quantizer's advice to run pre-processing (it fails or hangs on these
    graphs: docs/precisions.md) and the embedding fusion's note that the test models'
    vocabularies are smaller than their position tables. Errors still show."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def encoder_dims(config: dict[str, Any]) -> tuple[int, int]:
    """(num_heads, hidden_size) of the backbone from the checkpoint config."""
    base = config.get("base_model_config") or config
    return int(base.get("num_attention_heads", 0)), int(base.get("hidden_size", 0))


FUSED_OPS = (
    "Attention",
    "MultiHeadAttention",
    "SkipLayerNormalization",
    "EmbedLayerNormalization",
    "BiasGelu",
    "Gelu",
    "FastGelu",
    "LayerNormalization",
)


def fused_ops(graph) -> dict[str, int]:
    """How many of each fused op (FUSED_OPS) `graph` has."""
    counts: dict[str, int] = {}
    for n in graph.node:
        if n.op_type in FUSED_OPS:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def optimize_graph(
    src: Path, dst: Path, num_heads: int, hidden_size: int, opt_level: int = 1, external_data: bool = False
) -> dict[str, int]:
    """Run the transformer optimizer; returns the count of fused ops by type."""
    from onnxruntime.transformers.optimizer import optimize_model

    with _quiet_ort_logs():
        opt = optimize_model(
            str(src), model_type="bert", num_heads=num_heads, hidden_size=hidden_size, opt_level=opt_level
        )
    counts = fused_ops(opt.model.graph)
    unfused = unfuse_skip_layer_norm(opt.model.graph)
    if unfused:
        counts["SkipLayerNormalization unfused (Add + LayerNormalization)"] = unfused
    opt.save_model_to_file(str(dst), use_external_data_format=external_data)
    return counts


def unfuse_skip_layer_norm(graph) -> int:
    """Replace every SkipLayerNormalization by Add (input + skip, + bias) and
    LayerNormalization; returns how many. On the CPU provider the fused kernel is the
    slower one: 23 ms against 7 ms for 30,000 x 384 (onnxruntime 1.32, 2 cores), and the
    default model's INT8 calls take 13% less time without it (docs/performance.md). The
    fp16 conversion re-runs the optimizer, which fuses them again for the GPU. A node whose
    mean or inverse-deviation output is used is left as it is."""
    from onnx import helper

    nodes, count = [], 0
    for n in graph.node:
        outs = list(n.output) + [""] * 4
        if n.op_type != "SkipLayerNormalization" or n.domain != "com.microsoft" or outs[1] or outs[2]:
            nodes.append(n)
            continue
        x, skip, gamma, beta, bias = (list(n.input) + [""] * 5)[:5]
        eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-12)
        name = f"{n.name or 'SkipLayerNorm'}_unfused_{count}"
        total = outs[3] or f"{name}_sum"  # input + skip (+ bias): the residual stream
        first = f"{name}_sum_no_bias" if bias else total
        nodes.append(helper.make_node("Add", [x, skip], [first], name=f"{name}_add"))
        if bias:
            nodes.append(helper.make_node("Add", [first, bias], [total], name=f"{name}_add_bias"))
        nodes.append(
            helper.make_node(
                "LayerNormalization",
                [total, gamma] + ([beta] if beta else []),
                [outs[0]],
                name=f"{name}_layer_norm",
                axis=-1,
                epsilon=eps,
            )
        )
        count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return count


def weight_matmuls(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """(encoder nodes to quantize, other MatMul-like nodes) of a graph."""
    inits = {i.name for i in model.graph.initializer}
    quantize, other = [], []
    for n in model.graph.node:
        if n.op_type not in ("MatMul", "Gemm", "Attention"):
            continue
        encoder = in_encoder(n)
        has_weight = n.op_type == "Attention" or any(i in inits for i in n.input[1:2])
        (quantize if encoder and has_weight else other).append(n.name)
    return quantize, other


def quantize_int8(
    src: Path, dst: Path, weight_type: str = "QInt8", per_channel: bool = True, external_data: bool = False
) -> dict[str, Any]:
    """Dynamic INT8 quantization of `src` into `dst` (ONNX Runtime's quantizer)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(src))
    nodes, kept_fp32 = weight_matmuls(model)
    if not nodes:
        raise ValueError(f"{src}: no encoder weight MatMul to quantize")
    with _quiet_ort_logs():
        quantize_dynamic(
            str(src),
            str(dst),
            weight_type=getattr(QuantType, weight_type),
            per_channel=per_channel,
            op_types_to_quantize=["MatMul", "Attention"],
            nodes_to_quantize=nodes,
            use_external_data_format=external_data,
            # needed for graphs the transformer optimizer fused (environment notes)
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    return {
        "weight_type": weight_type,
        "per_channel": per_channel,
        "quantized_nodes": len(nodes),
        "float32_nodes": len(kept_fp32),
    }


def convert_fp16(
    src: Path,
    dst: Path,
    num_heads: int,
    hidden_size: int,
    keep_layernorm_fp32: bool,
    external_data: bool = False,
) -> dict[str, Any]:
    """fp16 graph with float32 I/O; Softmax, heads and pooling (and LayerNorm) in float32. It
    runs the transformer optimizer on `src` (the plain fp32 graph) first: `fusions` counts them."""
    from onnxruntime.transformers.optimizer import optimize_model

    with _quiet_ort_logs():
        opt = optimize_model(
            str(src), model_type="bert", num_heads=num_heads, hidden_size=hidden_size, opt_level=0
        )
    keep_ops = ["Softmax"]
    if keep_layernorm_fp32:
        keep_ops += ["LayerNormalization", "SkipLayerNormalization"]
    head_nodes = [
        n.name
        for n in opt.model.graph.node
        if not in_encoder(n) and "embeddings/" not in n.name and not any("embeddings." in i for i in n.input)
    ]  # DeBERTa's rel_embeddings, read by an encoder node
    fusions = fused_ops(opt.model.graph)
    with _quiet_ort_logs():
        opt.convert_float_to_float16(keep_io_types=True, op_block_list=keep_ops, node_block_list=head_nodes)
    dropped = drop_repeated_nodes(opt.model.graph)
    renamed = unique_node_names(opt.model.graph)
    opt.save_model_to_file(str(dst), use_external_data_format=external_data)
    return {
        "fusions": fusions,
        "float32_ops": keep_ops,
        "float32_nodes": len(head_nodes),
        "repeated_casts_dropped": dropped,
        "renamed_nodes": renamed,
    }


def drop_repeated_nodes(graph) -> int:
    """Remove a node that recomputes, identically, a tensor an earlier node already
    produces; returns how many were removed.

    ONNX Runtime's float16 converter in onnxruntime 1.30 and 1.31 inserts one Cast per
    consumer of a float32-kept tensor, each named after that tensor and writing the same
    output name: the graph then defines one tensor several times and those versions refuse
    it ("Duplicate definition of name", "two nodes with same node name"); 1.32 accepts it.
    The copies are the same Cast of the same input, so every consumer reads the first.
    Two different nodes writing one name would be a real conflict: that raises."""
    from engine.errors import ExportError

    producer: dict[str, Any] = {}
    keep = []
    dropped = 0
    for node in graph.node:
        earlier = [producer[o] for o in node.output if o and o in producer]
        if earlier:
            first = earlier[0]
            same = (
                first.op_type == node.op_type
                and first.domain == node.domain
                and list(first.input) == list(node.input)
                and list(first.output) == list(node.output)
                and [a.SerializeToString() for a in first.attribute]
                == [a.SerializeToString() for a in node.attribute]
            )
            if not same:
                raise ExportError(
                    f"two different nodes ({first.name}, {node.name}) write the tensor {node.output[0]}"
                )
            dropped += 1
            continue
        for o in node.output:
            if o:
                producer[o] = node
        keep.append(node)
    if dropped:
        del graph.node[:]
        graph.node.extend(keep)
    return dropped


def unique_node_names(graph) -> int:
    """Give every node of `graph` a name of its own; returns how many were renamed.

    ONNX Runtime's float16 converter in onnxruntime 1.30 and 1.31 names the Cast it
    inserts after the tensor it casts, so a tensor cast for two consumers yields two nodes
    of one name ("..._cast_to_fp32_node"), and ONNX Runtime 1.30/1.31 then refuse the
    graph ("two nodes with same node name"); 1.32 accepts it. Node names carry no
    meaning in the computation: the second and later get a suffix."""
    seen: set[str] = {n.name for n in graph.node}
    counts: dict[str, int] = {}
    renamed = 0
    for node in graph.node:
        if not node.name:
            continue
        k = counts.get(node.name, 0)
        counts[node.name] = k + 1
        if k == 0:
            continue
        new = f"{node.name}_{k}"
        while new in seen:
            k += 1
            new = f"{node.name}_{k}"
        seen.add(new)
        node.name = new
        renamed += 1
    return renamed


# --------------------------------------------------------------------------- graph fixes


def fix_graph(model: onnx.ModelProto) -> dict[str, int]:
    """Graph changes TensorRT needs, in place; returns what was changed.

    - Cast to UINT8 (DeBERTa's older exports cast masks to uint8): TensorRT rejects uint8
      tensors in most layers; a mask only needs BOOL, so the cast becomes BOOL when every
      consumer is a logical op or Where, and INT32 otherwise.
    - Cast to DOUBLE: TensorRT has no float64; FLOAT keeps the value range these graphs use.
    """
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    changed = {"uint8_casts": 0, "double_casts": 0}
    logical = {"Not", "And", "Or", "Xor", "Where", "Equal"}
    for n in model.graph.node:
        if n.op_type != "Cast":
            continue
        to = next(a for a in n.attribute if a.name == "to")
        if to.i == TensorProto.UINT8:
            uses = consumers.get(n.output[0], [])
            to.i = TensorProto.BOOL if uses and all(u.op_type in logical for u in uses) else TensorProto.INT32
            changed["uint8_casts"] += 1
        elif to.i == TensorProto.DOUBLE:
            to.i = TensorProto.FLOAT
            changed["double_casts"] += 1
    return changed
