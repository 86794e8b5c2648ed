"""`prune eval --rag-data`: RAG calls (a question and its passages) run through each model:
how well the reranking score ranks the answer passage (MRR, recall at k), how much of the
calls the pruning keeps and whether the answer passage keeps a sentence, per domain, and the
answer passages the defaults lost."""

from __future__ import annotations

import math

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.datafiles import RagSample, load_rag_data
from engine.datafiles import progress as progress_bar
from engine.evaluate.bm25 import bm25_rankings
from engine.pipeline.decide import gate_passages


def evaluate_rag(
    models: dict[str, Any],
    rag_data: str | Path,
    rag_limit: int | None,
    modes: dict[str, str],
    hybrid_weights: dict[str, float],
    windows: str | None,
    progress: bool,
    log: Callable[[str], None],
) -> tuple[dict, dict]:
    """(the reranking report, the RAG pruning report) of every model on the RAG file;
    `hybrid_weights`: the lexical weight each model's reranking is also fused at."""
    rag = load_rag_data(rag_data, rag_limit)
    golds = [s.gold for s in rag]
    rr = {"BM25 (passage vs question)": reranking_metrics(bm25_rankings(rag), golds)}
    pruning: dict[str, dict[str, float]] = {}
    by_domain: dict[str, dict[str, Any]] = {}
    for name, pruner in models.items():
        fam = pruner.family
        log(f"running {len(rag)} RAG calls with {name} ...")
        # one pass without the gate; the family's gate (engine.pipeline.decide) then gives the defaults
        ungated = rag_calls(pruner, rag, progress, f"{name}: RAG calls", windows=windows, passage_margin=-1.0)
        margin = fam.rules.passage_margin
        at_defaults = [gate_passages(results, margin) for results in ungated]
        pruning[f"{name} at its defaults"] = rag_pruning_metrics(at_defaults, rag)
        by_domain[name] = lost_answers(at_defaults, rag)
        if margin is not None:
            pruning[f"{name} without the passage gate (passage_margin -1)"] = rag_pruning_metrics(
                ungated, rag
            )
        rr.update(
            _reranking_rows(name, pruner, rag, ungated, modes[name], hybrid_weights[name], windows, progress)
        )
    reranking = {"data": str(rag_data), "metrics": rr}
    report = {
        "data": str(rag_data),
        "queries": len(rag),
        "passages": sum(len(s.passages) for s in rag),
        "metrics": pruning,
        "by_domain": by_domain,
    }
    return reranking, report


def _reranking_rows(name, pruner, rag, ungated, mode: str, w: float, windows, progress) -> dict[str, Any]:
    """A model's reranking rows: its score alone, and fused with the lexical score where it
    decides per sentence."""
    golds = [s.gold for s in rag]
    if mode != "sentences":
        return {name: reranking_metrics(rankings_of(ungated), golds)}
    fam = pruner.family
    alone = rag_calls(
        pruner, rag, progress, f"{name}: reranking, lexical_weight 0", windows=windows, lexical_weight=0.0
    )
    fused = (
        ungated
        if fam.rules.lexical_weight == w
        else rag_calls(
            pruner, rag, progress, f"{name}: reranking, lexical_weight {w}", windows=windows, lexical_weight=w
        )
    )
    return {
        name: reranking_metrics(rankings_of(alone), golds),
        f"{name} + lexical (weight {w})": reranking_metrics(rankings_of(fused), golds),
    }


def reranking_metrics(
    rankings: Sequence[Sequence[float]], golds: Sequence[int | Sequence[int]], k: int = 10
) -> dict[str, float]:
    """MRR@k and hit@1 of the best-ranked gold passage (a query's gold: one index or a list);
    ties with other passages rank the gold passage last (pessimistic)."""
    rr, hits = [], []
    for scores, gold in zip(rankings, golds):
        scores = np.asarray(scores, dtype=np.float64)
        gold = [gold] if isinstance(gold, (int, np.integer)) else list(gold)
        other = np.ones(len(scores), dtype=bool)
        other[gold] = False
        rank = min(1 + int((scores[other] >= scores[g]).sum()) for g in gold)
        rr.append(1.0 / rank if rank <= k else 0.0)
        hits.append(1.0 if rank == 1 else 0.0)
    n = max(len(rr), 1)
    return {"mrr@%d" % k: sum(rr) / n, "hit@1": sum(hits) / n, "queries": len(rr)}


