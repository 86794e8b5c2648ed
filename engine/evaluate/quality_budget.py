"""`prune eval --budgets`: what a token budget keeps (#57), beside the threshold's figures.

For each model and budget (tokens of the model's own tokenizer, engine.pipeline.budget):
- on sentence-labelled data (--data): the sentence F1 of what each document keeps, one
  call per document on the dataset's own sentences, at the family's defaults and then cut
  to the budget; and the mean tokens kept;
- on RAG-shaped data (--rag-data): the share of answer passages that keep something (the
  budget spans the call's 20 passages), the share of other passages emptied, and the mean
  tokens a call keeps.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from engine.datafiles import progress as progress_bar
from engine.evaluate.quality import sentence_metrics
from engine.evaluate.rag_quality import rag_pruning_metrics

BUDGETS = (100, 200, 400, 800)


def _kept_tokens(results: Sequence[Any], count) -> int:
    return sum(count.count(r.pruned_context) for r in results)


def prune_budget_rows(
    name: str,
    pruner,
    samples: Sequence[Any],
    budgets: Sequence[int],
    progress: bool,
    windows: str | None = None,
) -> list[dict[str, Any]]:
    """One row per setting (the defaults, then each budget): sentence P/R/F1 against the
    labels and the mean tokens a document keeps."""
    from engine.pipeline import budget as budget_mod

    count = budget_mod.counter(None, pruner.encoder.tokenizer)
    labels = [s.labels for s in samples]
    rows = []
    for b in (None, *budgets):
        preds, tokens = [], []
        for s in progress_bar(samples, len(samples), f"{name}: budget {b}", progress):
            r = pruner.prune(s.question, [s.context], sentences=[s.spans], windows=windows, budget_tokens=b)
            preds.append(np.array([x.kept for x in r[0].sentences]))
            tokens.append(_kept_tokens(r, count))
        rows.append(
            {
                "model": name,
                "budget_tokens": b,
                **sentence_metrics(preds, labels),
                "mean_tokens_kept": float(np.mean(tokens)) if tokens else 0.0,
            }
        )
    return rows


def rag_budget_rows(
    name: str,
    pruner,
    samples: Sequence[Any],
    budgets: Sequence[int],
    progress: bool,
    windows: str | None = None,
) -> list[dict[str, Any]]:
    """One row per setting (the defaults, then each budget): the RAG pruning metrics and
    the mean tokens a call keeps."""
    from engine.pipeline import budget as budget_mod

    count = budget_mod.counter(None, pruner.encoder.tokenizer)
    rows = []
    for b in (None, *budgets):
        calls = [
            pruner.prune(s.question, s.passages, windows=windows, budget_tokens=b)
            for s in progress_bar(samples, len(samples), f"{name}: RAG calls, budget {b}", progress)
        ]
        metrics = rag_pruning_metrics(calls, samples)
        rows.append(
            {
                "model": name,
                "budget_tokens": b,
                "gold_with_something_kept": metrics["gold_with_something_kept"],
                "non_gold_emptied": metrics["non_gold_emptied"],
                "mean_tokens_kept": float(np.mean([_kept_tokens(c, count) for c in calls])) if calls else 0.0,
            }
        )
    return rows


def budget_table(rows: Sequence[dict[str, Any]], rag: bool) -> str:
    """The rows as a markdown table."""
    if rag:
        head = [
            "| model | budget (tokens) | answer passages kept | other passages emptied | tokens kept per call |",
            "|---|---|---|---|---|",
        ]
        body = [
            f"| {r['model']} | {r['budget_tokens'] or 'none (defaults)'} | {r['gold_with_something_kept']:.1%} | "
            f"{r['non_gold_emptied']:.1%} | {r['mean_tokens_kept']:.0f} |"
            for r in rows
        ]
    else:
        head = [
            "| model | budget (tokens) | sentence P (micro) | R | F1 | tokens kept per document |",
            "|---|---|---|---|---|---|",
        ]
        body = [
            f"| {r['model']} | {r['budget_tokens'] or 'none (defaults)'} | {r['micro']['precision']:.3f} | "
            f"{r['micro']['recall']:.3f} | {r['micro']['f1']:.3f} | {r['mean_tokens_kept']:.0f} |"
            for r in rows
        ]
    return "\n".join(head + body)
