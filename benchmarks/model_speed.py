"""Model-only speed of precision variants, side by side on identical batches.

    python -m benchmarks.model_speed --model default --data ../shared/data/squad-dev-rag.jsonl \\
        --queries 10 --repeats 5 --out benchmarks/results/model-speed

Every variant runs the same padded batches (the engine's own batching of the first N
queries); rounds are interleaved so drift hits all variants alike; medians are reported.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks.precision_choice import INT8_VARIANTS
from engine.pruner import Pruner
from engine.core.text import split_sentences
from engine.tools.harness import checkpoint_of, Study, interleave, medians, model_passes, parser, stderr
from engine.tools.quality import load_rag_data
from export.onnx import export_model

VARIANTS = [("fp32", dict(precision="fp32")), *INT8_VARIANTS]


def main(argv=None) -> int:
    ap = parser(__doc__, repeats=5, checkpoint=True, data="RAG JSONL (question, passages)")
    ap.add_argument("--queries", type=int, default=10)
    args = ap.parse_args(argv)
    study = Study("model-speed", "benchmarks.model_speed", argv)
    queries = load_rag_data(args.data, args.queries)
    args.model = checkpoint_of(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        pruners = {}
        for k, (name, kw) in enumerate(VARIANTS, 1):
            folder = Path(tmp) / name.replace(" ", "_")
            stderr(f"exporting {name} ({k}/{len(VARIANTS)}) ...")
            t0 = time.perf_counter()
            export_model(args.model, folder, log=lambda m: None, **kw)
            stderr(f"  exported {name} in {time.perf_counter() - t0:.1f} s")
            pruners[name] = Pruner.load(folder, threads=args.threads)
        first = pruners["fp32"]
        batches = []
        for q in queries:
            spans = [split_sentences(p) for p in q.passages]
            batches += first.batches(first.encode(q.question, q.passages, spans))
        tokens = sum(int(b.attention_mask.sum()) for b in batches)
        stderr(f"{len(batches)} batches, {tokens} tokens; {args.repeats} interleaved rounds of {len(pruners)} variants")
        times = interleave(model_passes(pruners, batches), args.repeats, warmup=True)
    med = medians(times)
    rows = [{"variant": n, "seconds_median": med[n], "seconds": t, "tokens_per_s": tokens / med[n],
             "speedup_vs_fp32": med["fp32"] / med[n]} for n, t in times.items()]
    lines = study.header(f"Model-only speed, {len(batches)} batches, {tokens} real tokens",
                         f"Medians of {args.repeats} interleaved rounds after one warm-up round.")
    lines += ["| variant | seconds (median) | real tokens/s | speed vs fp32 |", "|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['seconds_median']:.2f} | {r['tokens_per_s']:.0f} | {r['speedup_vs_fp32']:.2f}x |"
              for r in rows]
    study.write(args.out, {"batches": len(batches), "tokens": tokens, "threads": args.threads,
                           "repeats": args.repeats, "rows": rows}, lines)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
