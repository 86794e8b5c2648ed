"""The GPU graph (#55), checked without a GPU: every family's fp16 export, folded at a
fixed batch and length as the GPU's sessions make it, has no shape or control-flow node,
no shape input computed at run time, only ops ONNX Runtime's CUDA provider implements
(export/ort_cuda_kernels.json, from ONNX Runtime's kernel table), and attention as one
MultiHeadAttention per layer; and the fixed-shape sessions that run it agree with the fp32
PyTorch reference on the CPU provider (fp16 tolerance: |dp| <= 0.005, decisions >= 99%)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from engine.backends.cuda_graphs import FixedShapeBackend, row_sizes
from engine.core.batching import BatchingConfig
from engine.errors import BackendError
from engine.pruner import Pruner
from export.checkpoints import make_test_checkpoint
from export.gpu import fold, gpu_graph_problems
from export.onnx import export_model
from tests.utils import FAMILY_NAMES, PASSAGES, QUESTION, THREADS

pytestmark = pytest.mark.inprocess

GPU_FAMILIES = FAMILY_NAMES + ["open_provence-modernbert"]
LAYERS = {"open_provence-modernbert": 3}          # the tiny ModernBERT's layers; the others have 2


@pytest.fixture(scope="module")
def gpu_exports(checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-graphs")
    sources = dict(checkpoints)
    sources["open_provence-modernbert"] = make_test_checkpoint("open_provence", root / "ck-modernbert",
                                                               backbone="modernbert")
    out = {}
    for name in GPU_FAMILIES:
        out[name] = root / name
        export_model(sources[name], out[name], precision="fp16", log=lambda m: None)
    return out


@pytest.mark.parametrize("name", GPU_FAMILIES)
@pytest.mark.parametrize("batch,length", [(4, 64), (1, 512)])
def test_gpu_graph_runs_every_node_on_cuda_at_a_fixed_shape(gpu_exports, name, batch, length, tmp_path):
    folded = fold(str(gpu_exports[name] / "model.onnx"), batch, length, str(tmp_path / "folded.onnx"))
    assert gpu_graph_problems(folded) == []
    ops = [n.op_type for n in folded.graph.node]
    assert ops.count("MultiHeadAttention") == LAYERS.get(name, 2), ops
    assert "Softmax" not in [n.op_type for n in folded.graph.node if "/encoder/" in n.name]


def test_the_check_finds_what_the_cpu_graph_leaves_on_the_cpu(exported, tmp_path):
    # the fp32 CPU export pools to max(sentence_ids) + 1 columns: a length computed at run time
    folded = fold(str(exported["provence"] / "model.onnx"), 4, 64, str(tmp_path / "folded.onnx"))
    problems = gpu_graph_problems(folded)
    assert any("Range" in p and "computed at run time" in p for p in problems), problems


def test_the_check_finds_shape_nodes_and_unknown_ops():
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [2])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Range", ["s", "s", "s"], ["r"]),
             helper.make_node("EyeLike", ["x"], ["e"]), helper.make_node("Det", ["x"], ["d"]),
             helper.make_node("Identity", ["s"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]))
    problems = gpu_graph_problems(model)
    assert any(p.startswith("Shape") and "shape or control-flow" in p for p in problems)
    assert any(p.startswith("Range") and "computed at run time" in p for p in problems)
    assert any(p.startswith("EyeLike") and "no float16 kernel" in p for p in problems), problems
    assert any(p.startswith("Det") and "has no kernel for ai.onnx.Det" in p for p in problems), problems


def test_gpu_graph_is_recorded_in_the_manifest(gpu_exports):
    import json
    manifest = json.loads((gpu_exports["provence"] / "manifest.json").read_text())
    assert manifest["precision"] == "fp16"
    assert manifest["gpu_graph"] == {"fused_attention_implementations": 1, "sentence_columns": "sequence"}
    graph = onnx.load(str(gpu_exports["provence"] / "model.onnx"))
    assert graph.graph.output[1].type.tensor_type.shape.dim[1].dim_param == "sequence"


@pytest.mark.parametrize("name", GPU_FAMILIES[:5])
def test_fixed_shape_sessions_agree_with_pytorch(gpu_exports, pruners, name):
    _, reference = pruners[name]
    spec_pruner = Pruner.load(gpu_exports[name], threads=THREADS)
    core = FixedShapeBackend(gpu_exports[name] / "model.onnx", [64, 128, 256, 512], device="cpu",
                             batching=BatchingConfig(max_batch_tokens=2048, max_batch_size=16), intra_op_threads=THREADS)
    fixed = Pruner(core, spec_pruner.encoder.tokenizer, spec_pruner.spec, BatchingConfig())
    assert fixed.batching.strategy == "longest" and fixed.batching.buckets == (64, 128, 256, 512)
    total = same = 0
    for t in (0.1, 0.3, 0.5):
        ref = reference.prune(QUESTION, PASSAGES, threshold=t)
        got = fixed.prune(QUESTION, PASSAGES, threshold=t)
        for ra, rb in zip(ref, got):
            assert [(s.start, s.end) for s in ra.sentences] == [(s.start, s.end) for s in rb.sentences]
            assert abs(ra.reranking_score - rb.reranking_score) <= 0.01
            for a, b in zip(ra.sentences, rb.sentences):
                assert abs(a.probability - b.probability) <= 0.005
                total, same = total + 1, same + (a.kept == b.kept)
    assert same / total >= 0.99
    assert all(length in (64, 128, 256, 512) for _, length in core.shapes)


def test_a_batch_runs_in_the_smallest_shape_that_holds_it(gpu_exports):
    core = FixedShapeBackend(gpu_exports["xprovence"] / "model.onnx", [64, 128], device="cpu",
                             batching=BatchingConfig(max_batch_tokens=1024, max_batch_size=64), intra_op_threads=THREADS)
    assert core.rows_for(64) == row_sizes(16) == (1, 2, 4, 8, 16) and core.rows_for(128) == (1, 2, 4, 8)
    rng = np.random.default_rng(0)
    from engine.core.batching import ModelBatch
    ids = rng.integers(5, 100, size=(3, 64)).astype(np.int64)
    mask = np.ones_like(ids)
    sid = np.tile(np.arange(64) // 16, (3, 1)).astype(np.int64)
    batch = ModelBatch(ids, mask, sid, np.zeros_like(ids), [0, 1, 2])
    rerank, probs = core.infer(batch)
    assert rerank.shape == (3,) and probs.shape == (3, 64)
    assert (4, 64) in core.shapes                     # 3 rows ran in the 4-row shape
    alone = [core.infer(ModelBatch(ids[i:i + 1], mask[i:i + 1], sid[i:i + 1], np.zeros_like(ids[i:i + 1]), [i]))
             for i in range(3)]
    assert np.allclose(np.concatenate([a[1] for a in alone]), probs, atol=2e-3)   # spare rows change nothing
    assert (1, 64) in core.shapes
    with pytest.raises(BackendError, match="largest fixed shape"):
        core.infer(ModelBatch(*(np.zeros((9, 128), np.int64) for _ in range(4)), list(range(9))))
    with pytest.raises(BackendError, match="fixed lengths"):
        core.infer(ModelBatch(*(np.zeros((1, 96), np.int64) for _ in range(4)), [0]))


def test_fused_deberta_attention_equals_transformers(monkeypatch):
    # on weights and position embeddings large enough that each term matters (the tiny test
    # checkpoints' position terms are too small for the export's parity check to see them)
    import torch
    from transformers import DebertaV2Config
    from transformers.models.deberta_v2 import modeling_deberta_v2 as deb
    from export.gpu import deberta_fused_forward
    torch.manual_seed(0)
    cfg = DebertaV2Config(hidden_size=32, num_attention_heads=4, relative_attention=True, pos_att_type=["p2c", "c2p"],
                          position_buckets=8, max_relative_positions=64, share_att_key=False)
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
