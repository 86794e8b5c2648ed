"""LlamaIndex: `PrunePostprocessor`, a `BaseNodePostprocessor` for a query engine's
`node_postprocessors` (pip install 'prune-engine[llamaindex]').

    from engine.integrations.llamaindex import PrunePostprocessor
    query_engine = index.as_query_engine(node_postprocessors=[PrunePostprocessor(pruner="default")])

Each node comes back as a copy whose text is its pruned text, with `metadata["pruning"]`
(the original text, scores, spans, the highlighted text; engine.integrations.adapter) and
the reranking score in [0, 1] as the NodeWithScore's score, as LlamaIndex's rerankers give
theirs. `top_n` keeps the n best, as they do. `pruning` is excluded from the text
the LLM and the embedder see. The input nodes are not changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.integrations.adapter import Outcome, PruneOptions, framework, relevance

with framework(__name__, "llama-index-core", "llamaindex"):
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import NodeWithScore, QueryBundle
# after the framework: the adapter is a pydantic model, and pydantic comes with the framework
from engine.integrations.pydantic_adapter import PrunerModel, with_options


class _Postprocessor(PrunerModel, BaseNodePostprocessor):
    """PrunePostprocessor's methods; its fields (every CallOptions option, `top_k` named
    `top_n` as LlamaIndex's rerankers say, and the adapter's own) are added below."""

    @classmethod
    def class_name(cls) -> str:
        return "PrunePostprocessor"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        return self._pruned(self._query(query_bundle), nodes, self._options())

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        return await self._apruned(self._query(query_bundle), nodes, self._options())

    @staticmethod
    def _query(query_bundle: QueryBundle | None) -> str:
        if query_bundle is None:
            raise ValueError("PrunePostprocessor needs the query: pass query_bundle (or query_str)")
        return query_bundle.query_str

    def _contents(self, nodes: list[NodeWithScore]) -> list[Any]:
        return [getattr(n.node, "text", None) for n in nodes]  # an image or index node has no text

    def _remade(self, n: NodeWithScore, o: Outcome, opts: PruneOptions) -> NodeWithScore:
        node, key, score = n.node.model_copy(deep=True), opts.metadata_key, n.score
        node.metadata[key] = o.note(opts)
        if o.result is not None:
            node.set_content(o.result.pruned_context)
            score = relevance(self._engine, o.result)
        for excluded in (node.excluded_llm_metadata_keys, node.excluded_embed_metadata_keys):
            if key not in excluded:
                excluded.append(key)
        return NodeWithScore(node=node, score=score)


PrunePostprocessor = with_options(
    _Postprocessor,
    "PrunePostprocessor",
    "Sentence-level pruning of retrieved nodes, in one call per query: a "
    "LlamaIndex node postprocessor with every option of engine.pipeline.inputs.CallOptions (`top_k` is `top_n`).",
)


class EngineEmbedding(BaseEmbedding):
    """The engine's retrieval encoder (all-MiniLM-L6-v2 in ONNX Runtime, `prune export
    --encoder`; 'default': exported on first use) as a LlamaIndex embedding model."""

    _encoder: Any = PrivateAttr(default=None)

    def __init__(self, encoder: Any = "default", *, threads: int | None = None, **kwargs: Any):
        super().__init__(model_name="all-MiniLM-L6-v2 (prune-engine)", **kwargs)
        from engine.rag.embedder import Embedder

        self._encoder = (
            Embedder.load(encoder, threads=threads) if isinstance(encoder, (str, Path)) else encoder
        )

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's name for this class."""
        return "EngineEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._encoder.encode([query], what="query")[0].tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._encoder.encode([text])[0].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._encoder.encode(texts).tolist()
