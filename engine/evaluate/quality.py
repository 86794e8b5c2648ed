"""Quality evaluation, the seed study's method for any model (`prune eval`).

Sentence level (pruning): precision, recall and F1 of the kept sentences against the
labels of a JSONL file (fields `question`, `context`, `sentences` as [start, end) spans,
`labels`), micro-averaged over all sentences and averaged per document; a grid search
over the threshold (and the backoff alpha) reports the best F1 and its setting, as the
seed study did; baselines (keep everything, keep the first k, BM25 of each sentence
against the question) go through the same code.

Per domain: where the samples carry a `source` (coqa-dev's seven domains), F1 of every
model at its defaults beside BM25 at its best threshold on that domain, and the worst
domain.

Passage level (RAG calls): on a JSONL file with `question`, `passages`, `gold` (the index
of the passage that holds the answer, or a list of them), each model at its defaults: the
share of non-gold passages emptied, of non-gold and gold characters kept, of gold passages
with something kept; and MRR@10 and hit@1 of the gold passage by reranking score, with
BM25 of each passage as the baseline.

The data are for evaluation only: the grid search picks a setting to report, as in the
seed study; it is not training.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from engine.pipeline import lexical
from engine.pipeline.decide import gate_passages
from engine.pipeline.families import FAMILIES
from engine.pruner import model_scores, windows_of
from engine.datafiles import PruneSample, RagSample, load_prune_data, load_rag_data
from engine.datafiles import progress as progress_bar
from engine.evaluate.bm25 import bm25_rankings, bm25_sentence_scores

THRESHOLDS = tuple(round(x, 3) for x in np.linspace(0.0, 1.0, 101))
ALPHAS = (None, 0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)


# --------------------------------------------------------------------------- metrics

@dataclass
class PRF:
    """Precision, recall and F1."""
    precision: float
    recall: float
    f1: float


def prf(tp: int, fp: int, fn: int) -> PRF:
    """PRF from true positives, false positives and false negatives."""
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return PRF(p, r, f)


def sentence_metrics(preds: Sequence[np.ndarray], labels: Sequence[np.ndarray]) -> dict[str, Any]:
    """Micro P/R/F1 over all sentences, and P/R/F1 averaged over documents."""
    tp = fp = fn = 0
    per_doc = []
    for p, y in zip(preds, labels):
        p = np.asarray(p, dtype=bool)
        y = np.asarray(y, dtype=bool)
        dtp, dfp, dfn = int((p & y).sum()), int((p & ~y).sum()), int((~p & y).sum())
        tp, fp, fn = tp + dtp, fp + dfp, fn + dfn
        per_doc.append(prf(dtp, dfp, dfn))
    micro = prf(tp, fp, fn)
    n = max(len(per_doc), 1)
    macro = PRF(sum(d.precision for d in per_doc) / n, sum(d.recall for d in per_doc) / n,
                sum(d.f1 for d in per_doc) / n)
    kept = sum(int(np.asarray(p, dtype=bool).sum()) for p in preds)
    total = sum(len(p) for p in preds)
    return {"micro": asdict(micro), "per_document": asdict(macro),
            "kept_share": kept / total if total else 0.0}


def sweep_keep(probs: np.ndarray, threshold: float, alpha: float | None, strict: bool = True) -> np.ndarray:
    """Threshold then backoff, the engine's rule (no title rule: these are plain passages)."""
    kept = probs > threshold if strict else probs >= threshold
    if alpha is not None and len(probs) and not kept.any() and probs.max() >= alpha:
        kept = kept.copy()
        kept[int(np.argmax(probs))] = True
    return kept


@dataclass
class GridResult:
    """One setting's sentence P/R/F1 and compression on a data set."""
    name: str
    best: dict[str, Any]
    setting: dict[str, Any]
    curve: list[dict[str, float]] = field(default_factory=list)   # precision/recall per threshold


def grid_search(name: str, scores: Sequence[np.ndarray], labels: Sequence[np.ndarray],
                thresholds: Sequence[float] = THRESHOLDS, alphas: Sequence[float | None] = ALPHAS,
                strict: bool = True) -> GridResult:
    """Best micro F1 over threshold x alpha; ties go to the first setting in grid order."""
    best_f1, best, setting = -1.0, None, None
    curves: dict[Any, list[dict[str, float]]] = {}
    for alpha in alphas:
        for t in thresholds:
            m = sentence_metrics([sweep_keep(s, t, alpha, strict) for s in scores], labels)
            curves.setdefault(alpha, []).append({"threshold": t, **m["micro"]})
            if m["micro"]["f1"] > best_f1 + 1e-12:
                best_f1, best, setting = m["micro"]["f1"], m, {"threshold": t, "alpha": alpha}
    # the precision/recall curve over thresholds at the best setting's alpha
    return GridResult(name, best, setting, curves[setting["alpha"]])


