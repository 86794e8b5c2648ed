"""The framework adapters (engine.integrations) inside their frameworks' own pipeline
objects, with real packages: LangChain's ContextualCompressionRetriever, a LlamaIndex
query engine and postprocess_nodes, a Haystack Pipeline. For each of three engines (the
in-process pruner, a Triton text model, the HTTP API's URL) the documents come back as
`Pruner.prune` says, with the metadata, through the sync and the async paths; documents
with no text are passed through as documented."""

from __future__ import annotations

import asyncio
import math

import pytest

from engine.pruner import Pruner
from tests.utils import serve_api

pytestmark = pytest.mark.server

Q = "When was the stadium built?"
TEXTS = [
    "The stadium was built in 1923. It holds 80,000 people. Its roof came later.",
    "Paris is the capital of France. It is on the Seine.",
    "The river flows to the sea. The stadium opened in 1924 after a year of work.",
]
THRESHOLD = 0.5  # random test weights: about half the sentences pass, so some are cut


@pytest.fixture(scope="module", params=["in-process", "text model", "http api"])
def engine(request, pruners):
    """(the pruner an adapter is given, the in-process pruner whose results it must give)."""
    local = pruners["xprovence"][0]
    if request.param == "in-process":
        yield local, local
    elif request.param == "text model":
        remote = Pruner.connect(request.getfixturevalue("server").grpc_url, "xprovence_text")
        yield remote, local
        remote.close()
    else:
        with serve_api(local) as url:
            yield url, local  # a URL: the adapter makes the HttpPruner


def _expected(local, **kw):
    """(input index, pruned text, reranking score) per document the engine keeps, in its order."""
    return [
        (r.index, r.pruned_context, r.reranking_score)
        for r in local.prune(Q, TEXTS, threshold=THRESHOLD, **kw)
        if r.pruned_context.strip()
    ]


def _relevance(reranking_score):
    """Where a framework's rerankers put their score, in [0, 1]: for xprovence the sigmoid
    of the rerank logit, computed here by hand."""
    return 1.0 / (1.0 + math.exp(-reranking_score))


def _check_meta(meta, local, index):
    want = local.prune(Q, [TEXTS[index]], threshold=THRESHOLD)[0]
    assert meta["original_text"] == TEXTS[index]
    assert meta["reranking_score"] == pytest.approx(want.reranking_score, abs=1e-5)
    assert meta["compression_rate"] == pytest.approx(want.compression_rate)
    assert meta["threshold"] == THRESHOLD
    assert [s["kept"] for s in meta["sentences"]] == [s.kept for s in want.sentences]
    assert [s["probability"] for s in meta["sentences"]] == pytest.approx(
        [s.probability for s in want.sentences], abs=1e-5
    )
    assert [(s["start"], s["end"]) for s in meta["sentences"]] == [(s.start, s.end) for s in want.sentences]
    assert meta["highlighted"] == want.highlight("<em>", "</em>")


# --------------------------------------------------------------------------- LangChain


def test_langchain_compressor_in_a_contextual_compression_retriever(engine):
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from engine.integrations.langchain import PruneCompressor

    pruner, local = engine

    class Fixed(BaseRetriever):  # a retriever over a few documents
        docs: list[Document]

        def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun):
            return self.docs

    docs = [Document(page_content=t, metadata={"source": f"doc{i}"}, id=f"d{i}") for i, t in enumerate(TEXTS)]
    retriever = ContextualCompressionRetriever(
        base_compressor=PruneCompressor(pruner=pruner, threshold=THRESHOLD), base_retriever=Fixed(docs=docs)
    )
    got = retriever.invoke(Q)
    want = _expected(local)
    assert [(d.id, d.page_content) for d in got] == [(f"d{i}", text) for i, text, _ in want]
    for d in got:
        i = int(d.id[1:])
        assert d.metadata["source"] == f"doc{i}"
        _check_meta(d.metadata["pruning"], local, i)
    assert [d.page_content for d in docs] == TEXTS  # the input documents are not changed
    again = asyncio.run(retriever.ainvoke(Q))
    assert [(d.id, d.page_content) for d in again] == [(d.id, d.page_content) for d in got]
    # the score where LangChain's rerankers put it
    assert [d.metadata["relevance_score"] for d in got] == pytest.approx(
        [_relevance(s) for _, _, s in want], abs=1e-5
    )
    # top_n ranks by the reranking score, as Pruner.prune's top_k does (LangChain's name)
    ranked = PruneCompressor(pruner=pruner, threshold=THRESHOLD, top_n=2, keep_empty=True).compress_documents(
        docs, Q
    )
    assert [d.id for d in ranked] == [
        f"d{r.index}" for r in local.prune(Q, TEXTS, threshold=THRESHOLD, top_k=2)
    ]
    for wrong, says in (("top_k", "it is top_n here"), ("threshhold", "its options: ")):
        with pytest.raises(ValueError, match=f"has no option '{wrong}'.*{says}"):  # never silently ignored
            PruneCompressor(pruner=pruner, threshold=THRESHOLD, **{wrong: 2})


