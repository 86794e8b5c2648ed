"""Pruning where RAG applications are written (docs/integrations.md), one optional extra each:

- `engine.integrations.langchain`: PruneCompressor (a BaseDocumentCompressor), EngineEmbeddings
- `engine.integrations.llamaindex`: PrunePostprocessor (a BaseNodePostprocessor), EngineEmbedding
- `engine.integrations.haystack`: PruneRanker (a Haystack 2.x component)

Each wraps any pruner: an in-process `Pruner`, a Triton text model (`Pruner.connect`), or
the HTTP API's URL (`engine.http.pruner_client.HttpPruner`). Nothing in the engine imports them.
"""