def first_k_baseline(labels: Sequence[np.ndarray], ks: Sequence[int] = range(1, 11)) -> GridResult:
    """Keep each passage's first k sentences, for k in `ks`."""
    best_f1, best, setting = -1.0, None, None
    for k in ks:
        preds = [np.arange(len(y)) < k for y in labels]
        m = sentence_metrics(preds, labels)
        if m["micro"]["f1"] > best_f1:
            best_f1, best, setting = m["micro"]["f1"], m, {"k": k}
    return GridResult("first-k", best, setting)


def keep_all_baseline(labels: Sequence[np.ndarray]) -> GridResult:
    """Keep every sentence."""
    return GridResult("keep-all", sentence_metrics([np.ones(len(y), bool) for y in labels], labels), {})


#: The hybrid's setting, chosen on squad-dev alone (docs/quality.md) and the default
#: family's default (engine.pipeline.families): the weight of the in-passage lexical score
#: (engine.pipeline.lexical) and the keep threshold and backoff with it. prune eval scores every
#: family's model at it (the trained families' own default weight is 0).
HYBRID = {"lexical_weight": FAMILIES["embedding"].rules.lexical_weight,
          "threshold": FAMILIES["embedding"].rules.lexical_threshold, "alpha": FAMILIES["embedding"].rules.alpha}


def hybrid_setting(family) -> dict[str, Any]:
    """The lexical weight, threshold and alpha `family` fuses with: its own defaults when
    its default weight is not 0, else HYBRID."""
    if family.rules.lexical_weight:
        return {"lexical_weight": family.rules.lexical_weight,
                "threshold": family.rules.threshold_at(family.rules.lexical_weight), "alpha": family.rules.alpha}
    return dict(HYBRID)


def passage_lexical_scores(samples: Sequence[PruneSample]) -> list[np.ndarray]:
    """engine.pipeline.lexical's sentence scores: BM25 with the IDF of the passage's own sentences."""
    return [lexical.sentence_scores(s.question, [s.context[a:b] for a, b in s.spans]) for s in samples]


def hybrid_rows(name: str, pruner, samples: Sequence[PruneSample], scores: Sequence[np.ndarray],
                labels: Sequence[np.ndarray], strict: bool) -> list[GridResult]:
    """The model's sentence scores fused with engine.pipeline.lexical's (as Pruner does with
    lexical_weight): at the best setting of the grid, and at hybrid_setting's."""
    setting = hybrid_setting(pruner.family)
    w = setting["lexical_weight"]
    fused = [lexical.fuse(s, lx, w) for s, lx in zip(scores, passage_lexical_scores(samples))]
    at = sentence_metrics([sweep_keep(f, setting["threshold"], setting["alpha"], strict) for f in fused], labels)
    rows = [grid_search(f"{name} + lexical (weight {w})", fused, labels, strict=strict),
            GridResult(f"{name} + lexical (weight {w}) at threshold {setting['threshold']}, alpha {setting['alpha']}"
                       + (" (its defaults)" if pruner.family.rules.lexical_weight else ""), at, setting)]
    half = len(samples) // 2
    if half >= 10:    # as for the model alone: the threshold chosen on the first half, scored on the second
        tuned = grid_search(name, fused[:half], labels[:half], strict=strict).setting
        rows.append(GridResult(f"{name} + lexical (weight {w}), setting of docs 1-{half}, scored on "
                               f"{half + 1}-{len(samples)}",
                               sentence_metrics([sweep_keep(f, tuned["threshold"], tuned["alpha"], strict)
                                                 for f in fused[half:]], labels[half:]),
                               {"lexical_weight": w, **tuned}))
    return rows


# --------------------------------------------------------------------------- models

def model_sentence_scores(pruner, samples: Sequence[PruneSample], progress: bool = True,
                          windows: str | None = None, kept: list | None = None) -> list[np.ndarray]:
    """The model's sentence probabilities on the dataset's own sentence spans. With token
    windows (`windows="reference"`, OpenSearch) a sentence's probability is its best over
    the windows, and `kept` (when a list is given) receives the windows' own decisions at
    the family's defaults."""
    out = []
    for s in progress_bar(samples, len(samples), "pruning", progress):
        sc = model_scores(pruner, s.question, [s.context], [s.spans], windows=windows)[0]
        out.append(sc.probs)
        if kept is not None:
            kept.append(sc.kept)
    return out


def reranking_metrics(rankings: Sequence[Sequence[float]], golds: Sequence[int | Sequence[int]],
                      k: int = 10) -> dict[str, float]:
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