def test_langchain_passes_documents_without_text_through(engine):
    from langchain_core.documents import Document
    from engine.integrations.langchain import PruneCompressor

    pruner, local = engine
    docs = [Document(page_content=""), Document(page_content=TEXTS[0]), Document(page_content="  \n ")]
    got = PruneCompressor(pruner=pruner, threshold=0.0, keep_empty=True).compress_documents(docs, Q)
    assert [d.page_content for d in got] == [
        "",
        local.prune(Q, TEXTS[0], threshold=0.0)[0].pruned_context,
        "  \n ",
    ]
    assert got[0].metadata["pruning"] == {"skipped": "empty"} and got[2].metadata["pruning"] == {
        "skipped": "empty"
    }
    with pytest.raises(Exception):  # LangChain's own check: page_content must be a str
        Document(page_content=None)


# --------------------------------------------------------------------------- LlamaIndex


def test_llamaindex_postprocessor_in_a_query_engine(engine):
    from llama_index.core import SummaryIndex
    from llama_index.core.llms import MockLLM
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from engine.integrations.llamaindex import PrunePostprocessor

    pruner, local = engine
    nodes = [TextNode(text=t, id_=f"n{i}", metadata={"source": f"doc{i}"}) for i, t in enumerate(TEXTS)]
    post = PrunePostprocessor(pruner=pruner, threshold=THRESHOLD)
    query_engine = SummaryIndex(nodes).as_query_engine(llm=MockLLM(), node_postprocessors=[post])
    response = query_engine.query(Q)
    want = _expected(local)
    got = response.source_nodes
    assert [(n.node.node_id, n.node.get_content()) for n in got] == [(f"n{i}", text) for i, text, _ in want]
    assert [n.score for n in got] == pytest.approx([_relevance(s) for _, _, s in want], abs=1e-5)
    top = PrunePostprocessor(pruner=pruner, threshold=THRESHOLD, top_n=1, keep_empty=True).postprocess_nodes(
        [NodeWithScore(node=n) for n in nodes], query_bundle=QueryBundle(Q)
    )
    assert [n.node.node_id for n in top] == [
        f"n{r.index}" for r in local.prune(Q, TEXTS, threshold=THRESHOLD, top_k=1)
    ]
    for n in got:
        i = int(n.node.node_id[1:])
        _check_meta(n.node.metadata["pruning"], local, i)
        assert "pruning" in n.node.excluded_llm_metadata_keys  # the LLM sees the pruned text only
        assert "pruning" not in n.node.get_content(metadata_mode="llm")
    assert [n.text for n in nodes] == TEXTS
    inputs = [NodeWithScore(node=n, score=None) for n in nodes]
    direct = post.postprocess_nodes(inputs, query_bundle=QueryBundle(Q))
    assert [n.node.get_content() for n in direct] == [n.node.get_content() for n in got]
    again = asyncio.run(post.apostprocess_nodes(inputs, query_bundle=QueryBundle(Q)))
    assert [n.node.get_content() for n in again] == [n.node.get_content() for n in got]
    with pytest.raises(ValueError, match="needs the query"):
        post.postprocess_nodes(inputs)


