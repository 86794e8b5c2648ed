"""LangChain: `PruneCompressor`, a `BaseDocumentCompressor` for
`ContextualCompressionRetriever` (pip install 'prune-engine[langchain]').

    from langchain_classic.retrievers import ContextualCompressionRetriever
    from engine.integrations.langchain import PruneCompressor
    retriever = ContextualCompressionRetriever(base_compressor=PruneCompressor(pruner="default"),
                                               base_retriever=your_retriever)
    docs = retriever.invoke("What is socarrat?")   # pruned page_content, metadata["pruning"]

Each document's `page_content` becomes its pruned text; `metadata["relevance_score"]` its
reranking score in [0, 1] (where LangChain's rerankers put theirs), and
`metadata["pruning"]` the original text, scores, spans and the highlighted text
(engine.integrations.adapter). `top_n` keeps the n best, as LangChain's rerankers do. The
input documents are not changed: the
compressor returns new ones."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.integrations.adapter import Outcome, PruneOptions, framework, relevance

with framework(__name__, "langchain-core", "langchain"):
    from langchain_core.callbacks import Callbacks
    from langchain_core.documents import Document
    from langchain_core.documents.compressor import BaseDocumentCompressor
    from langchain_core.embeddings import Embeddings
# after the framework: the adapter is a pydantic model, and pydantic comes with the framework
from engine.integrations.pydantic_adapter import PrunerModel, with_options


class _Compressor(PrunerModel, BaseDocumentCompressor):
    """PruneCompressor's methods; its fields (every CallOptions option, `top_k` named
    `top_n` as LangChain's rerankers say, and the adapter's own) are added below."""

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """The documents pruned for `query` (ranked with top_n or reorder)."""
        return self._pruned(query, documents, self._options())

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """`compress_documents` for asyncio code."""
        return await self._apruned(query, documents, self._options())

    def _contents(self, documents: Sequence[Document]) -> list[Any]:
        return [d.page_content for d in documents]

    def _remade(self, doc: Document, o: Outcome, opts: PruneOptions) -> Document:
        meta = {**doc.metadata, opts.metadata_key: o.note(opts)}
        if o.result is None:
            return Document(page_content=doc.page_content, metadata=meta, id=doc.id)
        meta["relevance_score"] = relevance(self._engine, o.result)
        return Document(page_content=o.result.pruned_context, metadata=meta, id=doc.id)


PruneCompressor = with_options(
    _Compressor,
    "PruneCompressor",
    "Sentence-level pruning of retrieved documents, in one call per query: a "
    "LangChain document compressor with every option of engine.pipeline.inputs.CallOptions (`top_k` is `top_n`).",
)


class EngineEmbeddings(Embeddings):
    """The engine's retrieval encoder (all-MiniLM-L6-v2 in ONNX Runtime, `prune export
    --encoder`; 'default': exported on first use) as LangChain `Embeddings`, for a vector
    store in front of the compressor."""

    def __init__(self, encoder: Any = "default", *, threads: int | None = None):
        from engine.rag.embedder import Embedder

        self.encoder = (
            Embedder.load(encoder, threads=threads) if isinstance(encoder, (str, Path)) else encoder
        )

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """The texts' embeddings."""
        return self.encoder.encode(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        """The query's embedding."""
        return self.encoder.encode([text], what="query")[0].tolist()