def rag_calls(pruner, samples: Sequence[RagSample], progress: bool = True, desc: str = "RAG calls",
              **options: Any) -> list[list]:
    """Each query's results (`pruner.prune` of its passages, one call, with `options`)."""
    return [pruner.prune(s.question, s.passages, **options)
            for s in progress_bar(samples, len(samples), desc, progress)]


def rankings_of(calls: Sequence[Sequence[Any]]) -> list[list[float]]:
    """Each call's reranking scores in input order (-inf for a passage without one)."""
    return [[r.reranking_score if r.reranking_score is not None else -math.inf
             for r in sorted(results, key=lambda r: r.index)] for results in calls]


def rag_pruning_metrics(calls: Sequence[Sequence[Any]], samples: Sequence[RagSample]) -> dict[str, float]:
    """What a RAG call's pruning keeps: the share of non-gold passages emptied (nothing
    kept), of non-gold and of gold characters kept, of gold passages with something kept,
    and MRR@10 / hit@1 of the gold passage by reranking score."""
    emptied = nongold = gold_kept = golds = 0
    chars = {"gold": [0, 0], "non-gold": [0, 0]}      # kept, in all
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
    return {"non_gold_emptied": emptied / max(nongold, 1),
            "non_gold_chars_kept": chars["non-gold"][0] / max(chars["non-gold"][1], 1),
            "gold_with_something_kept": gold_kept / max(golds, 1),
            "gold_chars_kept": chars["gold"][0] / max(chars["gold"][1], 1),
            "mrr@10": rank["mrr@10"], "hit@1": rank["hit@1"], "queries": len(samples),
            "non_gold_passages": nongold, "gold_passages": golds}


def lost_answers(calls: Sequence[Sequence[Any]], samples: Sequence[RagSample]) -> dict[str, Any]:
    """Per domain (a sample's `source`, else "all"): the RAG metrics of its calls, and the
    answer passages that kept nothing with the calls where it happened (id, question, the
    lost passages with their reranking score and rank, the call's best score)."""
    out: dict[str, Any] = {}
    for d in sorted({s.source or "all" for s in samples}):
        idx = [i for i, s in enumerate(samples) if (s.source or "all") == d]
        lost_calls = [lost for i in idx if (lost := _lost_in(calls[i], samples[i]))]
        out[d] = {**rag_pruning_metrics([calls[i] for i in idx], [samples[i] for i in idx]),
                  "gold_lost": sum(len(c["lost"]) for c in lost_calls), "lost_calls": lost_calls}
    return out


def _lost_in(results: Sequence[Any], sample: RagSample) -> dict[str, Any] | None:
    """The answer passages of one call that kept nothing (None when none did)."""
    scores = [r.reranking_score for r in results if r.reranking_score is not None]
    lost = [r for r in results if r.index in sample.gold and not any(x.kept for x in r.sentences)]
    if not lost:
        return None
    return {"id": sample.id, "question": sample.question, "passages": len(results), "best_score": max(scores),
            "lost": [{"index": r.index, "reranking_score": r.reranking_score,
                      "rank": 1 + sum(x > r.reranking_score for x in scores)} for r in lost]}


# --------------------------------------------------------------------------- report

def default_predictions(pruner, samples: Sequence[PruneSample], scores: Sequence[np.ndarray],
                        kept: Sequence[np.ndarray | None], strict: bool, windows: str) -> list[np.ndarray]:
    """What `pruner` keeps of each single-passage sample at its defaults, from the model's
    own scores (`lexical_weight` 0): the family's fusion, threshold and backoff (no title
    rule: these are plain passages); the windows' own decisions where token windows
    decided. A one-passage call always passes the passage gate."""
    fam = pruner.family
    if any(k is not None for k in kept):
        return list(kept)
    w = fam.rules.lexical_weight if windows == "sentences" else 0.0
    if w:
        scores = [lexical.fuse(s, lx, w) for s, lx in zip(scores, passage_lexical_scores(samples))]
    return [sweep_keep(s, fam.rules.threshold_at(w), fam.rules.alpha, strict) for s in scores]


def domain_rows(samples: Sequence[PruneSample], defaults: dict[str, list[np.ndarray]]) -> dict[str, Any]:
    """Per `source` domain: BM25 at its best threshold on that domain's documents (IDF over
    them) and each model's F1 at its defaults; the worst domain by the difference."""
    out: dict[str, Any] = {"domains": {}, "worst": {}}
    for d in sorted({s.source for s in samples}):
        idx = [i for i, s in enumerate(samples) if s.source == d]
        sub = [samples[i] for i in idx]
        labels = [s.labels for s in sub]
        bm = grid_search("BM25", bm25_sentence_scores(sub), labels)
        row = {"documents": len(sub), "bm25_best_f1": bm.best["micro"]["f1"], "bm25_setting": bm.setting,
               "models": {}}
        for name, preds in defaults.items():
            f1 = sentence_metrics([preds[i] for i in idx], labels)["micro"]["f1"]
            row["models"][name] = {"f1": f1, "over_bm25": f1 - bm.best["micro"]["f1"]}
        out["domains"][d] = row
    for name in defaults:
        worst = min(out["domains"], key=lambda d: out["domains"][d]["models"][name]["over_bm25"])
        out["worst"][name] = {"domain": worst, **out["domains"][worst]["models"][name]}
    return out


