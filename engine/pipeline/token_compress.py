"""A call's token compression of what it keeps (`compress_rate`, `compress_target_token`): the
token compressor beside the pruner (LLMLingua-2, engine.compressor) runs on the pruned text of
every passage the call returns, so one call reranks, prunes sentences and drops tokens.

Where it runs: after the passage gate, the order and top_k (engine.pipeline.decide.call_rules),
before the budget, which then counts the compressed text (engine.pipeline.budget.reader_text).
How: the passages' pruned texts go to the compressor in one call, each a context of its own
(LLMLingua-2's token-level filter, its context-level filter off: no passage is dropped here, the
gate and top_k decide that), at `compress_rate` (the share of tiktoken tokens kept, per chunk as
LLMLingua-2 does) or `compress_target_token` (about that many tokens in all: LLMLingua-2's
target_token over the call's pruned texts). The compressor's kept words, character spans of each
pruned text, are mapped back to the passage (`compressed_spans`, pieces that fell on a separator
left out), and `compressed_context` is those words with the passage's own separators: the original
whitespace between adjacent kept words, a space where words between them were dropped (nothing in
text written without spaces, where no whitespace was there), so a caller may also rebuild it with its
own spacing from the spans. A result keeps its sentences and their decisions; `pruned_context` is
still the kept sentences whole.

The compressor is a callable (the pruner's: `Pruner.load(..., compressor=Compressor.load(DIR))`); this module
imports none of it. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from engine.errors import InputError

#: the compressor as the pipeline calls it: (pruned texts, rate, target_token) -> each text's kept
#: words as (start, end) character spans of that text
Compress = Callable[[list[str], "float | None", "int | None"], list[list[tuple[int, int]]]]

NO_COMPRESSOR = (
    "compress_rate and compress_target_token need a token compressor beside the pruner (LLMLingua-2): "
    "Pruner.load(MODEL, compressor=Compressor.load(DIR)), prune run/api --compressor DIR"
)


def check_compressor(rules: Any, compress: Compress | None) -> None:
    """InputError when the call compresses and no compressor is there (before the model runs)."""
    if rules.compresses and compress is None:
        raise InputError(NO_COMPRESSOR)


def compress_results(results: list[Any], rules: Any, compress: Compress | None) -> list[Any]:
    """`results` (PruneResult) with `compressed_context` and `compressed_spans` when the call
    compresses (`rules.compresses`); unchanged otherwise."""
    if not rules.compresses:
        return results
    check_compressor(rules, compress)
    todo = [k for k, r in enumerate(results) if r.pruned_context.strip()]
    # a call that kept nothing has nothing to compress (the compressor refuses an empty list)
    spans = (
        compress([results[k].pruned_context for k in todo], rules.compress_rate, rules.compress_target_token)
        if todo
        else []
    )
    if len(spans) != len(todo):
        raise RuntimeError(f"the compressor answered {len(spans)} texts for {len(todo)}")
    words: dict[int, list[tuple[int, int]]] = dict(zip(todo, (list(s) for s in spans)))
    out = []
    for k, r in enumerate(results):
        in_passage = to_passage(r, words[k]) if k in words else []
        out.append(replace(r, compressed_spans=in_passage, compressed_context=rebuild(r.context, in_passage)))
    return out


def to_passage(result: Any, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans of `result.pruned_context` as spans of its passage: each kept sentence's place in the
    pruned text is found in order; a span's pieces on a separator are left out."""
    segments, pos = [], 0  # (start in the pruned text, end there, start in the passage)
    for s in result.sentences:
        if not s.kept:
            continue
        at = result.pruned_context.find(s.text, pos)
        if at < 0:
            raise RuntimeError(f"sentence {s.text[:40]!r} is not in the pruned text")
        segments.append((at, at + len(s.text), s.start))
        pos = at + len(s.text)
    out: list[tuple[int, int]] = []
    for a, b in spans:
        for lo, hi, start in segments:
            if a < hi and b > lo:
                out.append((start + max(a, lo) - lo, start + min(b, hi) - lo))
    return out


def rebuild(context: str, spans: Sequence[tuple[int, int]]) -> str:
    """The kept words of `context` (`spans`, in order) with the passage's separators (see the
    module doc)."""
    parts: list[str] = []
    prev = None
    for a, b in spans:
        if prev is not None:
            gap = context[prev:a]
            if gap.strip() == "":
                parts.append(gap)
            else:
                parts.append(" " if any(c.isspace() for c in gap) else "")
        parts.append(context[a:b])
        prev = b
    return "".join(parts)


def restrict(result: Any, rebuilt: Any) -> Any:
    """`rebuilt` (the result with other kept flags: the budget's) with the compressed words of its
    kept sentences only."""
    if result.compressed_spans is None:
        return rebuilt
    kept = [(s.start, s.end) for s in rebuilt.sentences if s.kept]
    spans = [(a, b) for a, b in result.compressed_spans if any(lo <= a and b <= hi for lo, hi in kept)]
    return replace(rebuilt, compressed_spans=spans, compressed_context=rebuild(rebuilt.context, spans))
