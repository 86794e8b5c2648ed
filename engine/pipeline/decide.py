"""Sentence decisions: threshold, title rule, backoff, reorder / top_k.

Rules, in order, for one passage with sentence probabilities p:
1. keep sentence i when p[i] > threshold (Provence-type families) or p[i] >= threshold
   (the OpenSearch highlighter), as each family's reference does;
2. backoff (when `alpha` is set): if no sentence is kept and the best p >= alpha, keep the
   best one;
3. title rule "first_sentence": the first sentence is the passage's title; it is kept
   when it passes rule 1 itself or when some other sentence is kept. As in the
   families' own code, the rule only ever forces the title in, never out.

And one rule for the whole call (`gate_passages`), when the call has a passage margin m
(the embedding family's default; off for the trained families unless a call sets it):
4. passage gate: a passage whose reranking score is below the call's best minus m keeps
   nothing (empty pruned text), whatever its sentences scored.

The gate only ever empties passages, and a passage it empties within part of a call it
also empties within the whole call (the whole call's best is at least the part's). So a
call cut into requests and gated again once whole (the text model's client does) gives
exactly the whole call's results.

Before the rules, the model's per-block outputs become per-passage scores here too
(`merge_blocks`: a long passage's blocks merged; `window_decisions`: token windows decide
per window, as the OpenSearch pipeline does; `fuse_lexical`: the in-passage lexical score,
the last section, fused in),
and `decide_passages` applies the rules to a whole call. `engine.pruner` only orders the
steps.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from engine.pipeline import token_compress
from engine.pipeline.families import Family
from engine.pipeline.inputs import Rules
from engine.pipeline.results import PruneResult, Sentence


def keep_mask(
    probs: np.ndarray, family: Family, threshold: float, title: str, alpha: float | None
) -> np.ndarray:
    """The kept flags of one passage's sentences (rules in the module docstring)."""
    n = len(probs)
    kept = probs > threshold if family.rules.keep_rule == "gt" else probs >= threshold
    kept = np.asarray(kept, dtype=bool).copy()
    use_title = title == "first_sentence" and n > 1
    body = slice(1, None) if use_title else slice(0, None)
    if alpha is not None and n and not kept[body].any():
        best = int(np.argmax(probs[body])) + (1 if use_title else 0)
        if probs[best] >= alpha:
            kept[best] = True
    if use_title:
        kept[0] = bool(kept[0] or kept[1:].any())
    return kept


def build_result(
    index: int,
    context: str,
    spans: list[tuple[int, int]],
    probs: np.ndarray,
    kept: np.ndarray,
    reranking_score: float | None,
    threshold: float,
    blocks: int,
    windows: str = "sentences",
    lexical_weight: float = 0.0,
    splitter: str = "engine",
    unknown_share: float | None = None,
) -> PruneResult:
    """A PruneResult from a passage's sentence spans, probabilities and kept flags."""
    sentences = [Sentence(context[s:e], s, e, float(p), bool(k)) for (s, e), p, k in zip(spans, probs, kept)]
    parts: list[str] = []
    prev_end = None
    for i, s in enumerate(sentences):
        if not s.kept:
            continue
        if prev_end is not None:
            # The original whitespace before this sentence keeps paragraph breaks and
            # CJK (no space) intact; a sentence after a pruned one gets the same.
            gap = context[spans[i - 1][1] : s.start] if i > 0 else ""
            parts.append(gap if gap.strip() == "" else " ")
        parts.append(s.text)
        prev_end = s.end
    pruned = "".join(parts)
    rate = 1.0 - len(pruned) / len(context) if context else 0.0
    return PruneResult(
        index=index,
        context=context,
        pruned_context=pruned,
        reranking_score=reranking_score,
        sentences=sentences,
        compression_rate=max(0.0, rate),
        threshold=threshold,
        blocks=blocks,
        windows=windows,
        lexical_weight=float(lexical_weight),
        splitter=splitter,
        unknown_share=unknown_share,
    )


