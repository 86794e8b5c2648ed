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

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from engine.pipeline.decide import fuse_scores, lexical_sentence_scores
from engine.pipeline.families import FAMILIES
from engine.measuring import model_scores, windows_of
from engine.datafiles import PruneSample, load_prune_data
from engine.datafiles import progress as progress_bar
from engine.evaluate.bm25 import bm25_sentence_scores
from engine.evaluate.rag_quality import evaluate_rag

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
    macro = PRF(
        sum(d.precision for d in per_doc) / n,
        sum(d.recall for d in per_doc) / n,
        sum(d.f1 for d in per_doc) / n,
    )
    kept = sum(int(np.asarray(p, dtype=bool).sum()) for p in preds)
    total = sum(len(p) for p in preds)
    return {
        "micro": asdict(micro),
        "per_document": asdict(macro),
        "kept_share": kept / total if total else 0.0,
    }


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
    curve: list[dict[str, float]] = field(default_factory=list)  # precision/recall per threshold


def grid_search(
    name: str,
    scores: Sequence[np.ndarray],
    labels: Sequence[np.ndarray],
    thresholds: Sequence[float] = THRESHOLDS,
    alphas: Sequence[float | None] = ALPHAS,
    strict: bool = True,
) -> GridResult:
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
#: (engine.pipeline.decide) and the keep threshold and backoff with it. prune eval scores every
#: family's model at it (the trained families' own default weight is 0).
HYBRID = {
    "lexical_weight": FAMILIES["embedding"].rules.lexical_weight,
    "threshold": FAMILIES["embedding"].rules.lexical_threshold,
    "alpha": FAMILIES["embedding"].rules.alpha,
}


def hybrid_setting(family) -> dict[str, Any]:
    """The lexical weight, threshold and alpha `family` fuses with: its own defaults when
    its default weight is not 0, else HYBRID."""
    if family.rules.lexical_weight:
        return {
            "lexical_weight": family.rules.lexical_weight,
            "threshold": family.rules.threshold_at(family.rules.lexical_weight),
            "alpha": family.rules.alpha,
        }
    return dict(HYBRID)


def passage_lexical_scores(samples: Sequence[PruneSample]) -> list[np.ndarray]:
    """engine.pipeline.decide's sentence scores: BM25 with the IDF of the passage's own sentences."""
    return [lexical_sentence_scores(s.question, [s.context[a:b] for a, b in s.spans]) for s in samples]


def hybrid_rows(
    name: str,
    pruner,
    samples: Sequence[PruneSample],
    scores: Sequence[np.ndarray],
    labels: Sequence[np.ndarray],
    strict: bool,
) -> list[GridResult]:
    """The model's sentence scores fused with engine.pipeline.decide's (as Pruner does with
    lexical_weight): at the best setting of the grid, and at hybrid_setting's."""
    setting = hybrid_setting(pruner.family)
    w = setting["lexical_weight"]
    fused = [fuse_scores(s, lx, w) for s, lx in zip(scores, passage_lexical_scores(samples))]
    at = sentence_metrics(
        [sweep_keep(f, setting["threshold"], setting["alpha"], strict) for f in fused], labels
    )
    rows = [
        grid_search(f"{name} + lexical (weight {w})", fused, labels, strict=strict),
        GridResult(
            f"{name} + lexical (weight {w}) at threshold {setting['threshold']}, alpha {setting['alpha']}"
            + (" (its defaults)" if pruner.family.rules.lexical_weight else ""),
            at,
            setting,
        ),
    ]
    half = len(samples) // 2
    if half >= 10:  # as for the model alone: the threshold chosen on the first half, scored on the second
        tuned = grid_search(name, fused[:half], labels[:half], strict=strict).setting
        rows.append(
            GridResult(
                f"{name} + lexical (weight {w}), setting of docs 1-{half}, scored on "
                f"{half + 1}-{len(samples)}",
                sentence_metrics(
                    [sweep_keep(f, tuned["threshold"], tuned["alpha"], strict) for f in fused[half:]],
                    labels[half:],
                ),
                {"lexical_weight": w, **tuned},
            )
        )
    return rows


# --------------------------------------------------------------------------- models


def model_sentence_scores(
    pruner,
    samples: Sequence[PruneSample],
    progress: bool = True,
    windows: str | None = None,
    kept: list | None = None,
) -> list[np.ndarray]:
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


# --------------------------------------------------------------------------- report


