"""ONNX Runtime's fused SkipLayerNormalization against Add + LayerNormalization on the CPU
provider (#26): why the CPU graphs split the fusion back (export.optimize.unfuse_skip_layer_norm).

    python -m benchmarks.layer_norm [--rows 30000] [--hidden 384] [--threads 2] [--repeats 10]

One residual add and layer norm of a rows x hidden float32 activation (30,000 x 384: the
tokens of a few RAG calls through the default model), each way, after warm-up; medians.
"""
from __future__ import annotations

import argparse
import os
import platform

import numpy as np


def graph(kind: str, rows: int, hidden: int):
    from onnx import TensorProto, helper, numpy_helper
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [rows, hidden]) for n in ("x", "skip", "y")]
    rng = np.random.default_rng(1)          # the same weights for both graphs
    weights = [numpy_helper.from_array(rng.random(hidden, dtype=np.float32), n) for n in ("gamma", "beta", "bias")]
    if kind == "SkipLayerNormalization":
        nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"], ["y"],
                                  domain="com.microsoft", epsilon=1e-12)]
    else:
        nodes = [helper.make_node("Add", ["x", "skip"], ["s0"]), helper.make_node("Add", ["s0", "bias"], ["s"]),
                 helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12)]
    return helper.make_model(helper.make_graph(nodes, kind, io[:2], io[2:], weights),
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=30000)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: all cores)")
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    import onnxruntime as ort
    from engine.tools.limits import cpu_session, median_run_seconds
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal((args.rows, args.hidden), dtype=np.float32) for n in ("x", "skip")}
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}; "
          f"{args.rows} x {args.hidden}, threads {args.threads or 'all'}, median of {args.repeats}")
    outs = {}
    for kind in ("SkipLayerNormalization", "Add + LayerNormalization"):
        session = cpu_session(graph(kind, args.rows, args.hidden), args.threads)
        outs[kind] = session.run(None, feed)[0]
        ms = median_run_seconds(session, feed, args.repeats) * 1000
        print(f"| {kind} | {ms:.1f} ms | {args.rows * args.hidden / ms / 1e6:.2f} G elements/s |")
    diff = float(np.abs(outs["SkipLayerNormalization"] - outs["Add + LayerNormalization"]).max())
    print(f"max |difference| of the outputs: {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
