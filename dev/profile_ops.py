"""ONNX Runtime's per-operator profile of the engine's graphs on the RAG workload (#26):
where the time goes, before any change to the INT8 path.

    python -m dev.profile_ops --rag tests/data/squad-dev-rag.jsonl \\
        --out benchmarks/results/profile-ops

Models: the default model (fp32 and its dynamic INT8 export), and two test checkpoints at
the width of the big families with 2 layers (per-layer shares do not depend on the depth):
Provence-width (DeBERTa-v3, hidden 1024, 16 heads, FFN 4096) and XProvence-width (XLM-R,
the same), each exported fp32 and INT8. Each runs the padded batches the engine builds
for the first --queries RAG calls (one warm-up pass, then one profiled pass) with the
CPU provider; the profile's node events are summed by operator type. Reported: the top
operators' share of node time, and the share of time in quantized products (MatMulInteger,
DynamicQuantize*) against float products (MatMul, FusedMatMul, Gemm, Attention).
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from engine.pipeline.spec import Manifest
from engine.bench.harness import Study, parser

WIDE = {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 16, "intermediate_size": 4096}
QUANTIZED = (
    "MatMulInteger",
    "DynamicQuantizeLinear",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "QAttention",
)
FLOAT_PRODUCTS = ("MatMul", "FusedMatMul", "Gemm", "Attention")


def profile(folder: Path, batches, threads: int | None, timed_passes: int = 0) -> dict:
    """Sum of node time per operator type over one profiled pass of `batches`; with
    `timed_passes`, also the median wall time of that many plain passes (`wall_s`)."""
    import onnxruntime as ort

    manifest = Manifest.read(folder)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    with tempfile.TemporaryDirectory() as tmp:
        plain = ort.InferenceSession(
            str(folder / manifest.graph), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        names = [i.name for i in plain.get_inputs()]
        feeds = [{n: getattr(b, n) for n in names} for b in batches]
        for f in feeds:  # warm-up (without profiling)
            plain.run(None, f)
        walls = []
        for _ in range(timed_passes):
            t = time.perf_counter()
            for f in feeds:
                plain.run(None, f)
            walls.append(time.perf_counter() - t)
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "prof")
        sess = ort.InferenceSession(
            str(folder / manifest.graph), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        for f in feeds:
            sess.run(None, f)
        events = json.loads(Path(sess.end_profiling()).read_text())
    by_op: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"]
    total = sum(by_op.values())
    out = {"total_node_ms": total / 1000, "ops": {k: v / total for k, v in by_op.most_common()}}
    if walls:
        out["wall_s"] = statistics.median(walls)
    return out


def limit_share(folder: Path, batches, wall_s: float, gemm: dict) -> dict:
    """The dense arithmetic of `batches` (engine.bench.limits) over the plain pass's time,
    as a share of this machine's matching GEMM rate."""
    from engine.bench.limits import graph_work, workload_flops

    manifest = Manifest.read(folder)
    work = graph_work(folder / manifest.graph)
    flops = workload_flops([b.input_ids.shape for b in batches], work, int(manifest.source.hidden_size))
    int8 = manifest.precision == "int8"
    achieved = flops / wall_s / 1e9
    return {
        "achieved_gflops": achieved,
        "limit_share": achieved / gemm["int8_gops" if int8 else "fp32_gflops"],
        "limit": "int8" if int8 else "fp32",
    }


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, repeats=3)  # --repeats: plain passes timed for the share of the limit (0: none)
    ap.add_argument("--rag", required=True, help="RAG JSONL (question, passages)")
    ap.add_argument("--queries", type=int, default=10)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args(argv)
    study = Study("profile", "dev.profile_ops", argv)
    from engine.models.default_model import ensure_default_model
    from engine.measuring import workload_batches
    from engine.pruner import Pruner
    from engine.datafiles import load_rag_data
    from export.checkpoints import make_test_checkpoint
    from export.onnx import export_model

    rag = load_rag_data(args.rag, args.queries)
    models = {
        "default fp32": ensure_default_model(precision="fp32"),
        "default int8": ensure_default_model(precision="int8"),
    }
    work = Path(tempfile.mkdtemp(prefix="prune-profile-"))
    for family, label in (("provence", "Provence-width"), ("xprovence", "XProvence-width")):
        ck = make_test_checkpoint(family, work / family, sizes=WIDE)
        for precision in ("fp32", "int8"):
            out = work / f"{family}-{precision}"
            print(f"exporting {label} {precision} ...", file=sys.stderr, flush=True)
            export_model(ck, out, precision=precision, verify=False, log=lambda m: None)
            models[f"{label} {precision}"] = out
    report: dict = {"queries": len(rag), "models": {}}
    if args.repeats:
        from engine.bench.limits import gemm_rates

        report["gemm"] = gemm_rates(args.threads)
    for name, folder in models.items():
        pruner = Pruner.load(folder, threads=1)
        batches = workload_batches(pruner, rag)
        print(f"profiling {name}: {len(batches)} batches ...", file=sys.stderr, flush=True)
        prof = profile(Path(folder), batches, args.threads, args.repeats)
        if args.repeats:
            prof.update(limit_share(Path(folder), batches, prof["wall_s"], report["gemm"]))
        prof["batches"] = len(batches)
        prof["tokens_padded"] = int(sum(b.input_ids.size for b in batches))
        prof["quantized_products_share"] = sum(v for k, v in prof["ops"].items() if k in QUANTIZED)
        prof["float_products_share"] = sum(v for k, v in prof["ops"].items() if k in FLOAT_PRODUCTS)
        report["models"][name] = prof
    lines = study.header(
        "Where the model's time goes, by operator",
        f"The engine's padded batches of {len(rag)} "
        "RAG calls, one warm-up pass, one profiled pass; share of node time by operator type.",
    )
    if "gemm" in report:
        g = report["gemm"]
        lines += [
            f"Share of the limit: the graph's dense arithmetic over the median of {args.repeats} plain "
            f"passes, against this run's GEMM rates (fp32 MatMul {g['fp32_gflops']:.0f} GFLOP/s, int8 "
            f"MatMulInteger {g['int8_gops']:.0f} GOP/s; engine/bench/limits.py).",
            "",
        ]
    lines += [
        "| model | node ms | plain pass s | share of the limit | float products | quantized products "
        "(incl. activation quantization) | top operators |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, p in report["models"].items():
        top = ", ".join(f"{k} {100 * v:.0f}%" for k, v in list(p["ops"].items())[: args.top])
        share = (
            f"{100 * p['limit_share']:.0f}% of {p['limit']} ({p['achieved_gflops']:.0f} G/s)"
            if "limit_share" in p
            else "-"
        )
        wall = f"{p['wall_s']:.2f}" if "wall_s" in p else "-"
        lines.append(
            f"| {name} | {p['total_node_ms']:.0f} | {wall} | {share} | {100 * p['float_products_share']:.0f}% | "
            f"{100 * p['quantized_products_share']:.0f}% | {top} |"
        )
    study.write(args.out, report, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
