"""LlamaIndex: `PrunePostprocessor`, a `BaseNodePostprocessor` for a query engine's
`node_postprocessors` (pip install 'prune-engine[llamaindex]'), and `LinguaPostprocessor`,
LLMLingua-2 in the same slot (below).

    from engine.integrations.llamaindex import PrunePostprocessor
    query_engine = index.as_query_engine(node_postprocessors=[PrunePostprocessor(pruner="default")])

Each node comes back as a copy whose text is its pruned text, with `metadata["pruning"]`
(the original text, scores, spans, the highlighted text; engine.integrations.adapter) and
the reranking score in [0, 1] as the NodeWithScore's score, as LlamaIndex's rerankers give
theirs. `top_n` keeps the n best, as they do. `pruning` is excluded from the text
the LLM and the embedder see. The input nodes are not changed."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from engine.integrations.adapter import Outcome, PruneOptions, framework, relevance, skip_reason

with framework(__name__, "llama-index-core", "llamaindex"):
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
# after the framework: the adapter is a pydantic model, and pydantic comes with the framework
from pydantic import Field

from engine.integrations.lingua_adapter import LinguaModel, figures
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
        node = _noted(n.node, opts.metadata_key, o.note(opts))
        if o.result is None:
            return NodeWithScore(node=node, score=n.score)
        node.set_content(o.result.pruned_context)
        return NodeWithScore(node=node, score=relevance(self._engine, o.result))


def _noted(node: Any, key: str, note: dict[str, Any]) -> Any:
    """A copy of `node` with `note` in its metadata under `key`, which the LLM and the embedder do not see."""
    node = node.model_copy(deep=True)
    node.metadata[key] = note
    for excluded in (node.excluded_llm_metadata_keys, node.excluded_embed_metadata_keys):
        if key not in excluded:
            excluded.append(key)
    return node


PrunePostprocessor = with_options(
    _Postprocessor,
    "PrunePostprocessor",
    "Sentence-level pruning of retrieved nodes, in one call per query: a "
    "LlamaIndex node postprocessor with every option of engine.pipeline.inputs.CallOptions (`top_k` is `top_n`).",
)


class LinguaPostprocessor(LinguaModel, BaseNodePostprocessor):
    """LLMLingua-2 on a query's nodes, where LlamaIndex's `LongLLMLinguaPostprocessor(use_llmlingua2=True)`
    goes and with its names (target_token, -1 by default as there; additional_compress_kwargs: rate,
    force_tokens, ...; engine.integrations.lingua_adapter), doing what it does: the nodes' texts
    joined into one context (by `separator`: the original joins them with "", which glues the last
    word of a node to the first of the next; "" gives its text exactly), one compress call, and the
    compressed text split at blank lines ("\n\n") into new TextNodes without a score. Each new
    node's metadata is, as the original's, every compressed node's metadata under its node id,
    and here also `metadata["compression"]`: `node_ids` (the nodes joined, in order) and the
    call's token figures; all of it is excluded from what the LLM and the embedder see. A node
    with no text (an image node, an empty one) is passed through unchanged after them, with
    `compression: {"skipped": why}`. The query is not used (LLMLingua-2 is question-agnostic; the
    original passes it, and llmlingua drops it for LLMLingua-2), so none is needed."""

    separator: str = Field(
        "\n\n", description="between the nodes' texts in the one context ('': the original's)"
    )

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's name for this class."""
        return "LinguaPostprocessor"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        texts = [getattr(n.node, "text", None) for n in nodes]  # an image or index node has no text
        sent = [n for n, t in zip(nodes, texts) if not skip_reason(t)]
        passed = [
            NodeWithScore(node=_noted(n.node, self.metadata_key, {"skipped": why}), score=n.score)
            for n, t in zip(nodes, texts)
            if (why := skip_reason(t))
        ]
        if not sent:
            return passed
        result = self._compress(self.separator.join(n.node.text for n in sent))
        sources = {n.node.node_id: n.node.metadata for n in sent}
        meta = {**sources, self.metadata_key: {"node_ids": list(sources), **figures(result)}}
        pieces = [p for p in result.compressed_prompt.split("\n\n") if p.strip()]
        return [
            NodeWithScore(
                node=TextNode(
                    text=p,
                    metadata=copy.deepcopy(meta),
                    excluded_llm_metadata_keys=list(meta),
                    excluded_embed_metadata_keys=list(meta),
                )
            )
            for p in pieces
        ] + passed


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