def rag_calls(
    pruner, samples: Sequence[RagSample], progress: bool = True, desc: str = "RAG calls", **options: Any
) -> list[list]:
    """Each query's results (`pruner.prune` of its passages, one call, with `options`)."""
    return [
        pruner.prune(s.question, s.passages, **options)
        for s in progress_bar(samples, len(samples), desc, progress)
    ]


def rankings_of(calls: Sequence[Sequence[Any]]) -> list[list[float]]:
    """Each call's reranking scores in input order (-inf for a passage without one)."""
    return [
        [
            r.reranking_score if r.reranking_score is not None else -math.inf
            for r in sorted(results, key=lambda r: r.index)
        ]
        for results in calls
    ]


def rag_pruning_metrics(calls: Sequence[Sequence[Any]], samples: Sequence[RagSample]) -> dict[str, float]:
    """What a RAG call's pruning keeps: the share of non-gold passages emptied (nothing
    kept), of non-gold and of gold characters kept, of gold passages with something kept,
    and MRR@10 / hit@1 of the gold passage by reranking score."""
    emptied = nongold = gold_kept = golds = 0
    chars = {"gold": [0, 0], "non-gold": [0, 0]}  # kept, in all
    for results, s in zip(calls, samples):
        for r in results:
            kept = sum(x.end - x.start for x in r.sentences if x.kept)
            total = sum(x.end - x.start for x in r.sentences)
            some = any(x.kept for x in r.sentences)
            is_gold = r.index in s.gold
            key = "gold" if is_gold else "non-gold"
            chars[key][0] += kept
            chars[key][1] += total
            if is_gold:
                golds += 1
                gold_kept += some
            else:
                nongold += 1
                emptied += not some
    rank = reranking_metrics(rankings_of(calls), [s.gold for s in samples])
    return {
        "non_gold_emptied": emptied / max(nongold, 1),
        "non_gold_chars_kept": chars["non-gold"][0] / max(chars["non-gold"][1], 1),
        "gold_with_something_kept": gold_kept / max(golds, 1),
        "gold_chars_kept": chars["gold"][0] / max(chars["gold"][1], 1),
        "mrr@10": rank["mrr@10"],
        "hit@1": rank["hit@1"],
        "queries": len(samples),
        "non_gold_passages": nongold,
        "gold_passages": golds,
    }


def lost_answers(calls: Sequence[Sequence[Any]], samples: Sequence[RagSample]) -> dict[str, Any]:
    """Per domain (a sample's `source`, else "all"): the RAG metrics of its calls, and the
    answer passages that kept nothing with the calls where it happened (id, question, the
    lost passages with their reranking score and rank, the call's best score)."""
    out: dict[str, Any] = {}
    for d in sorted({s.source or "all" for s in samples}):
        idx = [i for i, s in enumerate(samples) if (s.source or "all") == d]
        lost_calls = [lost for i in idx if (lost := _lost_in(calls[i], samples[i]))]
        out[d] = {
            **rag_pruning_metrics([calls[i] for i in idx], [samples[i] for i in idx]),
            "gold_lost": sum(len(c["lost"]) for c in lost_calls),
            "lost_calls": lost_calls,
        }
    return out


def _lost_in(results: Sequence[Any], sample: RagSample) -> dict[str, Any] | None:
    """The answer passages of one call that kept nothing (None when none did)."""
    scores = [r.reranking_score for r in results if r.reranking_score is not None]
    lost = [r for r in results if r.index in sample.gold and not any(x.kept for x in r.sentences)]
    if not lost:
        return None
    return {
        "id": sample.id,
        "question": sample.question,
        "passages": len(results),
        "best_score": max(scores),
        "lost": [
            {
                "index": r.index,
                "reranking_score": r.reranking_score,
                "rank": 1 + sum(x > r.reranking_score for x in scores),
            }
            for r in lost
        ],
    }
