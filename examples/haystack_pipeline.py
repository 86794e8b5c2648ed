"""Retrieve, prune, prompt with Haystack (docs/integrations.md): python examples/haystack_pipeline.py"""

import json
from pathlib import Path

from haystack import Document, Pipeline
from haystack.components.builders import PromptBuilder
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from engine.integrations.haystack import PruneRanker

store = InMemoryDocumentStore()
store.write_documents(
    [
        Document(content=json.loads(line)["text"], id=json.loads(line)["id"])
        for line in (Path(__file__).parent / "documents.jsonl").open()
    ]
)
pipe = Pipeline()
pipe.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=3))
pipe.add_component("pruner", PruneRanker(pruner="default"))
pipe.add_component(
    "prompt",
    PromptBuilder(
        "Answer from the context.\nContext:\n{% for d in documents %}{{ d.content }}\n"
        "{% endfor %}Question: {{ question }}",
        required_variables=["question"],
    ),
)
pipe.connect("retriever.documents", "pruner.documents")
pipe.connect("pruner.documents", "prompt.documents")
question = "What do Valencians call the toasted rice at the bottom of the pan?"
out = pipe.run(
    {"retriever": {"query": question}, "pruner": {"query": question}, "prompt": {"question": question}},
    include_outputs_from={"pruner"},
)
print(out["prompt"]["prompt"])
for d in out["pruner"]["documents"]:
    print(f"-- {d.id}: {d.meta['pruning']['compression_rate']:.0%} removed, score {d.score:.3f}")
