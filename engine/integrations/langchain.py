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
(engine.integrations.common). `top_n` keeps the n best, as LangChain's rerankers do
(`top_k`, its old name, is deprecated). The input documents are not changed: the
compressor returns new ones."""
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
    raise ImportError("engine.integrations.langchain needs langchain-core: "
                      "pip install 'prune-engine[langchain]'") from exc
from engine.integrations.common import (TOP_N, Outcome, PruneOptions, aprune_contents, options_of, prune_contents,
                                        pruning_metadata, relevance)
from engine.integrations.pydantic_adapter import PrunerModel, with_options


class _Compressor(PrunerModel, BaseDocumentCompressor):
    """PruneCompressor's methods; its fields (every CallOptions option, `top_k` named
    `top_n` as LangChain's rerankers say, and the adapter's own) are added below."""

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
                meta["relevance_score"] = relevance(self._engine, o.result)
                out.append(Document(page_content=o.result.pruned_context, metadata=meta, id=doc.id))
        return out

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        """The documents pruned for `query` (ranked with top_n or reorder)."""
        opts = options_of(self, TOP_N)
        return self._shape(documents, prune_contents(self._engine, query, [d.page_content for d in documents], opts),
                           opts)

    async def acompress_documents(self, documents: Sequence[Document], query: str,
                                  callbacks: Callbacks | None = None) -> Sequence[Document]:
        """`compress_documents` for asyncio code."""
        opts = options_of(self, TOP_N)
        outcomes = await aprune_contents(self._engine, query, [d.page_content for d in documents], opts)
        return self._shape(documents, outcomes, opts)


PruneCompressor = with_options(
    _Compressor, "PruneCompressor", "Sentence-level pruning of retrieved documents, in one call per query: a "
    "LangChain document compressor with every option of engine.inputs.CallOptions (`top_k` is `top_n`).")


class EngineEmbeddings(Embeddings):
    """The engine's retrieval encoder (all-MiniLM-L6-v2 in ONNX Runtime, `prune export
    --encoder`; 'default': exported on first use) as LangChain `Embeddings`, for a vector
    store in front of the compressor."""

    def __init__(self, encoder: Any = "default", *, threads: int | None = None):
        from engine.rag.embedder import Embedder
        self.encoder = Embedder.load(encoder, threads=threads) if isinstance(encoder, (str, Path)) else encoder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """The texts' embeddings."""
        return self.encoder.encode(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        """The query's embedding."""
        return self.encoder.encode([text], what="query")[0].tolist()
