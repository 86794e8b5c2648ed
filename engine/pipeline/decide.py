"""Sentence decisions and results: threshold, title rule, backoff, reorder / top_k.

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
per window, as the OpenSearch pipeline does; `fuse_lexical`: the lexical score fused in),
and `decide_passages` applies the rules to a whole call. `engine.pruner` only orders the
steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from engine.pipeline import lexical, token_compress
from engine.pipeline.families import Family, Rules


@dataclass(frozen=True)
class Sentence:
    """One sentence of a passage: text, character span, keep probability, decision."""

    text: str
    start: int
    end: int
    probability: float
    kept: bool


@dataclass
class PruneResult:
    """One passage's answer: its pruned text, sentences, reranking score and compression."""

    index: int  # position of the passage in the call's input
    context: str  # the passage, untouched
    pruned_context: str  # kept sentences in order, original text and separators
    reranking_score: float | None  # raw rerank logit (0.0 for families without a rerank head;
    # None for an empty passage, which is not run)
    sentences: list[Sentence]
    compression_rate: float  # share of characters removed, 0..1
    threshold: float
    blocks: int = 1  # model windows the passage needed
    windows: str = "sentences"  # how the passage was cut: "sentences" or "reference"
    # who cut it into sentences: "engine", "reference" (the family's own splitter), "caller" (sentences=)
    splitter: str = "engine"
    lexical_weight: float = 0.0  # the lexical score's share in the probabilities (engine.pipeline.lexical)
    budget: Any = None  # engine.pipeline.budget.Budget when the call set budget_tokens
    # share of the passage's non-space characters the model does not see as written ([UNK], dropped,
    # a mark stripped; engine.pipeline.unknown_text); None: not measured (a Triton text model's client)
    unknown_share: float | None = None
    # the kept text compressed by the token compressor (engine.pipeline.token_compress), when the
    # call set compress_rate or compress_target_token: its text, and its words as passage spans
    compressed_context: str | None = None
    compressed_spans: list[tuple[int, int]] | None = None

    @property
    def highlights(self) -> list[dict[str, Any]]:
        """Kept sentences as OpenSearch-style `{text, start, end, probability}` spans."""
        return [
            {"text": s.text, "start": s.start, "end": s.end, "probability": s.probability}
            for s in self.sentences
            if s.kept
        ]

    def highlight(self, pre: str | Sequence[str] = "<em>", post: str | Sequence[str] = "</em>") -> str:
        """The passage with every kept sentence wrapped in `pre` ... `post`; lists of tags
        rotate by match (the k-th kept sentence takes pre[k % len(pre)], as Milvus's
        pre_tags and post_tags do)."""
        out, pos = [], 0
        for k, s in enumerate(s for s in self.sentences if s.kept):
            out += [self.context[pos : s.start], _tag(pre, k), self.context[s.start : s.end], _tag(post, k)]
            pos = s.end
        out.append(self.context[pos:])
        return "".join(out)

    def fragments(
        self, pre: str | Sequence[str] = "<em>", post: str | Sequence[str] = "</em>", whole: bool = False
    ) -> tuple[list[str], list[float]]:
        """Milvus's semantic-highlight fragments and their scores: each kept sentence tagged,
        with its probability; `whole`: one fragment, the passage as `highlight` tags it,
        scored by its best kept sentence. Nothing kept: no fragments."""
        kept = [s for s in self.sentences if s.kept]
        if not kept:
            return [], []
        if whole:
            return [self.highlight(pre, post)], [max(float(s.probability) for s in kept)]
        return (
            [_tag(pre, k) + self.context[s.start : s.end] + _tag(post, k) for k, s in enumerate(kept)],
            [float(s.probability) for s in kept],
        )

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready values (what `prune run --json` prints); `budget` and the
        compressed text only when the call had them, `unknown_share` only where it was measured."""
        out = asdict(self)
        for name in ("budget", "unknown_share", "compressed_context", "compressed_spans"):
            if out[name] is None:
                del out[name]
        return out


def _tag(tags: str | Sequence[str], k: int) -> str:
    """The tag of the k-th match: `tags` itself, or its items in rotation."""
    return tags if isinstance(tags, str) else tags[k % len(tags)]


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
    """The in-passage lexical score fused with the model's at `weight` (engine.pipeline.lexical):
    each sentence's probability, and each passage's reranking score."""
    if not weight:
        return scored
    for p, sp, sc in zip(passages, spans, scored):
        sc.probs = lexical.fuse(sc.probs, lexical.sentence_scores(question, [p[a:b] for a, b in sp]), weight)
        if sc.rerank is not None:
            sc.rerank = float(lexical.fuse(sc.rerank, lexical.passage_score(question, p), weight))
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
    `unknown` each passage's unknown_share (engine.pipeline.unknown_text; None: not measured)."""
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