def test_llamaindex_passes_nodes_without_text_through(engine):
    from llama_index.core.schema import ImageNode, NodeWithScore, QueryBundle, TextNode
    from engine.integrations.llamaindex import PrunePostprocessor

    pruner, local = engine
    nodes = [
        NodeWithScore(node=TextNode(text=""), score=0.3),
        NodeWithScore(node=TextNode(text=TEXTS[1])),
        NodeWithScore(node=ImageNode(image="aGVsbG8="), score=0.1),
    ]  # an image, no text
    got = PrunePostprocessor(pruner=pruner, threshold=0.0, keep_empty=True).postprocess_nodes(
        nodes, query_bundle=QueryBundle(Q)
    )
    assert len(got) == 3
    assert got[0].node.metadata["pruning"] == {"skipped": "empty"} and got[0].score == 0.3
    assert got[1].node.get_content() == local.prune(Q, TEXTS[1], threshold=0.0)[0].pruned_context
    assert got[2].node.metadata["pruning"] == {"skipped": "empty"} and got[2].score == 0.1
    assert got[2].node.image == "aGVsbG8="


# --------------------------------------------------------------------------- Haystack


def test_haystack_ranker_in_a_pipeline(engine):
    from haystack import Document, Pipeline
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from engine.integrations.haystack import PruneRanker

    pruner, local = engine
    store = InMemoryDocumentStore()
    store.write_documents(
        [Document(content=t, id=f"h{i}", meta={"source": f"doc{i}"}) for i, t in enumerate(TEXTS)]
    )
    pipe = Pipeline()
    pipe.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=10))
    pipe.add_component("pruner", PruneRanker(pruner=pruner, threshold=THRESHOLD, reorder=True))
    pipe.connect("retriever.documents", "pruner.documents")
    out = pipe.run({"retriever": {"query": Q}, "pruner": {"query": Q}})["pruner"]["documents"]
    retrieved = pipe.run(
        {"retriever": {"query": Q}, "pruner": {"query": Q}}, include_outputs_from={"retriever"}
    )
    order = [int(d.id[1:]) for d in retrieved["retriever"]["documents"]]  # what the pruner got, in that order
    texts = [TEXTS[i] for i in order]
    want = [
        (order[r.index], r.pruned_context, r.reranking_score)
        for r in local.prune(Q, texts, threshold=THRESHOLD, reorder=True)
        if r.pruned_context.strip()
    ]
    assert [(d.id, d.content) for d in out] == [(f"h{i}", text) for i, text, _ in want]
    assert [d.score for d in out] == pytest.approx([_relevance(s) for _, _, s in want], abs=1e-5)
    for d in out:
        _check_meta(d.meta["pruning"], local, int(d.id[1:]))
        assert d.meta["source"] == f"doc{int(d.id[1:])}"
    ranker = PruneRanker(pruner=pruner, threshold=THRESHOLD, reorder=True)
    docs = [Document(content=TEXTS[i], id=f"h{i}") for i in order]
    again = asyncio.run(ranker.run_async(query=Q, documents=docs))["documents"]
    assert [(d.id, d.content) for d in again] == [(d.id, d.content) for d in out]
    top1 = ranker.run(query=Q, documents=docs, top_k=1)["documents"]
    assert len(top1) <= 1


def test_haystack_ranker_warms_up_and_a_pipeline_holding_it_saves_and_loads(exported, pruners):
    from haystack import Document, Pipeline
    from engine.integrations.haystack import PruneRanker

    local = pruners["xprovence"][0]
    ranker = PruneRanker(pruner=str(exported["xprovence"]), threshold=THRESHOLD, top_k=2, lexical_weight=0.5)
    assert ranker._engine is None  # nothing is loaded before warm_up
    pipe = Pipeline()
    pipe.add_component("pruner", ranker)
    loaded = Pipeline.loads(pipe.dumps())
    assert (
        loaded.get_component("pruner").to_dict()
        == ranker.to_dict()
        == {
            "type": "engine.integrations.haystack.PruneRanker",
            "init_parameters": {
                "pruner": str(exported["xprovence"]),
                "threshold": THRESHOLD,
                "top_k": 2,
                "lexical_weight": 0.5,
            },
        }
    )
    docs = [Document(content=t, id=f"h{i}") for i, t in enumerate(TEXTS)]
    out = loaded.run({"pruner": {"query": Q, "documents": docs}})["pruner"]["documents"]
    want = local.prune(Q, TEXTS, threshold=THRESHOLD, top_k=2, lexical_weight=0.5)
    assert [(d.id, d.content) for d in out] == [
        (f"h{r.index}", r.pruned_context) for r in want if r.pruned_context.strip()
    ]
    with pytest.raises(TypeError, match="to_dict needs the pruner given as"):
        PruneRanker(pruner=local).to_dict()


