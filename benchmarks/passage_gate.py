"""How the passage gate's margin was chosen (docs/quality.md): the default model's RAG
calls run once without the gate, then the engine's own gate (engine.decide.gate_passages)
applied at each margin, on every RAG file given, domain by domain:

    python -m benchmarks.rag_from_prune --data ../shared/data/coqa-dev-prune.jsonl --out build/coqa-dev-rag.jsonl
    python -m benchmarks.passage_gate --rag ../shared/data/squad-dev-rag.jsonl --rag build/coqa-dev-rag.jsonl \\
        --out benchmarks/results/passage-gate

Reported per domain (a record's `source`, else the file's name) and margin: the share of
non-gold passages emptied, of gold passages with something kept, and the F1 and F2 of
"the passage keeps something" against "the passage is gold" (F2 weighs a lost answer
passage four times an irrelevant one kept: a RAG prompt can carry a spare passage, not a
missing answer). The margin chosen: among the margins that keep 95% of squad-dev-rag's gold
passages, the largest whose mean F2 over the domains is within 1 point of the best (F2
differences under a point are a few calls either way; the larger margin loses fewer
answers)."""
from __future__ import annotations

import time
from collections import defaultdict

from engine.tools.harness import Study, parser
from pathlib import Path

MARGINS = (0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2, 0.25, 0.3)


def fbeta(tp: int, fp: int, fn: int, beta: float) -> float:
    b2 = beta * beta
    return (1 + b2) * tp / ((1 + b2) * tp + b2 * fn + fp) if tp else 0.0


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, repeats=1)
    p.add_argument("--rag", action="append", required=True, help="a RAG JSONL (question, passages, gold); repeatable")
    p.add_argument("--model", default="default", help="a model folder, or 'default'")
    p.add_argument("--margins", default=",".join(map(str, MARGINS)), help="comma-separated margins")
    p.add_argument("--limit", type=int, help="first N calls of each file")
    args = p.parse_args(argv)
    study = Study("passage-gate", "benchmarks.passage_gate", argv)
    margins = [float(m) for m in args.margins.split(",")]

    from engine.decide import gate_passages
    from engine.pruner import Pruner
    from engine.tools.quality import load_rag_data, rag_calls

    pruner = Pruner.load(args.model, threads=args.threads)
    calls_by_domain: dict[str, list] = defaultdict(list)      # domain -> [(sample, ungated results)]
    t0 = time.perf_counter()
    for path in args.rag:
        samples = load_rag_data(path, args.limit)
        ungated = rag_calls(pruner, samples, progress=True, desc=Path(path).name, passage_margin=-1.0)
        for s, results in zip(samples, ungated):
            calls_by_domain[s.source or Path(path).stem].append((s, results))
    seconds = time.perf_counter() - t0

    table: dict[str, dict[str, dict[str, float]]] = {}
    for domain, pairs in sorted(calls_by_domain.items()):
        table[domain] = {}
        for m in margins:
            tp = fp = fn = tn = 0
            for s, results in pairs:
                for r in gate_passages(results, m):
                    some, gold = any(x.kept for x in r.sentences), r.index in s.gold
                    tp += some and gold
                    fp += some and not gold
                    fn += gold and not some
                    tn += not some and not gold
            table[domain][str(m)] = {"non_gold_emptied": tn / max(tn + fp, 1), "gold_kept": tp / max(tp + fn, 1),
                                     "f1": fbeta(tp, fp, fn, 1), "f2": fbeta(tp, fp, fn, 2), "calls": len(pairs)}
    mean_f2 = {str(m): sum(t[str(m)]["f2"] for t in table.values()) / len(table) for m in margins}
    squad = next((d for d in table if "squad" in d), None)
    allowed = [str(m) for m in margins if squad is None or table[squad][str(m)]["gold_kept"] >= 0.95]
    best = max((mean_f2[m] for m in allowed), default=None)
    chosen = max((m for m in allowed if mean_f2[m] >= best - 0.01), key=float) if allowed else None

    report = {"model": pruner.describe(), "seconds": round(seconds, 1), "margins": margins,
              "domains": table, "mean_f2": mean_f2, "chosen": chosen}
    md = study.header("The passage gate's margin")
    md += ["Per domain and margin: non-gold passages emptied / gold passages with something kept, and F2 of "
           "\"keeps something\" against \"is gold\" (the default model, one call per question, the gate applied "
           "to the same ungated results at each margin).", "",
           "| margin | " + " | ".join(table) + " | mean F2 |", "|---|" + "---|" * (len(table) + 1)]
    for m in margins:
        cells = [f"{100 * t[str(m)]['non_gold_emptied']:.0f}% / {100 * t[str(m)]['gold_kept']:.0f}% "
                 f"(F2 {100 * t[str(m)]['f2']:.1f})" for t in table.values()]
        md.append(f"| {m}{' (chosen)' if str(m) == chosen else ''} | " + " | ".join(cells)
                  + f" | {100 * mean_f2[str(m)]:.1f} |")
    md += ["", "Calls per domain: " + ", ".join(f"{d} {next(iter(t.values()))['calls']}" for d, t in table.items())
           + f". {report['seconds']} s."]
    study.write(args.out, report, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