def default_predictions(
    pruner,
    samples: Sequence[PruneSample],
    scores: Sequence[np.ndarray],
    kept: Sequence[np.ndarray | None],
    strict: bool,
    windows: str,
) -> list[np.ndarray]:
    """What `pruner` keeps of each single-passage sample at its defaults, from the model's
    own scores (`lexical_weight` 0): the family's fusion, threshold and backoff (no title
    rule: these are plain passages); the windows' own decisions where token windows
    decided. A one-passage call always passes the passage gate."""
    fam = pruner.family
    if any(k is not None for k in kept):
        return list(kept)
    w = fam.rules.lexical_weight if windows == "sentences" else 0.0
    if w:
        scores = [fuse_scores(s, lx, w) for s, lx in zip(scores, passage_lexical_scores(samples))]
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
        row = {
            "documents": len(sub),
            "bm25_best_f1": bm.best["micro"]["f1"],
            "bm25_setting": bm.setting,
            "models": {},
        }
        for name, preds in defaults.items():
            f1 = sentence_metrics([preds[i] for i in idx], labels)["micro"]["f1"]
            row["models"][name] = {"f1": f1, "over_bm25": f1 - bm.best["micro"]["f1"]}
        out["domains"][d] = row
    for name in defaults:
        worst = min(out["domains"], key=lambda d: out["domains"][d]["models"][name]["over_bm25"])
        out["worst"][name] = {"domain": worst, **out["domains"][worst]["models"][name]}
    return out


def evaluate(
    models: dict[str, Any],
    prune_data: str | Path | None,
    rag_data: str | Path | None,
    limit: int | None = None,
    rag_limit: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    windows: str | None = None,
) -> dict[str, Any]:
    """Run every model and the baselines; returns the report as a dict. `windows` (None:
    each family's default) is recorded per model in `report["windows"]`."""
    report: dict[str, Any] = {
        "pruning": None,
        "reranking": None,
        "rag": None,
        "windows": {name: windows_of(p, windows) for name, p in models.items()},
    }
    if prune_data:
        samples = load_prune_data(prune_data, limit)
        rows, defaults = _pruning_rows(models, samples, report["windows"], windows, progress, log)
        labels = [s.labels for s in samples]
        report["pruning"] = {
            "data": str(prune_data),
            "documents": len(samples),
            "sentences": int(sum(len(y) for y in labels)),
            "positive_share": float(sum(y.sum() for y in labels) / sum(len(y) for y in labels)),
            "rows": [asdict(r) for r in rows],
        }
        if len({s.source for s in samples}) > 1:
            report["pruning"]["by_domain"] = domain_rows(samples, defaults)
        report["_rows"] = rows
    if rag_data:
        weights = {name: hybrid_setting(p.family)["lexical_weight"] for name, p in models.items()}
        report["reranking"], report["rag"] = evaluate_rag(
            models, rag_data, rag_limit, report["windows"], weights, windows, progress, log
        )
    return report


def _pruning_rows(models, samples, modes, windows, progress, log) -> tuple[list[GridResult], dict[str, Any]]:
    """The baselines' and each model's rows on the sentence-labelled samples, and what each
    model keeps at its defaults (for the per-domain table)."""
    labels = [s.labels for s in samples]
    rows = [
        keep_all_baseline(labels),
        first_k_baseline(labels),
        grid_search("BM25 (sentence vs question)", bm25_sentence_scores(samples), labels),
        grid_search(
            "BM25 over the passage's own sentences (engine.pipeline.decide)",
            passage_lexical_scores(samples),
            labels,
        ),
    ]
    defaults: dict[str, list[np.ndarray]] = {}
    for name, pruner in models.items():
        log(f"scoring {len(samples)} documents with {name} (windows {modes[name]}) ...")
        strict = pruner.family.rules.keep_rule == "gt"
        kept: list = []
        scores = model_sentence_scores(pruner, samples, progress, windows=windows, kept=kept)
        defaults[name] = default_predictions(pruner, samples, scores, kept, strict, modes[name])
        rows += _model_rows(name, pruner, samples, scores, kept, strict, modes[name])
    return rows, defaults


def _model_rows(name, pruner, samples, scores, kept, strict: bool, mode: str) -> list[GridResult]:
    """One model's rows: its best grid setting, its own threshold, the hybrid's, and (on 20
    documents or more) the setting chosen on the first half scored on the second."""
    labels = [s.labels for s in samples]
    fam = pruner.family
    rows = [grid_search(name, scores, labels, strict=strict)]
    # the model's own scores at its own threshold: its defaults unless it fuses by default
    fused = fam.rules.lexical_weight and mode == "sentences"
    label = (
        f"{name} with lexical_weight 0 at threshold {fam.rules.threshold}"
        if fused
        else f"{name} at its defaults"
    )
    own = [
        k if k is not None else sweep_keep(s, fam.rules.threshold, fam.rules.alpha, strict)
        for s, k in zip(scores, kept)
    ]
    rows.append(
        GridResult(
            label,
            sentence_metrics(own, labels),
            {"threshold": fam.rules.threshold, "alpha": fam.rules.alpha, "lexical_weight": 0.0},
        )
    )
    if mode == "sentences":
        rows += hybrid_rows(name, pruner, samples, scores, labels, strict)
    half = len(samples) // 2
    if half >= 10:
        # Honest generalisation: the setting chosen on the first half, scored on the second.
        tuned = grid_search(name, scores[:half], labels[:half], strict=strict).setting
        second = [sweep_keep(s, tuned["threshold"], tuned["alpha"], strict) for s in scores[half:]]
        rows.append(
            GridResult(
                f"{name}, setting of docs 1-{half}, scored on {half + 1}-{len(samples)}",
                sentence_metrics(second, labels[half:]),
                tuned,
            )
        )
    return rows