def evaluate(models: dict[str, Any], prune_data: str | Path | None, rag_data: str | Path | None,
             limit: int | None = None, rag_limit: int | None = None, progress: bool = True,
             log: Callable[[str], None] = print, windows: str | None = None) -> dict[str, Any]:
    """Run every model and the baselines; returns the report as a dict. `windows` (None:
    each family's default) is recorded per model in `report["windows"]`."""
    report: dict[str, Any] = {"pruning": None, "reranking": None, "rag": None,
                              "windows": {name: windows_of(p, windows) for name, p in models.items()}}
    if prune_data:
        samples = load_prune_data(prune_data, limit)
        labels = [s.labels for s in samples]
        rows = [keep_all_baseline(labels), first_k_baseline(labels),
                grid_search("BM25 (sentence vs question)", bm25_sentence_scores(samples), labels),
                grid_search("BM25 over the passage's own sentences (engine.pipeline.lexical)",
                            passage_lexical_scores(samples), labels)]
        half = len(samples) // 2
        defaults: dict[str, list[np.ndarray]] = {}
        for name, pruner in models.items():
            log(f"scoring {len(samples)} documents with {name} (windows {report['windows'][name]}) ...")
            strict = pruner.family.rules.keep_rule == "gt"
            kept: list = []
            scores = model_sentence_scores(pruner, samples, progress, windows=windows, kept=kept)
            defaults[name] = default_predictions(pruner, samples, scores, kept, strict, report["windows"][name])
            rows.append(grid_search(name, scores, labels, strict=strict))
            fam = pruner.family
            # the model's own scores at its own threshold: its defaults unless it fuses by default
            fused = fam.rules.lexical_weight and report["windows"][name] == "sentences"
            label = f"{name} with lexical_weight 0 at threshold {fam.rules.threshold}" if fused \
                else f"{name} at its defaults"
            rows.append(GridResult(label, sentence_metrics(
                [k if k is not None else sweep_keep(s, fam.rules.threshold, fam.rules.alpha, strict)
                 for s, k in zip(scores, kept)], labels),
                {"threshold": fam.rules.threshold, "alpha": fam.rules.alpha, "lexical_weight": 0.0}))
            if report["windows"][name] == "sentences":
                rows += hybrid_rows(name, pruner, samples, scores, labels, strict)
            if half >= 10:
                # Honest generalisation: the setting chosen on the first half, scored on the second.
                tuned = grid_search(name, scores[:half], labels[:half], strict=strict).setting
                rows.append(GridResult(f"{name}, setting of docs 1-{half}, scored on {half + 1}-{len(samples)}",
                                       sentence_metrics([sweep_keep(s, tuned["threshold"], tuned["alpha"], strict)
                                                         for s in scores[half:]], labels[half:]), tuned))
        report["pruning"] = {"data": str(prune_data), "documents": len(samples),
                             "sentences": int(sum(len(y) for y in labels)),
                             "positive_share": float(sum(y.sum() for y in labels) / sum(len(y) for y in labels)),
                             "rows": [asdict(r) for r in rows]}
        if len({s.source for s in samples}) > 1:
            report["pruning"]["by_domain"] = domain_rows(samples, defaults)
        report["_rows"] = rows
    if rag_data:
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
                pruning[f"{name} without the passage gate (passage_margin -1)"] = rag_pruning_metrics(ungated, rag)
            if report["windows"][name] == "sentences":
                w = hybrid_setting(fam)["lexical_weight"]
                alone = rag_calls(pruner, rag, progress, f"{name}: reranking, lexical_weight 0", windows=windows,
                                  lexical_weight=0.0)
                rr[name] = reranking_metrics(rankings_of(alone), golds)
                fused = ungated if fam.rules.lexical_weight == w else rag_calls(
                    pruner, rag, progress, f"{name}: reranking, lexical_weight {w}", windows=windows, lexical_weight=w)
                rr[f"{name} + lexical (weight {w})"] = reranking_metrics(rankings_of(fused), golds)
            else:
                rr[name] = reranking_metrics(rankings_of(ungated), golds)
        report["reranking"] = {"data": str(rag_data), "metrics": rr}
        report["rag"] = {"data": str(rag_data), "queries": len(rag),
                         "passages": sum(len(s.passages) for s in rag), "metrics": pruning, "by_domain": by_domain}
    return report
