"""OpenVINO against ONNX Runtime on the engine's own batches (#37): model-only time of every
runtime x precision on identical padded batches of RAG calls, interleaved, medians.

    python -m benchmarks.openvino_speed --data ../shared/data/squad-dev-rag.jsonl --queries 6 \\
        --out benchmarks/results/openvino-speed

Variants: ONNX Runtime fp32 and the export's dynamic INT8; OpenVINO fp32 (f32 inference of
the same fp32 graph), bf16 inference where the CPU has it, and the NNCF static INT8 export
(`prune export --precision ov-int8`, its default settings), made here from the fp32 export.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from engine.tools.harness import Study, interleave, medians, model_passes, parser, stderr


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, repeats=3)
    ap.add_argument("--data", required=True, help="RAG JSONL (question, passages)")
    ap.add_argument("--queries", type=int, default=6)
    ap.add_argument("--model", help="an fp32 export (default: the default model's)")
    ap.add_argument("--int8", help="its dynamic INT8 export (default: the default model's)")
    args = ap.parse_args(argv)
    from engine.backends.openvino import bf16_supported
    from engine.runtime.default_model import ensure_default_model
    from engine.pruner import Pruner
    from engine.tools.measure import workload_batches
    from engine.tools.quality import load_rag_data
    from export.openvino import quantize
    study = Study("openvino-speed", "benchmarks.openvino_speed", argv)
    fp32 = Path(args.model) if args.model else ensure_default_model(stderr, precision="fp32")
    int8 = Path(args.int8) if args.int8 else ensure_default_model(stderr, precision="int8")
    queries = load_rag_data(args.data, args.queries)
    with tempfile.TemporaryDirectory(prefix="prune-ov-") as tmp:
        ov_int8 = Path(tmp) / "ov-int8"
        quantize(fp32, ov_int8, log=stderr)
        pruners = {"onnxruntime fp32": Pruner.load(fp32, threads=args.threads),
                   "onnxruntime int8 (dynamic)": Pruner.load(int8, threads=args.threads),
                   "openvino fp32": Pruner.load(fp32, backend="openvino", threads=args.threads)}
        if bf16_supported():
            pruners["openvino bf16 inference"] = Pruner.load(fp32, backend="openvino", precision="bf16",
                                                             threads=args.threads)
        else:
            stderr("openvino bf16: this CPU has no native bf16 (avx512_bf16 / amx_bf16): not measured")
        pruners["openvino int8 (NNCF static)"] = Pruner.load(ov_int8, threads=args.threads)
        batches = workload_batches(pruners["onnxruntime fp32"], queries)
        tokens = sum(int(b.attention_mask.sum()) for b in batches)
        times = interleave(model_passes(pruners, batches), args.repeats, warmup=True)
    med = medians(times)
    base = med["onnxruntime fp32"]
    rows = [{"variant": k, "seconds_median": med[k], "seconds": t, "tokens_per_s": tokens / med[k],
             "speed_vs_ort_fp32": base / med[k]} for k, t in times.items()]
    lines = study.header(f"OpenVINO against ONNX Runtime, {len(batches)} batches, {tokens} real tokens",
                         f"CPU flags: {', '.join(study.machine.get('cpu_flags', [])) or '-'}; medians of "
                         f"{args.repeats} interleaved passes after a warm-up pass.")
    lines += ["| runtime, precision | seconds (median) | real tokens/s | speed vs ORT fp32 |", "|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['seconds_median']:.2f} | {r['tokens_per_s']:.0f} | "
              f"{r['speed_vs_ort_fp32']:.2f}x |" for r in rows]
    study.write(args.out, {"batches": len(batches), "tokens": tokens, "rows": rows}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
