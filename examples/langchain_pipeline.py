"""Retrieve, prune, prompt with LangChain (docs/integrations.md): python examples/langchain_pipeline.py"""

import json
from pathlib import Path

from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_core.documents import Document
from langchain_core.prompts import PromptTemplate
from langchain_core.vectorstores import InMemoryVectorStore

from engine.integrations.langchain import EngineEmbeddings, PruneCompressor

rows = [json.loads(line) for line in (Path(__file__).parent / "documents.jsonl").open()]
store = InMemoryVectorStore.from_documents(
    [Document(r["text"], id=r["id"]) for r in rows], EngineEmbeddings()
)
retriever = ContextualCompressionRetriever(
    base_compressor=PruneCompressor(pruner="default"),
    base_retriever=store.as_retriever(search_kwargs={"k": 3}),
)
question = "What do Valencians call the toasted rice at the bottom of the pan?"
docs = retriever.invoke(question)
prompt = PromptTemplate.from_template("Answer from the context.\nContext:\n{context}\nQuestion: {question}")
print(prompt.format(context="\n".join(d.page_content for d in docs), question=question))
for d in docs:
    print(
        f"-- {d.id}: {d.metadata['pruning']['compression_rate']:.0%} removed, "
        f"score {d.metadata['relevance_score']:.3f}"
    )
