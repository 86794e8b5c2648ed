"""Graph optimization, INT8 (CPU) and FP16 (GPU) variants of an exported fp32 graph.

- optimize: ONNX Runtime's transformer optimizer (`model_type="bert"`). BERT and XLM-R
  get fused Attention, SkipLayerNormalization and Gelu; DeBERTa gets the LayerNorm and
  Gelu fusions only (ONNX Runtime has no fusion for its disentangled attention); the
  embedding family's custom attention mask is not a pattern the fuser knows. The result
  is saved, so a session does not redo this at every start.
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

# The nodes of the backbone carry these in their exported names; the heads and the
# sentence pooling do not (they are "/model/MatMul", "/model/token_classifier/MatMul"...).
_ENCODER_MARKERS = ("/encoder/layer", "Attention_")


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


def optimize_graph(src: Path, dst: Path, num_heads: int, hidden_size: int, opt_level: int = 1,
                   external_data: bool = False) -> dict[str, int]:
    """Run the transformer optimizer; returns the count of fused ops by type."""
    from onnxruntime.transformers.optimizer import optimize_model
    with _quiet_ort_logs():
        opt = optimize_model(str(src), model_type="bert", num_heads=num_heads, hidden_size=hidden_size,
                             opt_level=opt_level)
    opt.save_model_to_file(str(dst), use_external_data_format=external_data)
    counts: dict[str, int] = {}
    for n in opt.model.graph.node:
        if n.op_type in ("Attention", "MultiHeadAttention", "SkipLayerNormalization", "EmbedLayerNormalization",
                         "BiasGelu", "Gelu", "FastGelu", "LayerNormalization"):
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def weight_matmuls(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """(encoder nodes to quantize, other MatMul-like nodes) of a graph."""
    inits = {i.name for i in model.graph.initializer}
    quantize, other = [], []
    for n in model.graph.node:
        if n.op_type not in ("MatMul", "Gemm", "Attention"):
            continue
        in_encoder = any(m in n.name for m in _ENCODER_MARKERS)
        has_weight = n.op_type == "Attention" or any(i in inits for i in n.input[1:2])
        (quantize if in_encoder and has_weight else other).append(n.name)
    return quantize, other


def quantize_int8(src: Path, dst: Path, weight_type: str = "QInt8", per_channel: bool = True,
                  external_data: bool = False) -> dict[str, Any]:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    model = onnx.load(str(src))
    nodes, kept_fp32 = weight_matmuls(model)
    if not nodes:
        raise ValueError(f"{src}: no encoder weight MatMul to quantize")
    with _quiet_ort_logs():
        quantize_dynamic(str(src), str(dst), weight_type=getattr(QuantType, weight_type), per_channel=per_channel,
                         op_types_to_quantize=["MatMul", "Attention"], nodes_to_quantize=nodes,
                         use_external_data_format=external_data,
                         # needed for graphs the transformer optimizer fused (environment notes)
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return {"weight_type": weight_type, "per_channel": per_channel, "quantized_nodes": len(nodes),
            "float32_nodes": len(kept_fp32)}


def convert_fp16(src: Path, dst: Path, num_heads: int, hidden_size: int, keep_layernorm_fp32: bool,
                 external_data: bool = False) -> dict[str, Any]:
    """fp16 graph with float32 I/O; Softmax, heads and pooling (and LayerNorm) in float32."""
    from onnxruntime.transformers.optimizer import optimize_model
    with _quiet_ort_logs():
        opt = optimize_model(str(src), model_type="bert", num_heads=num_heads, hidden_size=hidden_size,
                             opt_level=0)
    keep_ops = ["Softmax"]
    if keep_layernorm_fp32:
        keep_ops += ["LayerNormalization", "SkipLayerNormalization"]
    head_nodes = [n.name for n in opt.model.graph.node
                  if not any(m in n.name for m in _ENCODER_MARKERS) and "/embeddings/" not in n.name]
    with _quiet_ort_logs():
        opt.convert_float_to_float16(keep_io_types=True, op_block_list=keep_ops, node_block_list=head_nodes)
    opt.save_model_to_file(str(dst), use_external_data_format=external_data)
    return {"float32_ops": keep_ops, "float32_nodes": len(head_nodes)}
