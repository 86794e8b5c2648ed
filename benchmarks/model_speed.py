"""Model-only speed of precision variants, side by side on identical batches.

    python -m benchmarks.model_speed --model default --data ../shared/data/squad-dev-rag.jsonl \\
        --queries 10 --repeats 5 --out benchmarks/results/model-speed

Every variant runs the same padded batches (the engine's own batching of the first N
queries); rounds are interleaved so drift hits all variants alike; medians are reported.
"""
from __future__ import annotations

import argparse
import json
import statistics
import shlex
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.precision_choice import INT8_VARIANTS
from engine.tools.quality import load_rag_data
from engine.tools.measure import machine_info
from engine.pruner import Pruner
from engine.text import split_sentences
from export.onnx import export_model

VARIANTS = [("fp32", dict(precision="fp32")), *INT8_VARIANTS]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint folder, or 'default'")
    ap.add_argument("--data", required=True)
    ap.add_argument("--queries", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.model == "default":
        from engine.default_model import default_checkpoint
        args.model = default_checkpoint()
    queries = load_rag_data(args.data, args.queries)
    times: dict[str, list[float]] = {name: [] for name, _ in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        pruners = {}
        for k, (name, kw) in enumerate(VARIANTS, 1):
            folder = Path(tmp) / name.replace(" ", "_")
            print(f"exporting {name} ({k}/{len(VARIANTS)}) ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            export_model(args.model, folder, log=lambda m: None, **kw)
            print(f"  exported {name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
            pruners[name] = Pruner.load(folder, threads=args.threads)
        first = pruners["fp32"]
        batches = []
        for q in queries:
            spans = [split_sentences(p) for p in q.passages]
            batches += first.batches(first.encode(q.question, q.passages, spans))
        tokens = sum(int(b.attention_mask.sum()) for b in batches)
        for p in pruners.values():  # warm-up
            p.backend.infer(batches[0])
        print(f"{len(batches)} batches, {tokens} tokens; {args.repeats} interleaved rounds of "
              f"{len(pruners)} variants", file=sys.stderr, flush=True)
        for r in range(args.repeats):
            print(f"round {r + 1}/{args.repeats}", file=sys.stderr, flush=True)
            for name, p in pruners.items():
                t0 = time.perf_counter()
                for b in batches:
                    p.backend.infer(b)
                times[name].append(time.perf_counter() - t0)
                print(f"{name}: {times[name][-1]:.2f} s", file=sys.stderr, flush=True)
    base = statistics.median(times["fp32"])
    rows = [{"variant": n, "seconds_median": statistics.median(t), "seconds": t,
             "tokens_per_s": tokens / statistics.median(t), "speedup_vs_fp32": base / statistics.median(t)}
            for n, t in times.items()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "-m", "benchmarks.model_speed", *sys.argv[1:]])
    meta = {"machine": machine_info(), "batches": len(batches), "tokens": tokens, "command": command,
            "threads": args.threads, "repeats": args.repeats}
    (out / "model-speed.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [f"# Model-only speed, {len(batches)} batches, {tokens} real tokens", "", "```", command, "```", "",
             f"Machine: {meta['machine'].get('cpu_model')}, {meta['machine']['cpus']} CPUs, onnxruntime "
             f"{meta['machine']['onnxruntime']}; medians of {args.repeats} interleaved rounds.", "",
             "| variant | seconds (median) | real tokens/s | speed vs fp32 |", "|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['seconds_median']:.2f} | {r['tokens_per_s']:.0f} | {r['speedup_vs_fp32']:.2f}x |"
              for r in rows]
    (out / "model-speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
