"""Fidelity of a precision against a reference (the fp32 PyTorch module for `prune
fidelity`, the fp32 export for `prune export --precision auto`), and the gate a reduced
precision passes to be offered or picked.

Both models score the same corpus (the sentence-labelled JSONL, using its own sentence
spans, or the RAG JSONL, using the engine's splitter); the report gives

- sentence decision agreement at several thresholds (the share of sentences whose
  keep/prune decision is the same);
- max and mean |delta probability| over all sentences;
- reranking score: max |error| and Spearman rank correlation over all passages;
- the share of documents whose pruned text changed (at the family's default threshold).

Torch-free: the models are any two pruners (engine.pruner.Pruner).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from engine.datafiles import progress as progress_bar
from engine.measuring import model_scores, windows_of
from engine.datafiles import read_jsonl

THRESHOLDS = (0.1, 0.3, 0.5, 0.7, 0.9)
#: The gate a reduced precision passes to be offered (`prune fidelity` says whether it
#: does; `prune export --precision auto` picks among those that do): the share of sentence
#: decisions equal to the reference's at the family's threshold, and the Spearman
#: correlation of the reranking scores.
GATE = {"agreement": 0.99, "spearman": 0.99}


@dataclass
class Doc:
    """One evaluation document: a question and its passages."""

    question: str
    context: str
    spans: list[tuple[int, int]] | None


def load_docs(path: str | Path, limit: int | None = None) -> list[Doc]:
    """Documents from either data format: `context` (+ `sentences`) or `passages`."""
    docs: list[Doc] = []
    for n, row in enumerate(read_jsonl(path), 1):
        if not isinstance(row, dict) or not ("context" in row or "passages" in row) or "question" not in row:
            raise ValueError(
                f"{path}: record {n} has neither question and context (a prune file) nor question "
                "and passages (a RAG file)"
            )
        if "context" in row:
            spans = [(int(a), int(b)) for a, b in row["sentences"]] if "sentences" in row else None
            docs.append(Doc(row["question"], row["context"], spans))
        else:
            docs.extend(Doc(row["question"], p, None) for p in row["passages"])
        if limit is not None and len(docs) >= limit:
            return docs[:limit]
    return docs


def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (as scipy.stats.rankdata)."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of `a` and `b`."""
    ra, rb = rankdata(np.asarray(a, dtype=np.float64)), rankdata(np.asarray(b, dtype=np.float64))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def fidelity_report(
    ref_probs: Sequence[np.ndarray],
    got_probs: Sequence[np.ndarray],
    ref_rerank: Sequence[float],
    got_rerank: Sequence[float],
    ref_pruned: Sequence[str],
    got_pruned: Sequence[str],
    keep_rule: str = "gt",
    thresholds: Sequence[float] = THRESHOLDS,
) -> dict[str, Any]:
    """The figures of the module docstring from per-document outputs of both models."""
    r = np.concatenate([np.asarray(p, dtype=np.float64) for p in ref_probs]) if ref_probs else np.zeros(0)
    g = np.concatenate([np.asarray(p, dtype=np.float64) for p in got_probs]) if got_probs else np.zeros(0)
    if r.shape != g.shape:
        raise ValueError(f"sentence counts differ: {r.shape} vs {g.shape}")
    agreement = {}
    for t in thresholds:
        kr, kg = (r > t, g > t) if keep_rule == "gt" else (r >= t, g >= t)
        agreement[str(t)] = float((kr == kg).mean()) if len(r) else 1.0
    delta = np.abs(r - g)
    rr, gr = np.asarray(ref_rerank, dtype=np.float64), np.asarray(got_rerank, dtype=np.float64)
    changed = sum(a != b for a, b in zip(ref_pruned, got_pruned))
    return {
        "documents": len(ref_probs),
        "sentences": int(len(r)),
        "decision_agreement": agreement,
        "max_abs_delta_prob": float(delta.max()) if len(delta) else 0.0,
        "mean_abs_delta_prob": float(delta.mean()) if len(delta) else 0.0,
        "rerank_max_abs_error": float(np.abs(rr - gr).max()) if len(rr) else 0.0,
        "rerank_spearman": spearman(rr, gr) if len(rr) > 1 else float("nan"),
        "pruned_text_changed_share": changed / max(len(ref_pruned), 1),
    }


def run_model(pruner, docs: Sequence[Doc], progress: bool, desc: str, windows: str | None = None):
    """`pruner`'s results on every document."""
    probs, rerank, pruned = [], [], []
    fam = pruner.family
    from dataclasses import replace

    from engine.pipeline import text as textmod
    from engine.pipeline.decide import decide_passages

    rules = replace(fam.rules, lexical_weight=0.0)  # the model's own decisions, at the family's threshold
    for d in progress_bar(docs, len(docs), desc, progress):
        spans = d.spans if d.spans is not None else textmod.split_sentences(d.context)
        sc = model_scores(pruner, d.question, [d.context], [spans], windows=windows)[0]
        probs.append(sc.probs)
        rerank.append(sc.rerank if sc.rerank is not None else 0.0)
        pruned.append(decide_passages(fam, rules, d.question, [d.context], [spans], [sc])[0].pruned_context)
    return probs, rerank, pruned


