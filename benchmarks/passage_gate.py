"""How the passage gate was chosen (docs/quality.md): the default model's RAG calls run
once without the gate, then each candidate gate applied to the same ungated results, on
every RAG file given, domain by domain:

    python -m benchmarks.rag_from_prune --data ../shared/data/coqa-dev-prune.jsonl --out build/coqa-dev-rag.jsonl
    python -m benchmarks.rag_from_prune --data ../shared/data/coqa-dev-prune.jsonl --chars 600 \\
        --out build/coqa-dev-rag-600.jsonl
    python -m benchmarks.passage_gate --rag ../shared/data/squad-dev-rag.jsonl --rag build/coqa-dev-rag.jsonl \\
        --rag build/coqa-dev-rag-600.jsonl --out benchmarks/results/passage-gate

A domain is a file's stem and a record's `source` (coqa-dev's seven domains in each cut
shape are fourteen). Reported per domain and gate: the share of non-gold passages emptied,
of gold passages with something kept, and the F2 of "the passage keeps something" against
"the passage is gold" (F2 weighs a lost answer passage four times a spare one kept); and,
per domain, how often the gold passage ranks first, in the top 2, in the top 3 by
reranking score: what no gate on that score can beat.

The gates tried: the margin below the call's best (the engine's, engine.core.decide.gate_passages);
the margin scaled by the call's spread (best minus median, best minus mean) or its standard
deviation; the top n passages always kept, n fixed or a share of the call, beside a margin;
a margin that grows as the call's best score falls (vague questions score low everywhere);
a ratio of the best. Each gate on several passage scores (`rankers`): the engine's reranking
score (the model's cosine fused half and half with the share of the question's words a
passage holds), the cosine alone, and the cosine or the engine's score fused with the
passage's BM25 against the question among the call's passages (IDF from the call's
passages, divided by the call's best: a score the whole call decides, as the gate is). The
rule that chooses: first, at least 95% of the gold passages keep
something on every domain; among the gates that do, the best mean F2, and among those
within a point of it the one with fewest parameters (then the smallest margin).
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import numpy as np

from engine.tools.harness import Study, parser

Gate = Callable[[np.ndarray], np.ndarray]        # a call's scores -> which passages pass


def fbeta(tp: int, fp: int, fn: int, beta: float) -> float:
    b2 = beta * beta
    return (1 + b2) * tp / ((1 + b2) * tp + b2 * fn + fp) if tp else 0.0


def _top(s: np.ndarray, n: int) -> np.ndarray:
    keep = np.zeros(len(s), dtype=bool)
    keep[np.argsort(-s, kind="stable")[:n]] = True
    return keep


def gates() -> dict[str, tuple[int, Gate]]:
    """Every candidate: name -> (its number of parameters, the gate)."""
    out: dict[str, tuple[int, Gate]] = {}
    for m in (0.05, 0.1, 0.15, 0.2, 0.22, 0.24, 0.26, 0.28, 0.3, 0.35):
        out[f"margin {m}"] = (1, lambda s, m=m: s >= np.float32(s.max()) - np.float32(m))
    for k in (0.3, 0.5, 0.7, 1.0, 1.5):
        out[f"margin {k} x (best - median)"] = (1, lambda s, k=k: s >= s.max() - k * (s.max() - np.median(s)))
        out[f"margin {k} x (best - mean)"] = (1, lambda s, k=k: s >= s.max() - k * (s.max() - s.mean()))
    for k in (0.5, 1.0, 1.5, 2.0):
        out[f"margin {k} x std"] = (1, lambda s, k=k: s >= s.max() - k * s.std())
    for n in (2, 3):
        for m in (0.05, 0.1, 0.15):
            out[f"top {n}, else margin {m}"] = (2, lambda s, n=n, m=m: _top(s, n) | (s >= s.max() - m))
    for share in (0.2, 0.3, 0.5):
        for m in (0.1, 0.15):
            out[f"top {share:.0%} of the call, else margin {m}"] = (
                2, lambda s, f=share, m=m: _top(s, max(1, math.ceil(f * len(s)))) | (s >= s.max() - m))
    for a in (0.05, 0.1, 0.15):
        for c in (0.2, 0.3, 0.5):
            out[f"margin {a} + {c} x (1 - best)"] = (2, lambda s, a=a, c=c: s >= s.max() - a - c * max(0.0, 1 - s.max()))
    for r in (0.7, 0.8, 0.9):
        out[f"{r} x best"] = (1, lambda s, r=r: s >= r * s.max())
    return out


Ranker = Callable[[str, list[str], np.ndarray], np.ndarray]   # (question, passages, engine's scores) -> scores


def rankers(weight: float) -> dict[str, Ranker]:
    """The passage scores a gate may compare (module docstring); `weight`: the lexical
    weight the engine's reranking scores were fused with, to recover the cosine."""
    from engine.core.lexical import passage_score, sentence_scores

    def cosine(q: str, ps: list[str], s: np.ndarray) -> np.ndarray:
        lex = np.array([passage_score(q, p) for p in ps], dtype=np.float32)
        return ((s - weight * lex) / (1 - weight)).astype(np.float32)

    def bm25(q: str, ps: list[str], s: np.ndarray) -> np.ndarray:
        return sentence_scores(q, ps).astype(np.float32)

    out: dict[str, Ranker] = {"engine": lambda q, ps, s: s, "cosine": cosine}
    for a in (0.3, 0.5, 0.7):
        out[f"{a} cosine + {1 - a:.1f} call BM25"] = (
            lambda q, ps, s, a=a: (a * cosine(q, ps, s) + (1 - a) * bm25(q, ps, s)).astype(np.float32))
    for a in (0.5, 0.7):
        out[f"{a} engine + {1 - a:.1f} call BM25"] = (
            lambda q, ps, s, a=a: (a * s + (1 - a) * bm25(q, ps, s)).astype(np.float32))
    return out


