"""Haystack 2.x: `PruneRanker`, a component with `run(query, documents)` and `run_async`
(pip install 'prune-engine[haystack]').

    from haystack import Pipeline
    from engine.integrations.haystack import PruneRanker
    pipe = Pipeline()
    pipe.add_component("retriever", InMemoryBM25Retriever(document_store=store))
    pipe.add_component("pruner", PruneRanker(pruner="default"))
    pipe.connect("retriever.documents", "pruner.documents")

Each document comes back as a copy whose content is its pruned text, `meta["pruning"]`
(the original text, scores, spans, the highlighted text; engine.integrations.adapter) and
the reranking score in [0, 1] as its `score`, as Haystack's rankers give theirs. A document
with no text content (a blob, an image)
or empty text is passed through unchanged. The input documents are not changed."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from engine.integrations.adapter import (
    Adapter,
    Outcome,
    PruneOptions,
    check_pruner,
    framework,
    relevance,
    resolve_pruner,
)

with framework(__name__, "haystack-ai 2.x", "haystack"):
    from haystack import Document, component, default_from_dict, default_to_dict


@component
class PruneRanker(Adapter):
    """Sentence-level pruning (and, with top_k or reorder, reranking) of documents.

    `pruner`: an exported folder, 'default', the HTTP API's URL, or a pruner object. The
    options are engine.pipeline.inputs.CallOptions's, by name (`top_k` as Haystack's rankers say),
    and the adapter's own (`keep_empty`, `pre`, `post`, `metadata_key`); an unknown name
    is an InputError naming the known ones. The model is opened in `warm_up()` (a
    Pipeline calls it; `run` calls it when nobody has). `to_dict`/`from_dict` round-trip
    the component, so a pipeline holding it saves and loads, when `pruner` was given as a
    folder, 'default' or a URL."""

    def __init__(self, pruner: Any, **options: Any):
        check_pruner(pruner)
        self.pruner = pruner
        self.options = PruneOptions.of(**options)
        self._engine: Any = None if isinstance(pruner, (str, Path)) else pruner

    def warm_up(self) -> None:
        """Open the model (once): a folder is loaded, a URL connected."""
        if self._engine is None:
            self._engine = resolve_pruner(self.pruner)

    def to_dict(self) -> dict[str, Any]:
        """The component as Haystack serialises it (its init parameters)."""
        if isinstance(self.pruner, (str, Path)):
            source = str(self.pruner)
        elif isinstance(getattr(self.pruner, "url", None), str) and hasattr(self.pruner, "info"):
            source = self.pruner.url  # an HttpPruner
        else:
            raise TypeError(
                "PruneRanker.to_dict needs the pruner given as an exported folder, 'default' or a URL "
                f"(it was given a {type(self.pruner).__name__} object)"
            )
        return default_to_dict(self, pruner=source, **self.options.given())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PruneRanker:
        """The component `to_dict` describes."""
        return default_from_dict(cls, data)

    def _opts(self, top_k: int | None) -> PruneOptions:
        self.warm_up()
        return self.options.with_top_k(top_k)

    @component.output_types(documents=list[Document])
    def run(
        self, query: str, documents: list[Document], top_k: int | None = None
    ) -> dict[str, list[Document]]:
        """The documents pruned for `query` (ranked with top_k or reorder)."""
        return {"documents": self._pruned(query, documents, self._opts(top_k))}

    @component.output_types(documents=list[Document])
    async def run_async(
        self, query: str, documents: list[Document], top_k: int | None = None
    ) -> dict[str, list[Document]]:
        """`run` for asyncio pipelines."""
        return {"documents": await self._apruned(query, documents, self._opts(top_k))}

    def _contents(self, documents: list[Document]) -> list[Any]:
        return [d.content for d in documents]

    def _remade(self, doc: Document, o: Outcome, opts: PruneOptions) -> Document:
        meta = {**doc.meta, opts.metadata_key: o.note(opts)}
        if o.result is None:
            return dataclasses.replace(doc, meta=meta)
        return dataclasses.replace(
            doc, content=o.result.pruned_context, meta=meta, score=relevance(self._engine, o.result)
        )
