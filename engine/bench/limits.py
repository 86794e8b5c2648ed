"""The machine's limit for `prune bench` (#26): how fast ONNX Runtime multiplies matrices
here, and how much arithmetic a model's graph does per token, so that every path can be
reported as a share of what the hardware allows.

- GEMM rates: one MatMul (float32) and one MatMulInteger (uint8 x int8 -> int32, what
  dynamic INT8 quantization runs) of a workload-sized shape (4096 x 384 by 384 x 1536
  by default: a batch of tokens through a feed-forward layer of the default model), timed
  with the bench's threads after warm-up; the median of several runs. With OpenVINO
  (`openvino_gemm_rates`) the same product there too: f32, bf16 inference where the CPU
  computes bf16, and int8 (a QuantizeLinear/DequantizeLinear MatMul, which OpenVINO runs
  as u8 x i8, as its static INT8 export). The machine's limit for an arithmetic type is
  the fastest rate any runtime reached.
- Work per token, read from the graph itself: every matrix product with a weight
  (MatMul, MatMulInteger, Gemm, FusedMatMul, DynamicQuantizeMatMul, the input projection
  of Attention and QAttention) counts 2 x K x N per token; every product of two
  activations (attention's QK^T and AV, DeBERTa's position terms, in-graph pooling)
  counts 2 x L x hidden per token at the padded length L of its batch. The count is an estimate of the dense
  arithmetic (it leaves out softmax, layer norm, GELU and the like).
- A path's achieved rate: the work of the padded batches it sent over its median time.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

WEIGHT_OPS = {
    "MatMul",
    "MatMulInteger",
    "Gemm",
    "FusedMatMul",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "QLinearMatMul",
}
#: fused attention (fp32, and the INT8 export's): the input projection is the weight (input 1)
ATTENTION_OPS = {"Attention", "QAttention"}


def cpu_session(model, threads: int | None):
    """An ONNX Runtime CPU session of an in-memory model; `threads` intra-op (None or 0: all cores)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = int(threads)
    return ort.InferenceSession(
        model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"]
    )


def gemm_rates(
    threads: int | None = None, m: int = 4096, k: int = 384, n: int = 1536, runs: int = 7
) -> dict[str, Any]:
    """ONNX Runtime's fp32 MatMul and int8 MatMulInteger rates on this CPU (GFLOP/s, GOP/s)."""
    out: dict[str, Any] = {"shape": [m, k, n], "threads": threads}
    for key, kind in (("fp32_gflops", "fp32"), ("int8_gops", "int8")):
        model, a = _gemm_graph(kind, m, k, n)
        out[key] = 2.0 * m * k * n / median_run_seconds(cpu_session(model, threads), {"a": a}, runs) / 1e9
    return out


