"""Optimized fp32, INT8 and FP16 graphs against the fp32 PyTorch reference; TensorRT's
pure parts.

Stated tolerances (measured on the test checkpoints, whose heads are widened so that
probabilities spread over 0..1, which makes them harder than real models):
- fp32 optimized: |dp| <= 1e-5 and identical decisions at 0.1 / 0.3 / 0.5;
- INT8 (dynamic, the default QInt8 per-channel weights): |dp| <= 0.02;
- FP16: |dp| <= 0.005 (measured up to ~3e-4).
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from engine.pruner import Pruner
from export.onnx import export_model
from export.tensorrt import tensorrt_available
from tests.utils import FAMILY_NAMES
from tests.utils import PASSAGES, QUESTION

pytestmark = pytest.mark.inprocess

TOL = {"fp32": 1e-5, "int8": 0.02, "fp16": 0.005}
RERANK_TOL = {"fp32": 1e-4, "int8": 0.05, "fp16": 0.01}
AGREEMENT = {"fp32": 1.0, "int8": 0.95, "fp16": 0.99}


@pytest.fixture(scope="module")
def variants(checkpoints, exported, gpu_exports, exported_int8, tmp_path_factory):
    """Every family at every precision: the session's fp32, fp16 and xprovence INT8 exports, the
    other INT8 exports made here."""
    root = tmp_path_factory.mktemp("precisions")
    out = {}
    for name in FAMILY_NAMES:
        out[name, "fp32"], out[name, "fp16"] = exported[name], gpu_exports[name]
        out[name, "int8"] = exported_int8 if name == "xprovence" else root / f"{name}-int8"
        if name != "xprovence":
            export_model(checkpoints[name], out[name, "int8"], precision="int8", log=lambda m: None)
    return out


@pytest.mark.parametrize("name", FAMILY_NAMES)
@pytest.mark.parametrize("precision", ["fp32", "int8", "fp16"])
def test_precision_against_reference(variants, pruners, name, precision):
    _, reference = pruners[name]
    candidate = Pruner.load(variants[name, precision], threads=1)
    ref = reference.prune(QUESTION, PASSAGES)
    got = candidate.prune(QUESTION, PASSAGES)
    assert len(ref) == len(got) == len(PASSAGES)
    for ra, rb in zip(ref, got):
        assert [(s.start, s.end) for s in ra.sentences] == [(s.start, s.end) for s in rb.sentences]
    dp = max(
        abs(a.probability - b.probability)
        for ra, rb in zip(ref, got)
        for a, b in zip(ra.sentences, rb.sentences)
    )
    assert dp <= TOL[precision], f"{name} {precision}: max |dp| {dp:.2e}"
    dr = max(abs(ra.reranking_score - rb.reranking_score) for ra, rb in zip(ref, got))
    assert dr <= RERANK_TOL[precision], f"{name} {precision}: max rerank error {dr:.2e}"
    # decisions: identical for fp32; for the reduced precisions, agreement at least
    # AGREEMENT (a sentence within |dp| of a threshold may flip, nothing more)
    total = same = 0
    for t in (0.1, 0.3, 0.5):
        a = [s.kept for r in reference.prune(QUESTION, PASSAGES, threshold=t) for s in r.sentences]
        b = [s.kept for r in candidate.prune(QUESTION, PASSAGES, threshold=t) for s in r.sentences]
        assert len(a) == len(b)
        total += len(a)
        same += sum(x == y for x, y in zip(a, b))
    assert same / total >= AGREEMENT[precision], f"{name} {precision}: agreement {same / total:.3f}"


def _elem_types(model):
    """Element type of every tensor, from ONNX Runtime's symbolic shape inference (which
    knows the contrib ops the optimizer fuses)."""
    import os
    import tempfile
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch:  # it writes scratch files into the working folder
        os.chdir(scratch)
        try:
            inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=True, guess_output_rank=True)
        finally:
            os.chdir(cwd)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}
    types.update({i.name: i.data_type for i in g.initializer})
    return types


def _softmax_types(model):
    types = _elem_types(model)
    return [
        (n.name, types.get(n.input[0]), types.get(n.output[0]))
        for n in model.graph.node
        if n.op_type == "Softmax"
    ]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_optimizer_fused_what_it_can(variants, name):
    import json

    m = json.loads((variants[name, "fp32"] / "manifest.json").read_text())
    assert m["optimized"] and m["fusions"].get("SkipLayerNormalization", 0) > 0
    ops = {n.op_type for n in onnx.load(str(variants[name, "fp32"] / "model.onnx")).graph.node}
    # split back into Add + LayerNormalization for the CPU graphs (the faster kernels there);
    # the GPU's fp16 graph keeps the fused kernel
    unfused = m["fusions"]["SkipLayerNormalization unfused (Add + LayerNormalization)"]
    assert unfused == m["fusions"]["SkipLayerNormalization"]
    for precision in ("fp32", "int8"):
        graph = onnx.load(str(variants[name, precision] / "model.onnx")).graph.node
        assert not any(n.op_type == "SkipLayerNormalization" for n in graph), precision
        assert sum(n.op_type == "LayerNormalization" for n in graph) >= unfused
    fp16 = onnx.load(str(variants[name, "fp16"] / "model.onnx")).graph.node
    assert any(n.op_type == "SkipLayerNormalization" for n in fp16)
    if name in ("xprovence", "open_provence", "opensearch"):
        assert "Attention" in ops  # BERT / XLM-R attention is fused
    else:
        assert "Attention" not in ops  # DeBERTa's and the custom-mask attention are not


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_int8_keeps_heads_and_pooling_in_float32(variants, name):
    graph = onnx.load(str(variants[name, "int8"] / "model.onnx")).graph
    ops = [n.op_type for n in graph.node]
    assert "MatMulInteger" in ops or "QAttention" in ops or "DynamicQuantizeMatMul" in ops
    quantized = [
        n for n in graph.node if n.op_type in ("MatMulInteger", "QAttention", "DynamicQuantizeMatMul")
    ]
    for n in quantized:
        assert "/encoder/layer" in n.name or n.name.startswith("Attention"), n.name
    # the heads' weights stay float32 MatMul/Gemm: every weight initializer outside the
    # encoder is FLOAT, and the head MatMuls are still there
    inits = {i.name: i for i in graph.initializer}
    heads = [
        n
        for n in graph.node
        if n.op_type in ("MatMul", "Gemm")
        and "/encoder/" not in n.name
        and any(x in inits for x in n.input[1:2])
    ]
    assert heads or name == "embedding", "no float head MatMul left"  # (embedding: no head, cosines)
    for n in heads:
        assert inits[n.input[1]].data_type == onnx.TensorProto.FLOAT, n.name
    model = onnx.load(str(variants[name, "int8"] / "model.onnx"))
    softmax = _softmax_types(model)
    assert softmax and all(i == o == onnx.TensorProto.FLOAT for _, i, o in softmax), softmax


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_fp16_float32_io_and_finite_on_long_inputs(variants, name):
    folder = variants[name, "fp16"]
    model = onnx.load(str(folder / "model.onnx"))
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer)
    for o in model.graph.output:
        assert o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    softmax = _softmax_types(model)
    # attention is one fused MultiHeadAttention per layer (its kernels accumulate in float32);
    # every Softmax left (the keep-probability heads) reads and writes float32
    assert [n for n in model.graph.node if n.op_type == "MultiHeadAttention"]
    assert all(i == o == onnx.TensorProto.FLOAT for _, i, o in softmax), softmax
    pruner = Pruner.load(folder, threads=1)
    long_passage = " ".join(
        f"Sentence {i} repeats the long word antidisestablishmentarianism {i} times." for i in range(200)
    )
    res = pruner.prune(QUESTION, [long_passage, "Short."])
    probs = np.array([s.probability for r in res for s in r.sentences])
    assert np.isfinite(probs).all() and res[0].blocks > 2
    assert all(np.isfinite(r.reranking_score) for r in res)


# ------------------------------------------------------------------ TensorRT


@pytest.mark.skipif(
    not tensorrt_available(), reason="TensorRT is not installed (only in NVIDIA's containers)"
)
def test_tensorrt_engine_matches_onnxruntime(checkpoints, tmp_path):
    from export.tensorrt import export_tensorrt

    export_model(
        checkpoints["xprovence"], tmp_path / "x", precision="fp16", tensorrt_graph=True, log=lambda m: None
    )
    info = export_tensorrt(tmp_path / "x", "fp16", max_batch_size=8, log=lambda m: None)
    assert info["check"]["max_abs_diff_vs_onnxruntime"] <= 0.02


def test_tensorrt_absent_writes_the_script_and_succeeds_with_a_note(checkpoints, tmp_path):
    """Without TensorRT the export, the TensorRT graph and its build script are the result:
    exit status 0 and a note saying how to build the plan (a `set -e` script goes on)."""
    if tensorrt_available():
        pytest.skip("TensorRT is installed here")
    from engine.cli import main
    from engine.errors import ExportError
    from export.tensorrt import export_tensorrt

    export_model(checkpoints["opensearch"], tmp_path / "o", tensorrt_graph=True, log=lambda m: None)
    notes = []
    info = export_tensorrt(tmp_path / "o", "fp16", log=notes.append)
    assert info["plan"] is None and info["build_script"] == "build_tensorrt.sh"
    assert any(
        n.startswith("note: TensorRT is not installed in this Python environment")
        and "build_tensorrt.sh" in n
        for n in notes
    ), notes
    assert (tmp_path / "o" / "build_tensorrt.sh").is_file() and (tmp_path / "o" / "model.trt.onnx").is_file()
    assert (
        main(
            [
                "export",
                "--model",
                str(checkpoints["opensearch"]),
                "--out",
                str(tmp_path / "cli"),
                "--precision",
                "fp16",
                "--tensorrt",
                "-q",
            ]
        )
        == 0
    )
    assert (tmp_path / "cli" / "build_tensorrt.sh").is_file()
    with pytest.raises(ExportError, match="Q/DQ"):
        export_tensorrt(tmp_path / "o", "int8", log=lambda m: None)


def test_io_binding_gives_the_plain_run_s_outputs(exported):
    """The CUDA path's IO binding (inputs copied once, outputs bound to the host), run here
    on the CPU provider: the same outputs as a plain session.run."""
    from engine.backends.onnxruntime import OnnxRuntimeBackend
    from engine.pruner import Pruner

    plain = Pruner.load(exported["xprovence"], threads=1)
    bound = Pruner.load(exported["xprovence"], threads=1)
    bound.backend = OnnxRuntimeBackend(
        exported["xprovence"] / "model.onnx", intra_op_threads=1, io_binding=True
    )
    assert bound.backend.io_binding and "IO binding" in bound.backend.describe()
    passages = ["The stadium was built in 1923. It holds 80,000 people.", "Paris is in France. " * 40]
    a, b = plain.prune("When was it built?", passages), bound.prune("When was it built?", passages)
    for x, y in zip(a, b):
        assert x.reranking_score == pytest.approx(y.reranking_score, abs=1e-6)
        np.testing.assert_allclose(
            [s.probability for s in x.sentences], [s.probability for s in y.sentences], atol=1e-6
        )


def test_cuda_without_onnxruntime_gpu_is_a_clear_error(exported):
    from engine.errors import ModelLoadError
    from engine.pruner import Pruner

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider (tests/inprocess/test_gpu.py runs there)")
    with pytest.raises(
        ModelLoadError, match=r"device='cuda' needs ONNX Runtime's CUDA provider: pip install"
    ):
        Pruner.load(exported["xprovence"], device="cuda")
    with pytest.raises(ModelLoadError, match="device must be one of"):
        Pruner.load(exported["xprovence"], device="tpu")
    with pytest.raises(ModelLoadError, match="TensorRT provider needs device='cuda'"):
        Pruner.load(exported["xprovence"], tensorrt=True)


@pytest.mark.parametrize("family", ["xprovence", "opensearch"])
def test_torch_half_precision_and_sdpa_stay_near_the_fp32_reference(checkpoints, family):
    """The GPU reference users run today (torch in bfloat16, SDPA attention), here on CPU:
    SDPA in fp32 within 1e-5 of eager, bfloat16 within 3e-2, same kept sentences where the
    probabilities are not within 3e-2 of the threshold."""
    ref = Pruner.load(checkpoints[family], backend="torch", threads=1)
    sdpa = Pruner.load(checkpoints[family], backend="torch", threads=1, attn="sdpa")
    bf16 = Pruner.load(checkpoints[family], backend="torch", threads=1, dtype="bfloat16")
    assert "bfloat16" in bf16.describe()
    impl = {
        m.config._attn_implementation
        for m in sdpa.backend.model.modules()
        if hasattr(getattr(m, "config", None), "_attn_implementation")
    }
    assert impl == {"sdpa"}
    a, b, c = (p.prune(QUESTION, PASSAGES) for p in (ref, sdpa, bf16))
    for x, y, z in zip(a, b, c):
        px = np.array([s.probability for s in x.sentences])
        np.testing.assert_allclose(px, [s.probability for s in y.sentences], atol=1e-5)
        pz = np.array([s.probability for s in z.sentences])
        np.testing.assert_allclose(px, pz, atol=3e-2)
        clear = np.abs(px - x.threshold) > 3e-2
        assert (
            np.array([s.kept for s in x.sentences])[clear] == np.array([s.kept for s in z.sentences])[clear]
        ).all()


def test_torch_options_are_checked(checkpoints):
    from engine.errors import InputError

    with pytest.raises(InputError, match="dtype must be"):
        Pruner.load(checkpoints["opensearch"], backend="torch", dtype="int4")
    with pytest.raises(InputError, match="attn must be"):
        Pruner.load(checkpoints["opensearch"], backend="torch", attn="flash")


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_int8_answer_does_not_depend_on_concurrent_calls(variants, name):
    """Dynamic INT8 scales each batch, so an answer could move with its batch company. In
    process a call is batched alone: one INT8 Pruner shared by 4 threads, each call sent
    many times in a shuffled order, gives every call exactly (bit for bit) its answer when
    sent alone. (Triton's dynamic batcher does mix requests: docs/performance.md.)"""
    import random
    from concurrent.futures import ThreadPoolExecutor

    pruner = Pruner.load(variants[name, "int8"], threads=1)
    calls = [
        (QUESTION, PASSAGES),
        (QUESTION, PASSAGES[:1]),
        ("Who wrote it?", PASSAGES[::-1]),
        (QUESTION, [PASSAGES[-1] * 3]),
    ]

    def answer(i):
        q, ps = calls[i]
        return i, [
            (r.pruned_context, [s.probability for s in r.sentences], r.reranking_score)
            for r in pruner.prune(q, ps)
        ]

    alone = {i: answer(i)[1] for i in range(len(calls))}
    order = [i for i in range(len(calls)) for _ in range(6)]
    random.Random(0).shuffle(order)
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(answer, order))
    differing = [i for i, got in together if got != alone[i]]
    assert not differing, f"{len(differing)} of {len(together)} concurrent answers differ from the call alone"


