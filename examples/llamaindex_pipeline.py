"""Retrieve, prune, prompt with LlamaIndex (docs/integrations.md): python examples/llamaindex_pipeline.py"""

import json
from pathlib import Path

from llama_index.core import PromptTemplate, VectorStoreIndex
from llama_index.core.schema import QueryBundle, TextNode

from engine.integrations.llamaindex import EngineEmbedding, PrunePostprocessor

rows = [json.loads(line) for line in (Path(__file__).parent / "documents.jsonl").open()]
index = VectorStoreIndex([TextNode(text=r["text"], id_=r["id"]) for r in rows], embed_model=EngineEmbedding())
question = "What do Valencians call the toasted rice at the bottom of the pan?"
retrieved = index.as_retriever(similarity_top_k=3).retrieve(question)
nodes = PrunePostprocessor(pruner="default").postprocess_nodes(retrieved, query_bundle=QueryBundle(question))
prompt = PromptTemplate("Answer from the context.\nContext:\n{context}\nQuestion: {question}")
print(prompt.format(context="\n".join(n.node.get_content() for n in nodes), question=question))
for n in nodes:
    print(
        f"-- {n.node.node_id}: {n.node.metadata['pruning']['compression_rate']:.0%} removed, score {n.score:.3f}"
    )
