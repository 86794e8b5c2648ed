"""ONNX Runtime's fused SkipLayerNormalization against Add + LayerNormalization on the CPU
provider (#26): why the CPU graphs split the fusion back (export.optimize.unfuse_skip_layer_norm).

    python -m benchmarks.layer_norm [--rows 30000] [--hidden 384] [--threads 2] [--repeats 10] [--out DIR]

One residual add and layer norm of a rows x hidden float32 activation (30,000 x 384: the
tokens of a few RAG calls through the default model), each way, after a warm-up round;
the two interleaved over the repeats, medians.
"""
from __future__ import annotations

import numpy as np

from engine.tools.harness import Study, interleave, medians, parser


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
    p = parser(__doc__, out="benchmarks/results/layer-norm", repeats=10)
    p.add_argument("--rows", type=int, default=30000)
    p.add_argument("--hidden", type=int, default=384)
    args = p.parse_args(argv)
    from engine.tools.limits import cpu_session
    study = Study("layer-norm", "benchmarks.layer_norm", argv)
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal((args.rows, args.hidden), dtype=np.float32) for n in ("x", "skip")}
    kinds = ("SkipLayerNormalization", "Add + LayerNormalization")
    sessions = {kind: cpu_session(graph(kind, args.rows, args.hidden), args.threads or 0) for kind in kinds}
    outs = {kind: s.run(None, feed)[0] for kind, s in sessions.items()}
    times = interleave({kind: (lambda s=s: s.run(None, feed) and None) for kind, s in sessions.items()},
                       args.repeats, warmup=True)
    med = medians(times)
    diff = float(np.abs(outs[kinds[0]] - outs[kinds[1]]).max())
    lines = study.header(f"SkipLayerNormalization against Add + LayerNormalization, {args.rows} x {args.hidden}",
                         f"Threads {args.threads or 'all'}; medians of {args.repeats} interleaved rounds.")
    lines += ["| graph | ms (median) | G elements/s |", "|---|---|---|"]
    lines += [f"| {k} | {1000 * t:.1f} | {args.rows * args.hidden / t / 1e9:.2f} |" for k, t in med.items()]
    lines += ["", f"max |difference| of the outputs: {diff:.2e}"]
    study.write(args.out, {"rows": args.rows, "hidden": args.hidden, "threads": args.threads, "seconds": times,
                           "median_seconds": med, "max_abs_difference": diff}, lines)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
