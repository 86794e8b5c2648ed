"""Haystack 2.x: `PruneRanker`, a component with `run(query, documents)` and `run_async`
(pip install 'prune-engine[haystack]').

    from haystack import Pipeline
    from engine.integrations.haystack import PruneRanker
    pipe = Pipeline()
    pipe.add_component("retriever", InMemoryBM25Retriever(document_store=store))
    pipe.add_component("pruner", PruneRanker(pruner="default"))
    pipe.connect("retriever.documents", "pruner.documents")

Each document comes back as a copy whose content is its pruned text, `meta["pruning"]`
(the original text, scores, spans, the highlighted text; engine.integrations.common) and
the reranking score as its `score`. A document with no text content (a blob, an image)
or empty text is passed through unchanged. The input documents are not changed."""
from __future__ import annotations

import dataclasses
from typing import Any

try:
    from haystack import Document, component
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("engine.integrations.haystack needs haystack-ai 2.x: pip install 'prune-engine[haystack]'") from exc

from engine.integrations.common import Outcome, PruneOptions, aprune_contents, prune_contents, pruning_metadata, resolve_pruner


@component
class PruneRanker:
    """Sentence-level pruning (and, with top_k or reorder, reranking) of documents."""

    def __init__(self, pruner: Any, *, threshold: float | None = None, top_k: int | None = None,
                 reorder: bool = False, keep_empty: bool = False, title: str | None = None,
                 alpha: float | None = None, windows: str | None = None, lexical_weight: float | None = None,
                 passage_margin: float | None = None, pre: str = "<em>", post: str = "</em>",
                 metadata_key: str = "pruning"):
        self.pruner = resolve_pruner(pruner)
        self.options = PruneOptions.of(threshold=threshold, top_k=top_k, reorder=reorder, keep_empty=keep_empty,
                                       title=title, alpha=alpha, windows=windows, lexical_weight=lexical_weight,
                                       passage_margin=passage_margin, pre=pre, post=post, metadata_key=metadata_key)

    def _opts(self, top_k: int | None) -> PruneOptions:
        return self.options.with_top_k(top_k)

    @staticmethod
    def _shape(documents: list[Document], outcomes: list[Outcome], opts: PruneOptions) -> dict[str, list[Document]]:
        out = []
        for o in outcomes:
            doc = documents[o.index]
            meta = dict(doc.meta)
            if o.result is None:
                meta[opts.metadata_key] = {"skipped": o.skipped}
                out.append(dataclasses.replace(doc, meta=meta))
            else:
                meta[opts.metadata_key] = pruning_metadata(o.result, opts)
                out.append(dataclasses.replace(doc, content=o.result.pruned_context, meta=meta,
                                               score=o.result.reranking_score))
        return {"documents": out}

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document], top_k: int | None = None) -> dict[str, list[Document]]:
        opts = self._opts(top_k)
        return self._shape(documents, prune_contents(self.pruner, query, [d.content for d in documents], opts), opts)

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, documents: list[Document],
                        top_k: int | None = None) -> dict[str, list[Document]]:
        opts = self._opts(top_k)
        outcomes = await aprune_contents(self.pruner, query, [d.content for d in documents], opts)
        return self._shape(documents, outcomes, opts)