def _gemm_graph(kind: str, m: int, k: int, n: int):
    """A one-product ONNX model a[m, k] @ b[k, n]: "fp32" MatMul, "int8" MatMulInteger
    (uint8 input), or "qdq" (float input through QuantizeLinear/DequantizeLinear, int8
    weight through DequantizeLinear: static INT8 as OpenVINO reads it); with its input."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    b = rng.standard_normal((k, n), dtype=np.float32)
    scalar = numpy_helper.from_array
    if kind == "fp32":
        a, a_type, y_type = (
            rng.standard_normal((m, k), dtype=np.float32),
            TensorProto.FLOAT,
            TensorProto.FLOAT,
        )
        nodes, init = [helper.make_node("MatMul", ["a", "b"], ["y"])], [scalar(b, "b")]
    elif kind == "int8":
        a, a_type, y_type = rng.integers(0, 255, (m, k), dtype=np.uint8), TensorProto.UINT8, TensorProto.INT32
        nodes = [helper.make_node("MatMulInteger", ["a", "b"], ["y"])]
        init = [scalar(rng.integers(-127, 127, (k, n), dtype=np.int8), "b")]
    else:
        a, a_type, y_type = (
            rng.standard_normal((m, k), dtype=np.float32),
            TensorProto.FLOAT,
            TensorProto.FLOAT,
        )
        nodes = [
            helper.make_node("QuantizeLinear", ["a", "sa", "za"], ["aq"]),
            helper.make_node("DequantizeLinear", ["aq", "sa", "za"], ["ad"]),
            helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"]),
            helper.make_node("MatMul", ["ad", "bd"], ["y"]),
        ]
        init = [
            scalar(np.array(0.03, np.float32), "sa"),
            scalar(np.array(128, np.uint8), "za"),
            scalar(np.clip(np.round(b / 0.03), -127, 127).astype(np.int8), "bq"),
            scalar(np.array(0.03, np.float32), "sb"),
            scalar(np.array(0, np.int8), "zb"),
        ]
    graph = helper.make_graph(
        nodes,
        "gemm",
        [helper.make_tensor_value_info("a", a_type, [m, k])],
        [helper.make_tensor_value_info("y", y_type, [m, n])],
        initializer=init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, a


def openvino_gemm_rates(
    threads: int | None = None, m: int = 4096, k: int = 384, n: int = 1536, runs: int = 7
) -> dict[str, Any]:
    """OpenVINO's CPU plugin on the same product: f32, bf16 inference (where the CPU
    computes bf16) and static int8 (GFLOP/s, GOP/s), one stream of `threads` threads."""
    import tempfile

    from engine.backends.openvino import bf16_supported, openvino_instance

    ov = openvino_instance()
    out: dict[str, Any] = {}
    cases = [("fp32_gflops", "fp32", "f32"), ("int8_gops", "qdq", "f32")]
    if bf16_supported(ov):
        cases.insert(1, ("bf16_gflops", "fp32", "bf16"))
    for key, kind, hint in cases:
        model, a = _gemm_graph(kind, m, k, n)
        config: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": hint,
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": 1,
        }
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        with tempfile.TemporaryDirectory(prefix="prune-gemm-") as tmp:
            path = Path(tmp) / "gemm.onnx"
            path.write_bytes(model.SerializeToString())
            request = ov.compile_model(ov.read_model(str(path)), "CPU", config).create_infer_request()

        class _Run:  # median_run_seconds's session interface
            def run(self, _outputs, feed):
                request.infer(feed)

        out[key] = 2.0 * m * k * n / median_run_seconds(_Run(), {0: a}, runs) / 1e9
    return out


def median_run_seconds(session, feed: dict[str, Any], runs: int = 7, warmup: int = 3) -> float:
    """The median wall time of `session.run` on `feed`, after `warmup` runs."""
    for _ in range(warmup):
        session.run(None, feed)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def graph_work(graph: str | Path) -> dict[str, float]:
    """{"linear_flops_per_token", "activation_products"} of an ONNX graph (see the module
    docstring); external weights are not read, only their shapes."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    # weights reached through a DequantizeLinear / Transpose / Cast of an initializer count too
    via = {
        n.output[0]: n.input[0]
        for n in model.graph.node
        if n.op_type in ("DequantizeLinear", "Transpose", "Cast") and n.input and n.input[0] in dims
    }

    def matrix(name: str) -> list[int] | None:
        shape = dims.get(name) or dims.get(via.get(name, ""))
        return shape if shape is not None and len(shape) == 2 else None

    linear, products = 0.0, 0
    for node in model.graph.node:
        if node.op_type in WEIGHT_OPS or node.op_type in ATTENTION_OPS:
            weight = next((w for w in (matrix(i) for i in list(node.input)[1:3]) if w), None)
            if weight is not None:
                kk, nn = weight
                if node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute):
                    kk, nn = nn, kk
                linear += 2.0 * kk * nn
                if node.op_type in ATTENTION_OPS:
                    products += 2  # its QK^T and AV
            elif node.op_type in ("MatMul", "FusedMatMul"):
                products += 1
    return {"linear_flops_per_token": linear, "activation_products": float(products)}


def workload_flops(shapes: Iterable[tuple[int, int]], work: dict[str, float], hidden: int) -> float:
    """The dense arithmetic of the padded batches sent, given as their (rows B, padded
    length L) shapes."""
    total = 0.0
    for rows, length in shapes:
        total += (
            rows
            * length
            * (work["linear_flops_per_token"] + work["activation_products"] * 2.0 * length * hidden)
        )
    return total
