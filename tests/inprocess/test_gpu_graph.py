"""The GPU graph (#55, #60), checked without a GPU: every family's fp16 export, folded at a
fixed batch and length as the GPU's sessions make it, has no shape or control-flow node and
no shape input computed at run time; as exported, with that shape's types, every input and
output of every node is a type a CUDA kernel of its op takes at its version
(export/ort_cuda_kernels.json, ONNX Runtime's kernel table); attention is one
MultiHeadAttention per layer, fed float16, and the encoder's weights and compute are
float16 in every family. The backend that runs it: test_gpu_backend.py."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto

from export.gpu import fold, folded_problems, gpu_graph_problems, kernel_problems, typed
from tests.utils import GPU_FAMILIES

pytestmark = pytest.mark.inprocess

LAYERS = {"open_provence-modernbert": 3}  # the tiny ModernBERT's layers; the others have 2


@pytest.mark.parametrize("name", GPU_FAMILIES)
@pytest.mark.parametrize("batch,length", [(4, 64), (1, 512)])
def test_gpu_graph_runs_every_node_on_cuda_at_a_fixed_shape(gpu_exports, name, batch, length, tmp_path):
    assert (
        gpu_graph_problems(
            str(gpu_exports[name] / "model.onnx"), batch, length, str(tmp_path / "folded.onnx")
        )
        == []
    )
    folded = onnx.load(str(tmp_path / "folded.onnx"))
    ops = [n.op_type for n in folded.graph.node]
    assert ops.count("MultiHeadAttention") == LAYERS.get(name, 2), ops
    assert "Softmax" not in [n.op_type for n in folded.graph.node if "/encoder/" in n.name]


def test_debertas_position_indices_are_one_table_per_term_at_a_fixed_shape(gpu_exports, tmp_path):
    """Provence's GPU graph gathers both position terms of every layer with the same two flat
    [L x L] indices: at a fixed shape they fold into two int64 tables, not two per layer (2 MiB
    each per layer at 512 tokens, ../reference/gpu-review-2.md)."""
    import numpy as np
    from onnx import numpy_helper

    folded = fold(str(gpu_exports["provence"] / "model.onnx"), 2, 64, str(tmp_path / "folded.onnx"))
    tables = [
        t.name
        for t in folded.graph.initializer
        if t.data_type == TensorProto.INT64 and int(np.prod(t.dims)) == 64 * 64
    ]
    assert len(tables) == 2, tables
    gathers = [n for n in folded.graph.node if n.op_type == "Gather" and any(i in tables for i in n.input)]
    assert len(gathers) == 2 * LAYERS.get("provence", 2)  # each layer's c2p and p2c read them
    indices = [numpy_helper.to_array(t) for t in folded.graph.initializer if t.name in tables]
    assert not np.array_equal(*indices)  # one for each term


@pytest.mark.parametrize("layout", ["xlm-roberta", "bert"])
@pytest.mark.parametrize("batch,length", [(4, 128), (16, 512)])
def test_the_compressors_gpu_graph_runs_every_node_on_cuda_at_a_fixed_shape(
    lingua_fp16, layout, batch, length, tmp_path
):
    """LLMLingua-2's fp16 export is a GPU graph like the pruners': attention one MultiHeadAttention
    per layer, and at a fixed shape no node the CUDA provider would leave to the CPU (which would
    make ONNX Runtime refuse the capture, and every shape stay on the dynamic session)."""
    import json

    graph = str(lingua_fp16[layout] / "model.onnx")
    assert gpu_graph_problems(graph, batch, length, str(tmp_path / "folded.onnx")) == []
    nodes = onnx.load(str(tmp_path / "folded.onnx")).graph.node
    ops = [n.op_type for n in nodes]
    assert ops.count("MultiHeadAttention") == 2, ops  # the tiny checkpoints' 2 layers
    assert not [n.name for n in nodes if n.op_type == "Softmax" and "/encoder/" in n.name]
    manifest = json.loads((lingua_fp16[layout] / "manifest.json").read_text())
    assert manifest["gpu_graph"]["fused_attention_implementations"] >= 1


def test_the_check_finds_what_the_cpu_graph_leaves_on_the_cpu(exported, tmp_path):
    # the fp32 CPU export pools to max(sentence_ids) + 1 columns: a length computed at run time
    problems = folded_problems(
        fold(str(exported["provence"] / "model.onnx"), 4, 64, str(tmp_path / "folded.onnx"))
    )
    assert any("Range" in p and "computed at run time" in p for p in problems), problems


def _model(nodes, inputs, outputs, opset=17):
    from onnx import helper

    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs),
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 8
    return model


def test_the_check_finds_shape_nodes_and_unknown_ops():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [2])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Range", ["s", "s", "s"], ["r"]),
        helper.make_node("Det", ["x"], ["d"]),
        helper.make_node("Identity", ["s"], ["y"]),
    ]
    model = _model(nodes, [x], [y])
    folded = folded_problems(model)
    assert any(p.startswith("Shape") and "shape or control-flow" in p for p in folded)
    assert any(p.startswith("Range") and "computed at run time" in p for p in folded)
    d = helper.make_tensor_value_info("d", TensorProto.FLOAT16, [2])
    kernels = kernel_problems(typed(_model([helper.make_node("Det", ["x"], ["d"])], [x], [d]), 2, 3))
    assert any(p.startswith("Det") and "has no kernel for ai.onnx.Det" in p for p in kernels), kernels


def test_the_type_check_sees_the_ops_the_cpu_would_run_in_float32(tmp_path):
    # EyeLike has no float16 kernel on CUDA: fed fp16, it feeds MultiHeadAttention fp16. Folded on
    # the CPU provider (the check before #60), the fp16 EyeLike is wrapped in float32 casts and looks fine
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", "sequence"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    nodes = [
        helper.make_node("EyeLike", ["x"], ["e"], name="eye"),
        helper.make_node("Unsqueeze", ["e", "axes"], ["q"]),
        helper.make_node(
            "MultiHeadAttention",
            ["q", "q", "q"],
            ["y"],
            domain="com.microsoft",
            num_heads=2,
            name="attention",
        ),
    ]
    model = _model(nodes, [x], [y])
    model.graph.initializer.append(axes)
    onnx.save(model, str(tmp_path / "m.onnx"))
    problems = gpu_graph_problems(str(tmp_path / "m.onnx"), 1, 16, str(tmp_path / "folded.onnx"))
    assert any(p.startswith("EyeLike 'eye': input 0 (x) is tensor(float16)") for p in problems), problems
    assert not any("attention" in p for p in problems)
    folded = onnx.load(str(tmp_path / "folded.onnx"))
    eye = next(n for n in folded.graph.node if n.op_type == "EyeLike")
    casts = {o for n in folded.graph.node if n.op_type == "Cast" for o in n.output}
    assert eye.input[0] in casts  # the CPU ran it in float32


@pytest.mark.parametrize("opset,expected", [(13, "version 11"), (14, None)])
def test_the_type_check_reads_the_kernel_of_the_node_version(opset, expected):
    # CUDA's CumSum takes float16 from version 14 only
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", "sequence"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", "sequence"])
    axis = helper.make_tensor("axis", TensorProto.INT64, [], [1])
    model = _model([helper.make_node("CumSum", ["x", "axis"], ["y"], name="cumsum")], [x], [y], opset)
    model.graph.initializer.append(axis)
    problems = kernel_problems(typed(model, 2, 8))
    if expected is None:
        assert problems == []
    else:
        assert [p.split(":")[1].split(" (")[0] for p in problems] == [" input 0", " output 0"], problems
        assert all(expected in p and "is tensor(float16)" in p for p in problems), problems


#: checkpoints whose encoder dominates their weights, as real models' do (the tiny ones are mostly embeddings):
#: 4 layers of 256 (DeBERTa's relative-position table scaled with them: 64 buckets)
WIDE = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024}


@pytest.mark.parametrize("name", GPU_FAMILIES)
def test_fp16_export_runs_the_encoder_in_float16(name, tmp_path):
    from export.checkpoints import make_test_checkpoint
    from export.onnx import export_model

    family, _, backbone = name.partition("-")
    sizes = {**WIDE, **({"position_buckets": 64} if family == "provence" else {})}
    ck = make_test_checkpoint(family, tmp_path / "ck", sizes=sizes, backbone=backbone or None)
    export_model(
        ck, tmp_path / "fp16", precision="fp16", log=lambda m: None
    )  # parity with fp32 PyTorch checked
    model = typed(str(tmp_path / "fp16" / "model.onnx"), 2, 64)
    from onnx import numpy_helper

    sizes = {}
    for t in model.graph.initializer:
        sizes[t.data_type] = sizes.get(t.data_type, 0) + numpy_helper.to_array(t).nbytes
    floats = sizes.get(TensorProto.FLOAT16, 0) + sizes.get(TensorProto.FLOAT, 0)
    assert sizes.get(TensorProto.FLOAT16, 0) >= 0.9 * floats, sizes
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    attention = [n for n in model.graph.node if n.op_type == "MultiHeadAttention"]
    assert len(attention) == WIDE["num_hidden_layers"]
    for n in attention:
        assert [types[i] for i in n.input if i] == [TensorProto.FLOAT16] * 4, n.name  # q, k, v and the bias

    def half(n):
        return types.get(n.input[0]) == TensorProto.FLOAT16

    layers = WIDE["num_hidden_layers"]
    for op in ("BiasGelu", "SkipLayerNormalization"):  # only the layers have these
        if op == "SkipLayerNormalization" and family == "provence":
            continue  # DeBERTa keeps its LayerNorm in float32 (it overflows)
        nodes = [n for n in model.graph.node if n.op_type == op]
        assert [n.name for n in nodes if not half(n)] == [], op
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert sum(map(half, matmuls)) >= 4 * layers  # each layer's projections (4 in ModernBERT, 6+ elsewhere)
    assert len(matmuls) - sum(map(half, matmuls)) <= 3  # the heads' and the pooling's, in float32


def test_gpu_graph_is_recorded_in_the_manifest(gpu_exports):
    import json

    manifest = json.loads((gpu_exports["provence"] / "manifest.json").read_text())
    assert manifest["precision"] == "fp16"
    assert manifest["gpu_graph"] == {"fused_attention_implementations": 1, "sentence_columns": "sequence"}
    graph = onnx.load(str(gpu_exports["provence"] / "model.onnx"))
    assert graph.graph.output[1].type.tensor_type.shape.dim[1].dim_param == "sequence"


def test_fused_deberta_attention_equals_transformers(monkeypatch):
    # on weights and position embeddings large enough that each term matters (the tiny test
    # checkpoints' position terms are too small for the export's parity check to see them)
    import torch
    from transformers import DebertaV2Config
    from transformers.models.deberta_v2 import modeling_deberta_v2 as deb
    from export.gpu import deberta_fused_forward

    torch.manual_seed(0)
    cfg = DebertaV2Config(
        hidden_size=32,
        num_attention_heads=4,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        position_buckets=8,
        max_relative_positions=64,
        share_att_key=False,
    )
    attn = deb.DisentangledSelfAttention(cfg).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.5)
    b, length = 2, 20
    hidden = torch.randn(b, length, 32)
    mask2d = torch.ones(b, length, dtype=torch.long)
    mask2d[1, 13:] = 0
    mask = mask2d[:, None, None, :] * mask2d[:, None, :, None]
    rel = deb.build_relative_position(hidden, hidden, bucket_size=8, max_position=64)
    table = torch.randn(2 * 8, 32) * 2
    with torch.no_grad():
        want = attn(hidden, mask, relative_pos=rel, rel_embeddings=table)[0]
        got = deberta_fused_forward(attn, hidden, mask, relative_pos=rel, rel_embeddings=table)[0]
    real = mask2d.bool()
    assert (got[real] - want[real]).abs().max() < 1e-4, (got[real] - want[real]).abs().max()


def test_fused_eager_attention_equals_transformers():
    import torch
    from transformers.models.bert.modeling_bert import eager_attention_forward
    from export.gpu import fused_eager_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 12, 8) * 3 for _ in range(3))
    allowed = torch.rand(2, 1, 12, 12) > 0.4
    allowed[..., 0] = True
    additive = torch.zeros(2, 1, 12, 12).masked_fill(~allowed, torch.finfo(torch.float32).min)
    module = torch.nn.Module().eval()
    want = eager_attention_forward(module, q, k, v, additive, scaling=0.3)[0]
    got = fused_eager_attention(module, q, k, v, additive, scaling=0.3)[0]
    assert got.shape == want.shape and (got - want).abs().max() < 1e-5
