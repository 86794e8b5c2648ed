"""Pruning where RAG applications are written (docs/integrations.md), one optional extra each:

- `engine.integrations.langchain`: PruneCompressor (a BaseDocumentCompressor), LinguaCompressor
  (LLMLingua-2 in the same slot), EngineEmbeddings
- `engine.integrations.llamaindex`: PrunePostprocessor (a BaseNodePostprocessor), LinguaPostprocessor
  (LLMLingua-2 in the same slot), EngineEmbedding
- `engine.integrations.haystack`: PruneRanker (a Haystack 2.x component)
- `engine.integrations.litellm`: PruneEngineGuardrail (LiteLLM's proxy: tool results and context blocks
  pruned, messages compressed, in place, through `prune api`; engine.integrations.chat_context)

Each pruning adapter wraps any pruner: an in-process `Pruner`, a Triton text model
(`Pruner.connect`), or the HTTP API's URL (`engine.remote.http_client.HttpPruner`); each
LLMLingua-2 adapter a `Compressor` or the URL of its `/v1/compress` (`HttpCompressor`). Nothing
in the engine imports them.
"""