@pytest.mark.parametrize("external_data", ["never", "always"])
def test_auto_int8_from_the_fp32_export_or_exported_again_when_its_weights_lie_apart(
    checkpoints, tmp_path, external_data
):
    """`--precision auto` quantizes its INT8 candidate from its fp32 export's graph; a graph
    whose weights lie apart (over 2 GB, or asked) is exported at int8 again instead. Either
    way the candidate is gated against fp32."""
    from engine.machine.cpu import CpuKind
    from export.auto import choose_precision

    messages: list[str] = []
    choose_precision(
        checkpoints["embedding"],
        tmp_path / "auto",
        export_args={"external_data": external_data},
        progress=False,
        log=messages.append,
        cpu=CpuKind(frozenset()),
    )
    assert any("quantizing int8" in m for m in messages) == (external_data == "never"), messages
    assert any(m.startswith("auto: int8: ") and "the gate" in m for m in messages), messages


def test_int8_from_an_fp32_export_is_the_exporters_int8_graph(checkpoints, tmp_path):
    """export.auto.int8_from: the same dynamic INT8 graph `export_model(precision="int8")`
    writes, from the fp32 export's optimized graph, without tracing the checkpoint again."""
    import json

    from export.auto import int8_from

    export_model(checkpoints["embedding"], tmp_path / "fp32", log=lambda m: None)
    export_model(checkpoints["embedding"], tmp_path / "exported", precision="int8", log=lambda m: None)
    made = int8_from(tmp_path / "fp32", tmp_path / "int8", {})
    manifest = json.loads((made / "manifest.json").read_text())
    assert manifest["precision"] == "int8" and "verification" not in manifest
    ops = [n.op_type for n in onnx.load(str(made / "model.onnx")).graph.node]
    assert ops == [n.op_type for n in onnx.load(str(tmp_path / "exported" / "model.onnx")).graph.node]
    a = Pruner.load(made, threads=1).prune(QUESTION, PASSAGES)
    b = Pruner.load(tmp_path / "exported", threads=1).prune(QUESTION, PASSAGES)
    for x, y in zip(a, b):
        assert [s.probability for s in x.sentences] == pytest.approx(
            [s.probability for s in y.sentences], abs=1e-6
        )
