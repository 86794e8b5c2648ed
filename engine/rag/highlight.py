"""Highlights shaped like Milvus's hosted semantic highlighter, computed by a pruner on this
machine, added to pymilvus search results (`semantic_highlight`)."""

from __future__ import annotations

from typing import Any, Sequence

from engine.pipeline.results import PruneResult
from engine.pipeline.inputs import check_threshold
from engine.errors import InputError


def _param(highlighter: Any, name: str) -> Any:
    if highlighter is None:
        return None
    if isinstance(highlighter, dict):
        return highlighter.get(name)
    params = getattr(highlighter, "params", None)
    if isinstance(params, dict) and name in params:
        return params[name]
    return getattr(highlighter, name, None)


def semantic_highlight(
    results: Sequence[Sequence[dict]],
    pruner: Any,
    highlighter: Any = None,
    *,
    queries: Sequence[str] | None = None,
    input_fields: Sequence[str] | None = None,
    pre_tags: Sequence[str] | None = None,
    post_tags: Sequence[str] | None = None,
    threshold: float | None = None,
    highlight_only: bool | None = None,
):
    """Add `hit["highlight"] = {field: {"fragments": [...], "scores": [...]}}` to every hit
    of pymilvus search results, as Milvus's hosted semantic highlighter does, computed by
    `pruner` on this machine.

    The settings come from `highlighter` (a pymilvus `SemanticHighlighter`, or a dict of its
    parameters) and the keyword arguments, which win:
      queries: one per search query (results[i] is highlighted for queries[i]);
      input_fields: the text fields to highlight (they must be in the hits' output fields);
      pre_tags / post_tags: put around each highlighted sentence, rotating (default <em>, </em>);
      threshold: a sentence is highlighted when its probability passes it (the pruner's
        keep rule, without backoff, title rule or passage gate: each hit is highlighted on
        its own, as Milvus's highlighter does; the model's default threshold if None);
      highlight_only (default True): fragments are the highlighted sentences, each with its
        probability as score; False: one fragment, the whole text with the tags inserted,
        scored by its best sentence. A text with nothing highlighted gets no fragments.
    Returns `results`, changed in place.
    """
    queries = list(queries if queries is not None else (_param(highlighter, "queries") or []))
    fields = list(input_fields if input_fields is not None else (_param(highlighter, "input_fields") or []))
    pre = list(pre_tags if pre_tags is not None else (_param(highlighter, "pre_tags") or ["<em>"]))
    post = list(post_tags if post_tags is not None else (_param(highlighter, "post_tags") or ["</em>"]))
    threshold = threshold if threshold is not None else _param(highlighter, "threshold")
    only = highlight_only if highlight_only is not None else _param(highlighter, "highlight_only")
    only = True if only is None else bool(only)
    if not fields:
        raise InputError("input_fields must name at least one text field to highlight")
    if len(queries) != len(results):
        raise InputError(f"one query per search query: {len(results)} result lists, {len(queries)} queries")
    if not pre or not post or len(pre) != len(post):
        raise InputError("pre_tags and post_tags must be non-empty lists of the same length")
    if threshold is not None:
        threshold = check_threshold(threshold)
    for q, hits in zip(queries, results):
        per_field: dict[str, list[PruneResult | None]] = {}
        for f in fields:
            texts = []
            for hit in hits:
                entity = hit.get("entity", hit)
                if f not in entity:
                    raise InputError(f"field {f!r} is not in the search results: add it to output_fields")
                texts.append(entity[f])
            idx = [i for i, t in enumerate(texts) if isinstance(t, str) and t.strip()]
            done = (
                pruner.prune(
                    q,
                    [texts[i] for i in idx],
                    threshold=threshold,
                    alpha=-1.0,
                    title="none",
                    passage_margin=-1.0,
                )
                if idx
                else []
            )
            res: list[PruneResult | None] = [None] * len(texts)
            for i, r in zip(idx, done):
                res[i] = r
            per_field[f] = res
        for n, hit in enumerate(hits):
            hl = {}
            for f in fields:
                r = per_field[f][n]
                fragments, scores = r.fragments(pre, post, whole=not only) if r is not None else ([], [])
                hl[f] = {"fragments": fragments, "scores": scores}
            hit["highlight"] = hl
    return results