def measure(
    candidate,
    reference,
    docs: Sequence[Doc],
    progress: bool = True,
    log: Callable[[str], None] = print,
    windows: str | None = None,
) -> dict[str, Any]:
    """How the candidate's decisions and scores agree with the reference's on `docs`."""
    windows = windows_of(candidate, windows)
    log(
        f"scoring {len(docs)} documents with the candidate ({candidate.backend.describe()}; windows {windows}) ..."
    )
    got = run_model(candidate, docs, progress, "candidate", windows)
    log(f"scoring {len(docs)} documents with the reference ({reference.backend.describe()}) ...")
    ref = run_model(reference, docs, progress, "reference", windows)
    thresholds = tuple(sorted(set(THRESHOLDS) | {candidate.family.rules.threshold}))
    report = fidelity_report(
        ref[0],
        got[0],
        ref[1],
        got[1],
        ref[2],
        got[2],
        candidate.family.rules.keep_rule,
        thresholds=thresholds,
    )
    report["windows"] = windows
    return report


def gate(report: dict[str, Any], threshold: float) -> dict[str, Any]:
    """Whether `report` (measure's) passes GATE at `threshold`: passed, the two figures, and
    the reason in words. A Spearman that cannot be computed (reranking scores without
    spread) leaves the decision to the agreement."""
    agreement = report["decision_agreement"][str(threshold)]
    rho = report["rerank_spearman"]
    ok_agree = agreement >= GATE["agreement"]
    ok_rho = rho != rho or rho >= GATE["spearman"]  # NaN: not measurable
    reason = (
        f"agreement {100 * agreement:.2f}% at {threshold} (>= {100 * GATE['agreement']:.0f}%: "
        f"{'yes' if ok_agree else 'no'}), Spearman {rho:.4f} (>= {GATE['spearman']}: "
        f"{'yes' if ok_rho else 'no'})"
    )
    return {"passed": bool(ok_agree and ok_rho), "agreement": agreement, "spearman": rho, "reason": reason}


def lingua_gate(
    reference: Any, candidate: Any, texts: Sequence[str], rates: Sequence[float]
) -> dict[str, Any]:
    """LLMLingua-2's gate: two compressors (engine.compressor.Compressor, the same tokenizer) on
    `texts` at each of `rates` (force token "\\n"); passed when at least GATE["agreement"] of the
    word labels (kept or not) are equal. The Spearman correlation of their token probabilities
    (every chunk's) is reported beside it, not gated: a word's label is what a caller sees."""
    from engine.pipeline.lingua_decide import CompressOptions, plan

    equal = total = 0
    ref_probs, got_probs = [], []
    for text in texts:
        for rate in rates:
            labels = []
            for model in (reference, candidate):
                r = model.compress(text, rate=rate, force_tokens=["\n"], return_word_label=True,
                                   word_sep="\x1e", label_sep="\x1f")  # fmt: skip
                labels.append([w.rsplit("\x1f", 1)[-1] for w in r.fn_labeled_original_prompt.split("\x1e")])
            if len(labels[0]) != len(labels[1]):
                raise ValueError(
                    "the two compressors split a text into different words: not the same tokenizer"
                )
            equal += sum(a == b for a, b in zip(*labels))
            total += len(labels[0])
        chunks = [
            c
            for cs in plan(reference.tokenizer, [text], CompressOptions(), reference.count).chunks
            for c in cs
        ]
        ref_probs += reference._token_probs(chunks)
        got_probs += candidate._token_probs(chunks)
    agreement = equal / total if total else 1.0
    rho = spearman(np.concatenate(ref_probs), np.concatenate(got_probs))
    ok = agreement >= GATE["agreement"]
    reason = (
        f"word agreement {100 * agreement:.2f}% over {total} word labels at rates "
        f"{', '.join(map(str, rates))} (>= {100 * GATE['agreement']:.0f}%: {'yes' if ok else 'no'}); "
        f"token probabilities' Spearman {rho:.4f} (reported)"
    )
    return {"passed": bool(ok), "agreement": agreement, "words": total, "spearman": rho, "reason": reason}


def format_report(name: str, rep: dict[str, Any]) -> str:
    """The report as text."""
    agree = " | ".join(f"{100 * v:.2f}%" for v in rep["decision_agreement"].values())
    heads = " | ".join(f"agree@{t}" for t in rep["decision_agreement"])
    return "\n".join(
        [
            f"| model | {heads} | max abs dp | mean abs dp | rerank max err | rerank Spearman | pruned text changed |",
            "|---|" + "---|" * (len(rep["decision_agreement"]) + 5),
            f"| {name} | {agree} | {rep['max_abs_delta_prob']:.2e} | {rep['mean_abs_delta_prob']:.2e} | "
            f"{rep['rerank_max_abs_error']:.2e} | {rep['rerank_spearman']:.5f} | "
            f"{100 * rep['pruned_text_changed_share']:.1f}% |",
            f"({rep['documents']} documents, {rep['sentences']} sentences)",
        ]
    )


def save(rep: dict[str, Any], path: str | Path) -> None:
    """The report as JSON at `path`."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(rep, indent=2) + "\n")