def gate_passages(results: list[PruneResult], margin: float | None) -> list[PruneResult]:
    """Rule 4 (module docstring): empty every passage whose reranking score is below the
    call's best minus `margin` (None: no gate). Scores are compared as float32, the
    precision the Triton text model sends them in, so every surface decides alike."""
    if margin is None:
        return results
    scores = [np.float32(r.reranking_score) for r in results if r.reranking_score is not None]
    if not scores:
        return results
    floor = np.float32(max(scores)) - np.float32(margin)
    return [
        r if r.reranking_score is None or np.float32(r.reranking_score) >= floor else emptied(r)
        for r in results
    ]


def with_kept(result: PruneResult, kept: Sequence[bool]) -> PruneResult:
    """The result with other kept flags (its pruned text and compression made again)."""
    spans = [(s.start, s.end) for s in result.sentences]
    probs = np.array([s.probability for s in result.sentences], dtype=np.float64)
    rebuilt = build_result(
        result.index,
        result.context,
        spans,
        probs,
        np.array(kept, dtype=bool),
        result.reranking_score,
        result.threshold,
        result.blocks,
        result.windows,
        result.lexical_weight,
        result.splitter,
        result.unknown_share,
    )
    return token_compress.restrict(result, replace(rebuilt, budget=result.budget))


def emptied(result: PruneResult) -> PruneResult:
    """The result with nothing kept: no sentence marked, an empty pruned text."""
    if not any(s.kept for s in result.sentences):
        return result
    return replace(
        result,
        sentences=[replace(s, kept=False) for s in result.sentences],
        pruned_context="",
        compression_rate=1.0 if result.context else 0.0,
    )


def order_results(results: list[PruneResult], reorder: bool, top_k: int | None) -> list[PruneResult]:
    """Input order by default; by reranking score (best first) with reorder or top_k."""
    if not reorder and top_k is None:
        return results
    ranked = sorted(results, key=lambda r: (r.reranking_score is None, -(r.reranking_score or 0.0), r.index))
    return ranked[:top_k] if top_k is not None else ranked


# --------------------------------------------------------------------------- scores


@dataclass
class Scored:
    """One passage's model scores after its blocks are merged."""

    probs: np.ndarray  # per sentence
    rerank: float | None  # None: an empty passage, not run
    blocks: int
    kept: np.ndarray | None = None  # token windows: the union of the windows' own decisions


def merge_blocks(
    family: Family,
    n_passages: int,
    spans: Sequence[Sequence[tuple[int, int]]],
    blocks: Sequence[Any],
    outputs: Sequence[tuple[float, np.ndarray]],
    unweighted: bool = False,
) -> list[Scored]:
    """Per passage: sentence probabilities (a sentence's pieces over several blocks merged
    weighted by their tokens, or as a plain mean with `unweighted`, OpenProvence's
    fragments) and the reranking score (the first block's, or the best block's where the
    family merges by "max"; its sigmoid where the family reports that). `blocks` are
    `engine.pipeline.encode.Block`s, `outputs` (rerank score, slot probabilities) per block."""
    weighted = [np.zeros(len(sp)) for sp in spans]
    tokens = [np.zeros(len(sp)) for sp in spans]
    rerank: list[float | None] = [None] * n_passages
    n_blocks = [0] * n_passages
    use_max = family.rerank_merge == "max"
    sigmoid = family.rerank_transform == "sigmoid"
    for block, (score, probs) in zip(blocks, outputs):
        i = block.passage
        n_blocks[i] += 1
        if sigmoid:
            score = float(1.0 / (1.0 + np.exp(-score)))
        if block.first and not use_max:
            rerank[i] = score
        elif use_max:
            rerank[i] = score if rerank[i] is None else max(rerank[i], score)
        for (sent, n_tok), p in zip(block.units, probs):
            w = 1 if unweighted else n_tok
            weighted[i][sent] += p * w
            tokens[i][sent] += w
    return [
        Scored(
            probs=np.divide(weighted[i], tokens[i], out=np.zeros_like(weighted[i]), where=tokens[i] > 0),
            rerank=rerank[i],
            blocks=n_blocks[i],
        )
        for i in range(n_passages)
    ]