def score(calls: list[tuple[list[int], np.ndarray, np.ndarray]], gate: Gate) -> dict[str, float]:
    """A gate on one domain's calls (gold indices, reranking scores, passages with something kept ungated)."""
    tp = fp = fn = tn = 0
    for gold_idx, s, some in calls:
        gold = np.zeros(len(s), dtype=bool)
        gold[gold_idx] = True
        keep = gate(s) & some
        tp, fp = tp + int((keep & gold).sum()), fp + int((keep & ~gold).sum())
        fn, tn = fn + int((~keep & gold).sum()), tn + int((~keep & ~gold).sum())
    return {"non_gold_emptied": tn / max(tn + fp, 1), "gold_kept": tp / max(tp + fn, 1),
            "f2": fbeta(tp, fp, fn, 2), "gold_lost": fn}


def ceilings(calls: list[tuple[list[int], np.ndarray, np.ndarray]]) -> dict[str, float]:
    """How often a gold passage ranks first, in the top 2, in the top 3 of its call."""
    ranks = [1 + int((s > s[g]).sum()) for gold, s, _ in calls for g in gold]
    return {f"top{k}": float(np.mean([r <= k for r in ranks])) for k in (1, 2, 3)}


def choose(table: dict[str, dict[str, dict[str, float]]], params: dict[str, int]) -> str | None:
    """The rule of the module docstring."""
    mean_f2 = {g: float(np.mean([d[g]["f2"] for d in table.values()])) for g in params}
    ok = [g for g in params if all(d[g]["gold_kept"] >= 0.95 for d in table.values())]
    if not ok:
        return None
    best = max(mean_f2[g] for g in ok)
    near = [g for g in ok if mean_f2[g] >= best - 0.01]
    return min(near, key=lambda g: (params[g], g))


def ungated(args) -> tuple[dict[str, list], str, float]:
    """Each domain's calls as the model answers them without a gate: (gold indices, the
    engine's reranking scores, passages with something kept, question, passages); the
    model's description; seconds. Read from `--cache` when it holds them, else run and saved there."""
    import json

    from engine.tools.quality import load_rag_data, rag_calls
    key = {"rag": args.rag, "model": args.model, "limit": args.limit}
    cache = Path(args.cache) if args.cache else None
    saved = json.loads(cache.read_text()) if cache and cache.exists() else None
    by_domain: dict[str, list] = defaultdict(list)
    if saved and saved["key"] == key:
        runs, described, seconds = saved["runs"], saved["model"], saved["seconds"]
    else:
        from engine.pruner import Pruner
        pruner = Pruner.load(args.model, threads=args.threads)
        runs, described, t0 = {}, pruner.describe(), time.perf_counter()
        for path in args.rag:
            samples = load_rag_data(path, args.limit)
            rows = []
            for results in rag_calls(pruner, samples, progress=True, desc=Path(path).name, passage_margin=-1.0):
                results = sorted(results, key=lambda r: r.index)
                rows.append(([r.reranking_score if r.reranking_score is not None else -math.inf for r in results],
                             [any(x.kept for x in r.sentences) for r in results]))
            runs[path] = rows
        seconds = time.perf_counter() - t0
        if cache:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"key": key, "model": described, "seconds": seconds, "runs": runs}))
    for path in args.rag:
        for s, (scores, some) in zip(load_rag_data(path, args.limit), runs[path]):
            by_domain[f"{Path(path).stem}: {s.source}" if s.source else Path(path).stem].append(
                (list(s.gold), np.array(scores, dtype=np.float32), np.array(some), s.question, s.passages))
    return by_domain, described, seconds


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, repeats=1)
    p.add_argument("--rag", action="append", required=True, help="a RAG JSONL (question, passages, gold); repeatable")
    p.add_argument("--model", default="default", help="a model folder, or 'default'")
    p.add_argument("--limit", type=int, help="first N calls of each file")
    p.add_argument("--cache", help="a JSON file keeping the ungated calls between runs (read when it matches)")
    args = p.parse_args(argv)
    study = Study("passage-gate", "benchmarks.passage_gate", argv)

    from engine.core.families import FAMILIES
    by_domain, described, seconds = ungated(args)
    candidates = gates()
    table: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    params, ceiling = {}, {}
    for rname, rank in rankers(FAMILIES["embedding"].rules.lexical_weight).items():
        calls = {d: [(g, rank(q, ps, s), some) for g, s, some, q, ps in c] for d, c in sorted(by_domain.items())}
        ceiling[rname] = {d: ceilings(c) for d, c in calls.items()}
        for g, (n, gate) in candidates.items():
            name = g if rname == "engine" else f"{rname}: {g}"
            params[name] = n + (rname != "engine")
            for d, c in calls.items():
                table[d][name] = score(c, gate)
    chosen = choose(table, params)
    report = {"model": described, "seconds": round(seconds, 1), "domains": table, "chosen": chosen,
              "calls": {d: len(c) for d, c in by_domain.items()}, "ceilings": ceiling["engine"],
              "ranker_ceilings": ceiling}
    study.write(args.out, report, _markdown(study, report, list(params)))
    return 0