def test_haystack_passes_documents_without_text_through(engine):
    from haystack import Document
    from haystack.dataclasses import ByteStream
    from engine.integrations.haystack import PruneRanker

    pruner, local = engine
    docs = [
        Document(content=None, blob=ByteStream(data=b"\x89PNG")),
        Document(content=TEXTS[2]),
        Document(content=""),
    ]
    got = PruneRanker(pruner=pruner, threshold=0.0, keep_empty=True).run(query=Q, documents=docs)["documents"]
    assert [d.id for d in got] == [d.id for d in docs]
    assert got[0].blob.data == b"\x89PNG" and got[0].meta["pruning"] == {
        "skipped": "content is NoneType, not text"
    }
    assert got[1].content == local.prune(Q, TEXTS[2], threshold=0.0)[0].pruned_context
    assert got[2].meta["pruning"] == {"skipped": "empty"}


def test_the_http_client_checks_input_as_in_process_and_names_server_errors(pruners):
    from engine.errors import BackendError, InputError
    from engine.http.app import ApiConfig
    from engine.remote.http_client import HttpPruner

    local = pruners["xprovence"][0]
    with serve_api(local, ApiConfig(api_key="k")) as url:
        client = HttpPruner(url, api_key="k")
        assert [r.to_dict() for r in client.prune(Q, TEXTS)] == [r.to_dict() for r in local.prune(Q, TEXTS)]
        assert client.family.name == "xprovence" and client.limits == local.limits
        for bad in ({"question": ""}, {"passages": [1]}, {"threshold": 2.0}, {"top_k": 0}):
            call = {"question": Q, "passages": TEXTS, **bad}
            with pytest.raises(InputError) as remote:
                client.prune(**call)
            with pytest.raises(InputError) as here:
                local.prune(**call)
            assert str(remote.value) == str(here.value)
        with pytest.raises(BackendError, match="401"):
            HttpPruner(url, api_key="wrong").prune(Q, TEXTS)
    with pytest.raises(BackendError):
        HttpPruner(url, timeout=2).prune(Q, TEXTS)  # the server is gone


@pytest.mark.parametrize(
    "framework,heading",
    [("langchain", "### LangChain"), ("llamaindex", "### LlamaIndex"), ("haystack", "### Haystack")],
)
def test_the_docs_pipelines_print_what_the_page_shows(default_cache, framework, heading):
    """examples/<framework>_pipeline.py as docs/integrations.md shows it, run with the
    default model: the code on the page is the file, and it prints the pasted output."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "integrations.md").read_text()
    section = page[page.index(heading) :]
    blocks = section.split("```")
    code, output = blocks[1].removeprefix("python\n"), blocks[3].strip("\n")
    script = root / "examples" / f"{framework}_pipeline.py"
    assert code.strip("\n") == script.read_text().strip("\n")
    env = {**os.environ, **default_cache["env"], "HAYSTACK_TELEMETRY_ENABLED": "False"}
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env, cwd=root
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip("\n") == output


def test_the_adapters_pass_the_lexical_weight(pruners):
    from haystack import Document as HsDocument
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from engine.integrations.haystack import PruneRanker
    from engine.integrations.langchain import PruneCompressor
    from engine.integrations.llamaindex import PrunePostprocessor

    local = pruners["xprovence"][0]
    want = [r.pruned_context for r in local.prune(Q, TEXTS, threshold=THRESHOLD, lexical_weight=0.5)]
    assert want != [
        r.pruned_context for r in local.prune(Q, TEXTS, threshold=THRESHOLD)
    ]  # it changes something
    opts = {"threshold": THRESHOLD, "lexical_weight": 0.5, "keep_empty": True}
    lc = PruneCompressor(pruner=local, **opts).compress_documents(
        [Document(page_content=t) for t in TEXTS], Q
    )
    li = PrunePostprocessor(pruner=local, **opts).postprocess_nodes(
        [NodeWithScore(node=TextNode(text=t)) for t in TEXTS], query_bundle=QueryBundle(Q)
    )
    hs = PruneRanker(pruner=local, **opts).run(query=Q, documents=[HsDocument(content=t) for t in TEXTS])[
        "documents"
    ]
    assert (
        [d.page_content for d in lc] == [n.node.get_content() for n in li] == [d.content for d in hs] == want
    )
