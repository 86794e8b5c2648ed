"""What the lexical fusion (engine.core.lexical, the default model's `lexical_weight` 0.5)
costs a call: the same RAG calls with the default model at lexical_weight 0 and 0.5,
interleaved call by call and repeated, and the lexical part alone timed on the same
inputs (sentence splitting reused from the call, as the pruner does):

    python -m benchmarks.lexical_cost --data ../shared/data/squad-dev-rag.jsonl \\
        --out benchmarks/results/lexical-cost

Reported: the median over repeats of each setting's total time, their ratio, and the
lexical part's share of a call's time."""
from __future__ import annotations

import time

from engine.tools.harness import Study, medians, parser, stderr


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, repeats=5)
    p.add_argument("--data", required=True, help="JSONL with question, passages, gold (prune eval --rag-data)")
    p.add_argument("--queries", type=int, default=100, help="first N queries (default 100)")
    p.add_argument("--model", default="default", help="a model folder, or 'default'")
    args = p.parse_args(argv)
    study = Study("lexical-cost", "benchmarks.lexical_cost", argv)

    from engine.core import lexical
    from engine.pruner import Pruner
    from engine.core.text import split_sentences
    from engine.tools.quality import load_rag_data

    rag = load_rag_data(args.data, args.queries)
    pruner = Pruner.load(args.model, threads=args.threads)
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
        stderr(f"repeat {rep + 1}/{args.repeats}: " + ", ".join(f"{k} {v:.2f} s" for k, v in t.items()))
    med = medians(totals)
    passages = sum(len(s.passages) for s in rag)
    report = {
        "model": pruner.describe(), "queries": len(rag), "passages": passages, "repeats": args.repeats,
        "seconds": totals, "median_seconds": med,
        "ratio_on_over_off": med["lexical_weight 0.5"] / med["lexical_weight 0"],
        "lexical_share_of_call": med["lexical part alone"] / med["lexical_weight 0.5"],
        "lexical_us_per_passage": med["lexical part alone"] / passages * 1e6,
    }
    md = study.header("The lexical fusion's cost", f"{report['model']}; {len(rag)} queries, {passages} passages, "
                      f"median of {args.repeats} repeats, settings interleaved call by call.")
    md += ["| setting | seconds (median) |", "|---|---|"]
    md += [f"| {k} | {v:.3f} |" for k, v in med.items()]
    md += ["", f"lexical_weight 0.5 / 0: {report['ratio_on_over_off']:.3f}; the lexical part "
               f"{report['lexical_share_of_call']:.1%} of a call "
               f"({report['lexical_us_per_passage']:.0f} us per passage)."]
    study.write(args.out, report, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
