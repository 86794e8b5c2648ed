"""What the lexical fusion (engine.lexical, the default model's `lexical_weight` 0.5)
costs a call: the same RAG calls with the default model at lexical_weight 0 and 0.5,
interleaved call by call and repeated, and the lexical part alone timed on the same
inputs (sentence splitting reused from the call, as the pruner does):

    python -m benchmarks.lexical_cost --data ../shared/data/squad-dev-rag.jsonl \\
        --out benchmarks/results/lexical-cost

Reported: the median over repeats of each setting's total time, their ratio, and the
lexical part's share of a call's time."""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="JSONL with question, passages, gold (prune eval --rag-data)")
    p.add_argument("--out", required=True, help="folder for lexical-cost.json and lexical-cost.md")
    p.add_argument("--queries", type=int, default=100, help="first N queries (default 100)")
    p.add_argument("--repeats", type=int, default=5, help="repeats of the whole set (default 5)")
    p.add_argument("--model", default="default", help="a model folder, or 'default'")
    args = p.parse_args(argv)
    from statistics import median

    from engine import lexical
    from engine.pruner import Pruner
    from engine.text import split_sentences
    from engine.tools.quality import load_rag_data

    rag = load_rag_data(args.data, args.queries)
    pruner = Pruner.load(args.model)
    for s in rag[:3]:                                      # warm-up
        pruner.prune(s.question, s.passages, lexical_weight=0.0)
    totals: dict[str, list[float]] = {"lexical_weight 0": [], "lexical_weight 0.5": [], "lexical part alone": []}
    for rep in range(args.repeats):
        t = {k: 0.0 for k in totals}
        for s in rag:
            for key, w in (("lexical_weight 0", 0.0), ("lexical_weight 0.5", 0.5)):
                t0 = time.perf_counter()
                pruner.prune(s.question, s.passages, lexical_weight=w)
                t[key] += time.perf_counter() - t0
            spans = [split_sentences(x) for x in s.passages]      # the call has them already
            t0 = time.perf_counter()
            for x, sp in zip(s.passages, spans):
                lexical.sentence_scores(s.question, [x[a:b] for a, b in sp])
                lexical.passage_score(s.question, x)
            t["lexical part alone"] += time.perf_counter() - t0
        for k in totals:
            totals[k].append(t[k])
        print(f"repeat {rep + 1}/{args.repeats}: " + ", ".join(f"{k} {v:.2f} s" for k, v in t.items()),
              file=sys.stderr, flush=True)
    med = {k: median(v) for k, v in totals.items()}
    passages = sum(len(s.passages) for s in rag)
    report = {
        "command": "python -m benchmarks.lexical_cost " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, python "
                   f"{platform.python_version()}",
        "model": pruner.describe(), "queries": len(rag), "passages": passages, "repeats": args.repeats,
        "median_seconds": med,
        "ratio_on_over_off": med["lexical_weight 0.5"] / med["lexical_weight 0"],
        "lexical_share_of_call": med["lexical part alone"] / med["lexical_weight 0.5"],
        "lexical_us_per_passage": med["lexical part alone"] / passages * 1e6,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lexical-cost.json").write_text(json.dumps(report, indent=2) + "\n")
    md = ["# The lexical fusion's cost\n", f"`{report['command']}`\n",
          f"{report['machine']}; {report['model']}; {len(rag)} queries, {passages} passages, "
          f"median of {args.repeats} repeats, settings interleaved call by call.\n",
          "| setting | seconds (median) |", "|---|---|"]
    md += [f"| {k} | {v:.3f} |" for k, v in med.items()]
    md += ["", f"lexical_weight 0.5 / 0: {report['ratio_on_over_off']:.3f}; the lexical part "
               f"{report['lexical_share_of_call']:.1%} of a call "
               f"({report['lexical_us_per_passage']:.0f} us per passage)."]
    (out / "lexical-cost.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