def window_decisions(
    family: Family,
    scored: list[Scored],
    blocks: Sequence[Any],
    outputs: Sequence[tuple[float, np.ndarray]],
    threshold: float,
    alpha: float | None,
) -> list[Scored]:
    """`scored` decided the way token windows decide: each window keeps its own sentences
    (threshold, then backoff within the window); a sentence is kept when any window keeps
    it, and its probability is its best over the windows."""
    probs = [np.zeros(len(sc.probs)) for sc in scored]
    kept = [np.zeros(len(sc.probs), dtype=bool) for sc in scored]
    for block, (_, p) in zip(blocks, outputs):
        mine = keep_mask(p, family, threshold, "none", alpha)
        i = block.passage
        for k, (sent, _) in enumerate(block.units):
            probs[i][sent] = max(probs[i][sent], p[k])
            kept[i][sent] |= bool(mine[k])
    for sc, pr, kp in zip(scored, probs, kept):
        sc.probs, sc.kept = pr, kp
    return scored


def fuse_lexical(
    scored: list[Scored],
    question: str,
    passages: Sequence[str],
    spans: Sequence[Sequence[tuple[int, int]]],
    weight: float,
) -> list[Scored]:
    """The in-passage lexical score fused with the model's at `weight` (the lexical section below):
    each sentence's probability, and each passage's reranking score."""
    if not weight:
        return scored
    for p, sp, sc in zip(passages, spans, scored):
        sc.probs = fuse_scores(sc.probs, lexical_sentence_scores(question, [p[a:b] for a, b in sp]), weight)
        if sc.rerank is not None:
            sc.rerank = float(fuse_scores(sc.rerank, lexical_passage_score(question, p), weight))
    return scored


def decide_passages(
    family: Family,
    rules: Rules,
    question: str,
    passages: Sequence[str],
    spans: Sequence[Sequence[tuple[int, int]]],
    scored: list[Scored],
    tokenizer: Any = None,
    splitter: str | None = None,
    unknown: Sequence[float] | None = None,
    compress: token_compress.Compress | None = None,
) -> list[PruneResult]:
    """A call's results from its passages' scores: the lexical fusion, then per passage
    the sentence rules (or the token windows' own decisions) and the family's zero-rerank
    rule, then the passage gate over the call, then the order. `splitter` is what each result
    records as having cut it (None: the rules' splitter; "caller" for the caller's sentences);
    `unknown` each passage's unknown_share (engine.pipeline.encode; None: not measured)."""
    scored = fuse_lexical(scored, question, passages, spans, rules.lexical_weight)
    results = []
    for i, (p, sp, sc) in enumerate(zip(passages, spans, scored)):
        kept = (
            sc.kept
            if sc.kept is not None
            else keep_mask(sc.probs, family, rules.threshold, rules.title, rules.alpha)
        )
        # OpenProvence's process(): a passage with nothing kept scores 0.0
        rerank = (
            0.0 if family.zero_rerank_when_empty and sc.rerank is not None and not kept.any() else sc.rerank
        )
        results.append(
            build_result(
                i,
                p,
                sp,
                sc.probs,
                kept,
                rerank,
                rules.threshold,
                sc.blocks,
                windows=rules.windows,
                lexical_weight=rules.lexical_weight,
                splitter=splitter or rules.splitter,
                unknown_share=None if unknown is None else unknown[i],
            )
        )
    return call_rules(results, rules, tokenizer, compress)


def call_rules(
    results: list[PruneResult],
    rules: Rules,
    tokenizer: Any = None,
    compress: token_compress.Compress | None = None,
) -> list[PruneResult]:
    """The rules over a whole call's results, in their order: the passage gate, then the
    order and top_k, then the token compression (with `compress`, when the call asks), then the
    budget (counted by the model's `tokenizer` unless the call names one). The in-process pruner
    and the text model's client both end a call here."""
    ordered = order_results(gate_passages(results, rules.passage_margin), rules.reorder, rules.top_k)
    if rules.compresses:
        ordered = token_compress.compress_results(ordered, rules, compress)
    return within_budget(ordered, rules, tokenizer)


def within_budget(results: list[PruneResult], rules: Rules, tokenizer: Any = None) -> list[PruneResult]:
    """Rule 5, last: with a call's `budget_tokens`, the results cut to the budget
    (engine.pipeline.budget), counted by `rules.budget_tokenizer`, else by the model's `tokenizer`."""
    if rules.budget_tokens is None:
        return results
    from engine.pipeline import budget

    return budget.apply_budget(
        results, rules.budget_tokens, budget.counter(rules.budget_tokenizer, tokenizer), with_kept
    )


