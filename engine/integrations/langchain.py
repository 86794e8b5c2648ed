"""LangChain: `PruneCompressor`, a `BaseDocumentCompressor` for
`ContextualCompressionRetriever` (pip install 'prune-engine[langchain]'), and `LinguaCompressor`,
LLMLingua-2 in the same slot (below).

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

from engine.integrations.adapter import Outcome, PruneOptions, framework, relevance, skip_reason

with framework(__name__, "langchain-core", "langchain"):
    from langchain_core.callbacks import Callbacks
    from langchain_core.documents import Document
    from langchain_core.documents.compressor import BaseDocumentCompressor
    from langchain_core.embeddings import Embeddings
# after the framework: the adapter is a pydantic model, and pydantic comes with the framework
from pydantic import Field

from engine.integrations.lingua_adapter import LinguaModel, figures
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


class LinguaCompressor(LinguaModel, BaseDocumentCompressor):
    """LLMLingua-2 on a query's documents, where LangChain's `LLMLinguaCompressor` goes and with its
    names (target_token, 300 by default as there; additional_compress_kwargs: rate, force_tokens, ...;
    engine.integrations.lingua_adapter): the documents are the contexts of one compress call, as
    the original sends them, so target_token is the budget of them all and, with several, the
    context-level filter may drop whole documents. Each kept document comes back with its
    compressed text, its metadata and id, and `metadata["compression"]`: `original_text`,
    `kept_spans` (the kept words' character spans in it) and the call's token figures. A document
    compressed to nothing, or dropped, is left out, as the original leaves it out; one with no
    text is passed through unchanged with `compression: {"skipped": why}`, never sent. The query
    is not used: LLMLingua-2 is question-agnostic (the original passes it, and llmlingua drops
    it for LLMLingua-2)."""

    target_token: int = Field(
        300, description="tokens to keep, over all the documents (LLMLinguaCompressor's 300)"
    )

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """The documents compressed together, in their order (the query is not used)."""
        sent = [i for i, d in enumerate(documents) if not skip_reason(d.page_content)]
        out: dict[int, Document] = {}
        if sent:
            result = self._compress([documents[i].page_content for i in sent])
            for k, text in zip(result.kept_contexts, result.compressed_prompt_list):
                doc = documents[sent[k]]
                note = {
                    "original_text": doc.page_content,
                    "kept_spans": result.kept_spans[k],
                    **figures(result),
                }
                if text.strip():
                    meta = {**doc.metadata, self.metadata_key: note}
                    out[sent[k]] = Document(page_content=text, metadata=meta, id=doc.id)
        for i, doc in enumerate(documents):
            if why := skip_reason(doc.page_content):
                meta = {**doc.metadata, self.metadata_key: {"skipped": why}}
                out[i] = Document(page_content=doc.page_content, metadata=meta, id=doc.id)
        return [out[i] for i in sorted(out)]


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
