"""Whether another sentence rule beats BM25 on every domain (docs/quality.md): the default
model's sentence scores on each sentence-labelled file, fused with the in-passage lexical
score at each weight, kept above each threshold, or within a ratio of the passage's best
(BM25's own rule), the best sentence kept when none passes (the family's backoff); each
domain's F1 against BM25 at its best threshold on that domain (as `prune eval` reports it):

    python -m benchmarks.sentence_rule --data ../shared/data/squad-dev-prune.jsonl \\
        --data ../shared/data/coqa-dev-prune.jsonl --out benchmarks/results/sentence-rule

A domain is a record's `source`. Reported: the settings whose worst domain is best, each
domain's F1 minus BM25's, and today's default for comparison.
"""
from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np

from engine.tools.harness import Study, parser

WEIGHTS = (0.3, 0.4, 0.5, 0.6, 0.7)
THRESHOLDS = tuple(round(0.6 + 0.01 * i, 2) for i in range(40))
RATIOS = (None, 0.9, 0.95, 0.99)


def f1(docs: list[tuple[np.ndarray, np.ndarray, np.ndarray]], w: float, t: float, ratio: float | None) -> float:
    """Micro F1 of the rule on (model scores, lexical scores, labels) documents."""
    tp = fp = fn = 0
    for p, lx, y in docs:
        s = (1 - w) * p + w * lx
        keep = s > t
        if ratio is not None:
            keep |= s >= ratio * s.max()
        if not keep.any():
            keep[np.argmax(s)] = True
        tp, fp, fn = tp + int((keep & y).sum()), fp + int((keep & ~y).sum()), fn + int((~keep & y).sum())
    return 100 * 2 * tp / max(2 * tp + fp + fn, 1)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, repeats=1)
    p.add_argument("--data", action="append", required=True, help="a sentence-labelled JSONL; repeatable")
    p.add_argument("--model", default="default", help="a model folder, or 'default'")
    args = p.parse_args(argv)
    study = Study("sentence-rule", "benchmarks.sentence_rule", argv)
    from engine.pruner import Pruner
    from engine.tools.quality import (bm25_sentence_scores, grid_search, load_prune_data, model_sentence_scores,
                                      passage_lexical_scores)
    pruner = Pruner.load(args.model, threads=args.threads)
    docs: dict[str, list] = defaultdict(list)
    bm25: dict[str, float] = {}
    for path in args.data:
        samples = load_prune_data(path)
        scores = model_sentence_scores(pruner, samples, progress=False)
        for s, sc, lx in zip(samples, scores, passage_lexical_scores(samples)):
            docs[s.source or path].append((np.asarray(sc), np.asarray(lx), np.asarray(s.labels, dtype=bool)))
        for d in sorted({s.source or path for s in samples}):
            sub = [s for s in samples if (s.source or path) == d]
            bm25[d] = 100 * grid_search("BM25", bm25_sentence_scores(sub), [s.labels for s in sub]).best["micro"]["f1"]
    rules = pruner.family.rules
    default = (rules.lexical_weight, rules.threshold_at(rules.lexical_weight), None)
    rows = []
    for setting in [default, *itertools.product(WEIGHTS, THRESHOLDS, RATIOS)]:
        over = {d: f1(rows_d, *setting) - bm25[d] for d, rows_d in docs.items()}
        rows.append({"weight": setting[0], "threshold": setting[1], "ratio": setting[2], "over_bm25": over,
                     "worst": min(over.values()), "mean": float(np.mean(list(over.values())))})
    best = sorted(rows[1:], key=lambda r: (-r["worst"], -r["mean"]))[:10]
    report = {"bm25_best_f1": bm25, "default": rows[0], "best": best}
    md = study.header("Sentence rules against BM25, per domain")
    names = sorted(bm25)
    md += ["F1 minus BM25's best F1 on each domain (BM25 tuned per domain; the rule is one setting for all).", "",
           "| weight | threshold | ratio of the best | " + " | ".join(names) + " | worst |",
           "|---|---|---|" + "---|" * (len(names) + 1)]
    for r in [rows[0], *best]:
        label = " (default)" if r is rows[0] else ""
        md.append(f"| {r['weight']}{label} | {r['threshold']} | {r['ratio'] or '-'} | "
                  + " | ".join(f"{r['over_bm25'][d]:+.2f}" for d in names) + f" | {r['worst']:+.2f} |")
    study.write(args.out, report, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
