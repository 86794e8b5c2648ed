"""LangChain: `PruneCompressor`, a `BaseDocumentCompressor` for
`ContextualCompressionRetriever` (pip install 'prune-engine[langchain]').

    from langchain_classic.retrievers import ContextualCompressionRetriever
    from engine.integrations.langchain import PruneCompressor
    retriever = ContextualCompressionRetriever(base_compressor=PruneCompressor(pruner="default"),
                                               base_retriever=your_retriever)
    docs = retriever.invoke("What is socarrat?")   # pruned page_content, metadata["pruning"]

Each document's `page_content` becomes its pruned text; `metadata["pruning"]` holds the
original text, scores, spans and the highlighted text (engine.integrations.common). The
input documents are not changed: the compressor returns new ones."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    from langchain_core.callbacks import Callbacks
    from langchain_core.documents import Document
    from langchain_core.documents.compressor import BaseDocumentCompressor
    from langchain_core.embeddings import Embeddings
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("engine.integrations.langchain needs langchain-core: pip install 'prune-engine[langchain]'") from exc
from pydantic import ConfigDict, Field, PrivateAttr

from engine.integrations.common import (Outcome, PruneOptions, aprune_contents, options_of, prune_contents,
                                        pruning_metadata, resolve_pruner)


class PruneCompressor(BaseDocumentCompressor):
    """Sentence-level pruning of retrieved documents, in one call per query."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    pruner: Any = Field(description="a Pruner (in-process or Pruner.connect), an HttpPruner, the HTTP API's "
                                    "URL, an exported folder, or 'default'")
    threshold: float | None = None
    top_k: int | None = None
    reorder: bool = False
    keep_empty: bool = False
    title: str | None = None
    alpha: float | None = None
    windows: str | None = None
    lexical_weight: float | None = None
    passage_margin: float | None = None
    pre: str = "<em>"
    post: str = "</em>"
    metadata_key: str = "pruning"
    _engine: Any = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        self._engine = resolve_pruner(self.pruner)

    def _shape(self, documents: Sequence[Document], outcomes: list[Outcome], opts: PruneOptions) -> list[Document]:
        out = []
        for o in outcomes:
            doc = documents[o.index]
            meta = dict(doc.metadata)
            if o.result is None:
                meta[opts.metadata_key] = {"skipped": o.skipped}
                out.append(Document(page_content=doc.page_content, metadata=meta, id=doc.id))
            else:
                meta[opts.metadata_key] = pruning_metadata(o.result, opts)
                out.append(Document(page_content=o.result.pruned_context, metadata=meta, id=doc.id))
        return out

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        opts = options_of(self)
        return self._shape(documents, prune_contents(self._engine, query, [d.page_content for d in documents], opts),
                           opts)

    async def acompress_documents(self, documents: Sequence[Document], query: str,
                                  callbacks: Callbacks | None = None) -> Sequence[Document]:
        opts = options_of(self)
        outcomes = await aprune_contents(self._engine, query, [d.page_content for d in documents], opts)
        return self._shape(documents, outcomes, opts)


class EngineEmbeddings(Embeddings):
    """The engine's retrieval encoder (all-MiniLM-L6-v2 in ONNX Runtime, `prune export
    --encoder`; 'default': exported on first use) as LangChain `Embeddings`, for a vector
    store in front of the compressor."""

    def __init__(self, encoder: Any = "default", *, threads: int | None = None):
        from engine.rag.embedder import Embedder
        self.encoder = Embedder.load(encoder, threads=threads) if isinstance(encoder, (str, Path)) else encoder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.encoder.encode(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.encoder.encode([text], what="query")[0].tolist()
