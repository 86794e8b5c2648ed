"""Does ONNX Runtime give memory back after a large batch? RSS and speed of three CPU
allocator settings, each in its own process:

- arena: ORT's default CPU arena (grows to the largest batch seen and keeps it);
- arena+shrink: the arena, shrunk after every run (RunOptions
  `memory.enable_memory_arena_shrinkage = cpu:0`);
- no-arena: `SessionOptions.enable_cpu_mem_arena = False` (plain malloc/free);
- arena+shrink-large: what the engine does (`PRUNE_ORT_ARENA=shrink`, its default): the
  arena shrunk after a batch of more than `SHRINK_ABOVE_TOKENS` padded tokens only
  (engine.backends.onnxruntime.ArenaRuns).

    python -m benchmarks.memory --model ~/.cache/prune-engine/all-minilm-l6-v2-0.1.0-int8 \
        --out benchmarks/results/memory

Each process loads the graph, runs small batches (8 x 128 tokens), one batch of
SHRINK_ABOVE_TOKENS tokens at the longest length (8 x 512: the largest the engine's
default lets the arena keep), one large batch (`--large`, default 32 x 512: the engine's
default token budget), then the small batches again; it reports RSS after each phase and
the median time of a small batch.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from engine.core.spec import Manifest
from engine.tools.harness import Study, parser

VARIANTS = ("arena", "arena+shrink", "no-arena", "arena+shrink-large")


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident set (VmRSS) or its peak (VmHWM), in MB. The peak is read here
    and not from getrusage: a child's ru_maxrss starts at its parent's peak (Linux carries
    the high-water mark over fork and exec), VmHWM belongs to this process's own memory."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def feeds(session, rows: int, length: int, vocab: int):
    import numpy as np
    rng = np.random.default_rng(0)
    values = {"input_ids": rng.integers(5, vocab, size=(rows, length), dtype=np.int64),
              "attention_mask": np.ones((rows, length), dtype=np.int64),
              "sentence_ids": np.tile(np.arange(length, dtype=np.int64) // 16, (rows, 1)),
              "token_type_ids": np.zeros((rows, length), dtype=np.int64)}
    return {i.name: values[i.name] for i in session.get_inputs()}


def measure(model: Path, variant: str, threads: int, large_shape: str) -> dict:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    if variant == "no-arena":
        opts.enable_cpu_mem_arena = False
    from engine.backends.onnxruntime import SHRINK_ABOVE_TOKENS, ArenaRuns
    runs = ArenaRuns(ort, "shrink" if variant.startswith("arena+shrink") else "keep",
                     SHRINK_ABOVE_TOKENS if variant == "arena+shrink-large" else -1)
    session = ort.InferenceSession(str(model / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    manifest = Manifest.read(model)
    vocab = int(manifest.embedding_rows or manifest.data["tokenizer"]["vocab_size"])
    rows, length = (int(x) for x in large_shape.split("x"))
    small, large = feeds(session, 8, 128, vocab), feeds(session, rows, length, vocab)
    kept = feeds(session, SHRINK_ABOVE_TOKENS // 512, 512, vocab)
    out = {"variant": variant, "rss_loaded_mb": rss_mb()}

    def smalls(n=20):
        times = []
        for _ in range(n):
            t = time.perf_counter()
            session.run(None, small, runs(8 * 128))
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1000
    out["small_ms_before"] = smalls()
    out["rss_small_mb"] = rss_mb()
    session.run(None, kept, runs(SHRINK_ABOVE_TOKENS))
    out["rss_threshold_mb"] = rss_mb()
    t = time.perf_counter()
    session.run(None, large, runs(rows * length))
    out["large_ms"] = (time.perf_counter() - t) * 1000
    out["rss_after_large_mb"] = rss_mb()
    out["small_ms_after"] = smalls()
    out["rss_end_mb"] = rss_mb()
    return out


def call_limit(model: Path, shape: str) -> dict:
    """Peak RSS of one in-process call at the per-call character limit: `many` passages of
    the example document, or `one` passage as long as the limit allows."""
    from engine.pruner import MAX_CALL_CHARS, Pruner
    pruner = Pruner.load(str(model))
    text = (Path(__file__).resolve().parents[1] / "examples" / "shepherds-pie.txt").read_text()
    question = "What goes on the bottom of Shepherd's pie?"
    pruner.prune(question, [text])
    before = rss_mb()
    n = (MAX_CALL_CHARS - len(question)) // len(text)
    passages = [text] * n if shape == "many" else [(text * (n + 1))[:MAX_CALL_CHARS - len(question)]]
    t = time.perf_counter()
    pruner.prune(question, passages)
    return {"shape": shape, "passages": len(passages), "chars": len(question) + sum(map(len, passages)),
            "rss_loaded_mb": before, "peak_rss_mb": rss_mb("VmHWM"),
            "rss_after_mb": rss_mb(), "seconds": time.perf_counter() - t}


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, out="benchmarks/results/memory", repeats=3)
    p.add_argument("--model", required=True, help="an exported model folder")
    p.add_argument("--large", default="32x512",
                   help="rows x tokens of the large batch (32x512: the engine's default 16,384-token budget)")
    p.add_argument("--variant", help=argparse.SUPPRESS)      # the child process
    p.add_argument("--call-limit", action="store_true",
                   help="instead: peak RSS of one in-process call at the per-call character limit")
    p.add_argument("--shape", help=argparse.SUPPRESS)        # the call-limit child process
    args = p.parse_args(argv)
    if args.shape:
        print(json.dumps(call_limit(Path(args.model), args.shape)))
        return 0
    study = Study("call-limit" if args.call_limit else "memory", "benchmarks.memory", argv)
    if args.call_limit:
        rows = []
        for shape in ("many", "one"):
            proc = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--model", args.model, "--shape", shape],
                                  capture_output=True, text=True, check=True)
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(rows[-1], file=sys.stderr, flush=True)
        lines = study.header("Peak memory of one call at the per-call character limit")
        lines += ["| call at the limit | passages | characters | RSS loaded MB | peak RSS MB | RSS after MB | seconds |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['shape']} | {r['passages']} | {r['chars']} | {r['rss_loaded_mb']:.0f} | {r['peak_rss_mb']:.0f} "
                  f"| {r['rss_after_mb']:.0f} | {r['seconds']:.1f} |" for r in rows]
        study.write(args.out, {"rows": rows}, lines)
        return 0
    if args.variant:
        print(json.dumps(measure(Path(args.model), args.variant, args.threads or 0, args.large)))
        return 0
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for rep in range(args.repeats):                       # interleaved
        for v in VARIANTS:
            proc = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--model", args.model,
                                   "--threads", str(args.threads or 0), "--large", args.large, "--variant", v],
                                  capture_output=True, text=True, check=True)
            runs[v].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"repeat {rep + 1}/{args.repeats} {v}: {runs[v][-1]}", file=sys.stderr, flush=True)
    keys = ["rss_loaded_mb", "rss_small_mb", "rss_threshold_mb", "rss_after_large_mb", "rss_end_mb", "small_ms_before",
            "small_ms_after", "large_ms"]
    table = {v: {k: statistics.median(r[k] for r in rs) for k in keys} for v, rs in runs.items()}
    from engine.backends.onnxruntime import SHRINK_ABOVE_TOKENS
    lines = study.header(f"ONNX Runtime CPU memory after a large batch ({time.strftime('%Y-%m-%d %H:%M')})",
                         f"Medians of {args.repeats} processes each, the variants interleaved.")
    lines += [f"| allocator | RSS loaded MB | after 8x128 batches | after a {SHRINK_ABOVE_TOKENS // 512}x512 batch "
              f"| after a {args.large} batch | after 8x128 batches again "
              f"| 8x128 batch ms before / after | {args.large} batch ms |", "|---|---|---|---|---|---|---|---|"]
    for v, r in table.items():
        lines.append(f"| {v} | {r['rss_loaded_mb']:.0f} | {r['rss_small_mb']:.0f} | {r['rss_threshold_mb']:.0f} "
                     f"| {r['rss_after_large_mb']:.0f} "
                     f"| {r['rss_end_mb']:.0f} | {r['small_ms_before']:.1f} / {r['small_ms_after']:.1f} "
                     f"| {r['large_ms']:.0f} |")
    study.write(args.out, {"runs": runs, "medians": table}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