def _markdown(study: Study, report: dict, names: list[str]) -> list[str]:
    table, chosen = report["domains"], report["chosen"]
    md = study.header("The passage gate")
    md += ["Each candidate gate on the same ungated calls of the default model: the worst domain's share of gold "
           "passages with something kept, the worst and mean share of non-gold passages emptied, the mean F2 over "
           "the domains. Chosen: " + (f"**{chosen}**" if chosen else "none keeps 95% of the gold passages on every "
                                      "domain") + ".", "",
           "| gate | worst gold kept | worst non-gold emptied | mean non-gold emptied | mean F2 |", "|---|---|---|---|---|"]
    ranked = sorted(names, key=lambda g: (-min(d[g]["gold_kept"] for d in table.values()),
                                          -np.mean([d[g]["f2"] for d in table.values()])))
    for g in [g for i, g in enumerate(ranked) if i < 40 or g in ("margin 0.1", chosen)]:
        vals = [d[g] for d in table.values()]
        md.append(f"| {g}{' (chosen)' if g == chosen else ''} | {100 * min(v['gold_kept'] for v in vals):.1f}% | "
                  f"{100 * min(v['non_gold_emptied'] for v in vals):.1f}% | "
                  f"{100 * np.mean([v['non_gold_emptied'] for v in vals]):.1f}% | "
                  f"{100 * np.mean([v['f2'] for v in vals]):.1f} |")
    shown = [g for g in (chosen, "margin 0.1") if g]
    md += ["", "Per domain: " + ", ".join(f"gold kept / non-gold emptied at {g}" for g in shown)
           + "; where the gold passage ranks (no gate on this score keeps more than a top-k share).", "",
           "| domain | calls | " + " | ".join(shown) + " | gold first | in the top 2 | in the top 3 |",
           "|---|---|" + "---|" * (len(shown) + 3)]
    for d, row in table.items():
        c = report["ceilings"][d]
        md.append(f"| {d} | {report['calls'][d]} | " + " | ".join(
            f"{100 * row[g]['gold_kept']:.1f}% / {100 * row[g]['non_gold_emptied']:.1f}%" for g in shown)
            + f" | {100 * c['top1']:.1f}% | {100 * c['top2']:.1f}% | {100 * c['top3']:.1f}% |")
    md += ["", f"The first 40 of {len(names)} gates shown (all are in the JSON); a score other than the engine's "
           "names itself before the gate.", "",
           "Where the gold passage ranks by each score: the worst domain's and the mean share first, in the top 2, "
           "in the top 3.", "", "| score | first (worst / mean) | top 2 | top 3 |", "|---|---|---|---|"]
    for rname, per in report["ranker_ceilings"].items():
        md.append(f"| {rname} | " + " | ".join(
            f"{100 * min(c[k] for c in per.values()):.1f}% / {100 * np.mean([c[k] for c in per.values()]):.1f}%"
            for k in ("top1", "top2", "top3")) + " |")
    md += ["", f"{report['seconds']} s for the ungated calls."]
    return md


if __name__ == "__main__":
    raise SystemExit(main())