# The in-passage lexical score, fused with the model's (`lexical_weight`).
#
# A similarity model keeps the sentence most *like* the question (often a title or a
# restatement); lexical overlap finds the sentence that names what is asked about. The
# fusion runs on the client side of the core, in `Pruner.finish`, so the in-process
# pruner and the Triton text model (which runs the same Pruner) give the same results.
#
# - A sentence's lexical score: Okapi BM25 (k1 1.5, b 0.75) of the question against the
#   passage's sentences, with the IDF taken from those sentences (no corpus, no language
#   data), divided by the passage's best, so it lies in [0, 1].
# - A passage's lexical score (for its reranking score): the share of the question's
#   distinct words that occur in it, in [0, 1]; it depends on that passage alone, so a call
#   cut into several requests scores exactly as the whole call.
# - Fusion: (1 - w) * model + w * lexical, for the sentence probabilities and the reranking
#   score alike; w = 0 leaves the model's scores untouched.
#
# Words (`lexical_words`): Unicode word characters (`\w+`), case-folded; Chinese, Japanese and
# Korean runs as overlapping character bigrams. The settings were chosen on squad-dev and
# coqa-dev (docs/quality.md).

_WORD = re.compile(r"\w+")
#: Scripts written without spaces between words: Han (CJK ideographs and their
#: extensions and compatibility forms), Hiragana, Katakana (with its phonetic extensions
#: and half-width forms) and Hangul (syllables, jamo, compatibility jamo).
_CJK = (
    "\u1100-\u11ff\u2e80-\u2fdf\u3005-\u3007\u3021-\u3029\u3031-\u3035\u3038-\u303c"
    "\u3040-\u309f\u30a0-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff\uf900-\ufaff\uff66-\uff9f\uffa0-\uffdc"
    "\U00020000-\U0003134f"
)
_CJK_RUN = re.compile(f"[{_CJK}]+|[^{_CJK}]+")
_IS_CJK = re.compile(f"[{_CJK}]")
K1, B = 1.5, 0.75


def lexical_words(text: str) -> list[str]:
    """The words of `text`, case-folded: runs of Unicode word characters (`\\w+`); within
    them, a run of Chinese, Japanese or Korean characters becomes its overlapping character
    bigrams (a lone character stays a unigram), as Lucene's CJK analyzer indexes text that
    has no spaces between words ("東京タワー" -> 東京, 京タ, タワ, ワー)."""
    out: list[str] = []
    for token in _WORD.findall(text):
        token = token.casefold()
        if not _IS_CJK.search(token):
            out.append(token)
            continue
        for run in _CJK_RUN.findall(token):
            if not _IS_CJK.match(run):
                out.append(run)
            elif len(run) == 1:
                out.append(run)
            else:
                out.extend(run[i : i + 2] for i in range(len(run) - 1))
    return out


def lexical_sentence_scores(
    question: str, sentences: Sequence[str], k1: float = K1, b: float = B
) -> np.ndarray:
    """Each sentence's BM25 against the question, IDF from these sentences, divided by the best."""
    docs = [lexical_words(s) for s in sentences]
    n = len(docs)
    if n == 0:
        return np.zeros(0)
    query = set(lexical_words(question))
    avgdl = sum(len(d) for d in docs) / n or 1.0
    df = Counter(w for d in docs for w in set(d) if w in query)
    idf = {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}
    out = np.zeros(n)
    for i, d in enumerate(docs):
        tf = Counter(w for w in d if w in idf)
        norm = k1 * (1 - b + b * len(d) / avgdl)
        out[i] = sum(idf[w] * f * (k1 + 1) / (f + norm) for w, f in tf.items())
    best = out.max()
    return out / best if best > 0 else out


def lexical_passage_score(question: str, passage: str) -> float:
    """The share of the question's distinct words that the passage holds."""
    query = set(lexical_words(question))
    if not query:
        return 0.0
    return len(query & set(lexical_words(passage))) / len(query)


def fuse_scores(model: np.ndarray | float, lexical: np.ndarray | float, weight: float) -> np.ndarray | float:
    """(1 - weight) * model + weight * lexical; the model's scores as they are at weight 0."""
    if weight == 0:
        return model
    return (1.0 - weight) * model + weight * lexical
