"""The LLMLingua-2 adapters (LangChain's LinguaCompressor, LlamaIndex's LinguaPostprocessor) inside
their frameworks' own pipeline objects, on the tests' tiny random-weight XLM-R checkpoint, with the
in-process Compressor and with the HTTP API's URL (/v1/compress): the compressed texts are what
llmlingua 0.2.2's own PromptCompressor(use_llmlingua2=True).compress_prompt gives on the same texts,
called as the frameworks' own LLMLingua classes call it (LangChain's LLMLinguaCompressor: the
documents as one list of contexts; LlamaIndex's LongLLMLinguaPostprocessor: the texts joined into
one), their question, instruction and rank_method included, which llmlingua drops for LLMLingua-2."""

from __future__ import annotations

import asyncio

import pytest

from tests.utils import THREADS, serve_api

pytestmark = pytest.mark.server

Q = "Why did the council not repair the bridge?"
TEXTS = [
    "The council met on Tuesday to talk about the old bridge. Most members wanted a new one.",
    "The budget was small, so the engineer said that repairs would cost 2.5 million and last ten years.",
    "Paris is the capital of France.\nIt is on the Seine, and its museums are full in summer.",
    "In the end the council asked for a second report. Why not repair it? Nobody answered.",
]
OPTIONS = {"rate": 0.5, "force_tokens": ["\n", "?"]}
#: how the originals call compress_prompt besides the options (LangChain's defaults; LlamaIndex's
#: instruction_str differs in a word): all of it dropped by llmlingua for an LLMLingua-2 model
LONGLLMLINGUA = dict(
    instruction="Given this documents, please answer the final question",
    question=Q,
    rank_method="longllmlingua",
    condition_compare=True,
    condition_in_question="after",
    context_budget="+100",
    reorder_context="sort",
    dynamic_context_compression_ratio=0.4,
)


@pytest.fixture(scope="module")
def reference(lingua_checkpoints, tiktoken_offline):
    """llmlingua's own PromptCompressor on the checkpoint."""
    llmlingua = pytest.importorskip("llmlingua", reason="the dev extra's llmlingua==0.2.2")
    return llmlingua.PromptCompressor(
        model_name=str(lingua_checkpoints["xlm-roberta"]), use_llmlingua2=True, device_map="cpu"
    )


@pytest.fixture(scope="module")
def local(lingua_checkpoints):
    from engine.compressor import Compressor

    return Compressor.load(lingua_checkpoints["xlm-roberta"], threads=THREADS)


@pytest.fixture(scope="module", params=["in-process", "http api"])
def compressor(request, local):
    """What an adapter is given: the in-process Compressor, or the URL of an API serving it."""
    if request.param == "in-process":
        yield local
    else:
        with serve_api(local) as url:
            yield url  # a URL: the adapter makes the HttpCompressor


def _texts(compressed: list[str]) -> list[str]:
    return [t for t in compressed if t.strip()]


# --------------------------------------------------------------------------- LangChain


def test_langchain_lingua_compressor_in_a_contextual_compression_retriever(compressor, reference):
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from engine.integrations.langchain import LinguaCompressor

    class Fixed(BaseRetriever):  # a retriever over a few documents
        docs: list[Document]

        def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun):
            return self.docs

    docs = [Document(t, metadata={"source": f"doc{i}"}, id=f"d{i}") for i, t in enumerate(TEXTS)]
    docs.insert(2, Document(" \n", id="blank"))
    lingua = LinguaCompressor(compressor=compressor, target_token=-1, additional_compress_kwargs=OPTIONS)
    retriever = ContextualCompressionRetriever(base_compressor=lingua, base_retriever=Fixed(docs=docs))
    got = retriever.invoke(Q)
    # LLMLinguaCompressor's call: the documents are the contexts of one compress_prompt
    want = reference.compress_prompt(TEXTS, target_token=-1, **LONGLLMLINGUA, **OPTIONS)
    compressed = [d for d in got if d.id != "blank"]
    assert [d.page_content for d in compressed] == _texts(want["compressed_prompt_list"])
    assert len(compressed) == 3  # the context-level filter (rate 0.5: contexts at 0.75) dropped one
    for (
        d
    ) in compressed:  # each is its own document's: rate decides per chunk, so alone it compresses the same
        i = int(d.id[1:])
        assert d.page_content == reference.compress_prompt(TEXTS[i], **OPTIONS)["compressed_prompt"]
        note = d.metadata["compression"]
        assert d.metadata["source"] == f"doc{i}" and note["original_text"] == TEXTS[i]
        assert all(0 <= a < b <= len(TEXTS[i]) for a, b in note["kept_spans"]) and note["kept_spans"]
        assert (note["origin_tokens"], note["compressed_tokens"], note["rate"]) == (
            want["origin_tokens"],
            want["compressed_tokens"],
            want["rate"],
        )
    assert [d.id for d in got].index("blank") == 2 and got[2].page_content == " \n"  # passed through
    assert got[2].metadata["compression"] == {"skipped": "empty"}
    assert [d.page_content for d in docs if d.id != "blank"] == TEXTS  # the inputs are not changed
    again = asyncio.run(retriever.ainvoke(Q))
    assert [(d.id, d.page_content) for d in again] == [(d.id, d.page_content) for d in got]
    # target_token is the budget of all the documents together, as the original's one call makes it
    budget = LinguaCompressor(
        compressor=compressor, target_token=40, additional_compress_kwargs={"force_tokens": ["\n"]}
    )
    want = reference.compress_prompt(TEXTS, target_token=40, force_tokens=["\n"], **LONGLLMLINGUA)
    assert [d.page_content for d in budget.compress_documents(docs, Q) if d.id != "blank"] == _texts(
        want["compressed_prompt_list"]
    )
    assert LinguaCompressor(compressor=compressor).compress_documents([], Q) == []


# --------------------------------------------------------------------------- LlamaIndex


def test_llamaindex_lingua_postprocessor_in_a_query_engine(compressor, reference):
    from llama_index.core import SummaryIndex
    from llama_index.core.llms import MockLLM
    from llama_index.core.schema import ImageNode, NodeWithScore, TextNode
    from engine.integrations.llamaindex import LinguaPostprocessor

    nodes = [TextNode(text=t, id_=f"n{i}", metadata={"source": f"doc{i}"}) for i, t in enumerate(TEXTS)]
    post = LinguaPostprocessor(compressor=compressor, additional_compress_kwargs=OPTIONS)
    response = SummaryIndex(nodes).as_query_engine(llm=MockLLM(), node_postprocessors=[post]).query(Q)
    got = response.source_nodes
    # LongLLMLinguaPostprocessor's call: the texts joined into one context (here by a blank line)
    want = reference.compress_prompt("\n\n".join(TEXTS), target_token=-1, **LONGLLMLINGUA, **OPTIONS)
    assert [n.node.get_content() for n in got] == _texts(want["compressed_prompt"].split("\n\n"))
    assert len(got) > 1 and all(n.score is None for n in got)
    for n in got:
        meta = n.node.metadata  # as the original's: every node's metadata under its id, and the figures
        assert {k: meta[k] for k in ("n0", "n3")} == {"n0": {"source": "doc0"}, "n3": {"source": "doc3"}}
        assert meta["compression"]["node_ids"] == ["n0", "n1", "n2", "n3"]
        assert meta["compression"]["compressed_tokens"] == want["compressed_tokens"]
        assert n.node.get_content(metadata_mode="llm") == n.node.get_content()  # the LLM sees the text only
    assert [n.text for n in nodes] == TEXTS
    # the original's own join (""), and no query needed: LLMLingua-2 does not read it
    exact = LinguaPostprocessor(compressor=compressor, separator="", additional_compress_kwargs=OPTIONS)
    inputs = [NodeWithScore(node=n, score=0.5) for n in nodes] + [
        NodeWithScore(node=ImageNode(image="aGVsbG8="), score=0.1)
    ]
    out = exact.postprocess_nodes(inputs)
    want = reference.compress_prompt("".join(TEXTS), **OPTIONS)["compressed_prompt"]
    assert [n.node.get_content() for n in out[:-1]] == _texts(want.split("\n\n"))
    assert out[-1].node.image == "aGVsbG8=" and out[-1].score == 0.1  # passed through, after them
    assert out[-1].node.metadata["compression"] == {"skipped": "empty"}
    again = asyncio.run(exact.apostprocess_nodes(inputs))
    assert [n.node.get_content() for n in again] == [n.node.get_content() for n in out]


# --------------------------------------------------------------------------- both


def test_the_originals_other_names_are_refused_with_the_reason(local):
    from engine.integrations.langchain import LinguaCompressor
    from engine.integrations.llamaindex import LinguaPostprocessor

    for cls in (LinguaCompressor, LinguaPostprocessor):
        for given, says in (
            ({"instruction": "Answer."}, "question-agnostic"),
            ({"instruction_str": "Answer."}, "question-agnostic"),
            ({"rank_method": "longllmlingua"}, "LongLLMLingua's"),
            (
                {"model_name": "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"},
                "the model is `compressor`",
            ),
            ({"use_llmlingua2": True}, "the model is `compressor`"),
            ({"top_n": 2}, "its options: compressor, target_token, additional_compress_kwargs"),
            (
                {"additional_compress_kwargs": {"condition_compare": True}},
                "condition_compare is LongLLMLingua's",
            ),
            ({"additional_compress_kwargs": {"ratee": 0.5}}, "compress takes rate, target_token"),
            ({"additional_compress_kwargs": {"rate": 1.5}}, "rate must be a number in"),
            ({"additional_compress_kwargs": {"target_token": 9}}, "target_token is the adapter's own field"),
        ):
            with pytest.raises(ValueError, match=says):  # never silently ignored
                cls(compressor=local, **given)
        with pytest.raises(TypeError, match="compressor must be a Compressor"):
            cls(compressor=object())
    assert LinguaCompressor(compressor=local).target_token == 300  # LLMLinguaCompressor's default
    assert LinguaPostprocessor(compressor=local).target_token == -1  # LongLLMLinguaPostprocessor's


def test_the_pages_example_prints_what_the_page_shows(lingua_checkpoints, tmp_path, monkeypatch, capsys):
    """docs/integrations.md's LLMLingua-2 example, run on the checkpoint it names (`prune
    test-checkpoint --family llmlingua2 --out lingua-tiny` writes the tests' XLM-R one): it prints
    the output the page pastes."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text(encoding="utf-8")
    blocks = page[page.index("## LLMLingua-2: LinguaCompressor") :].split("```")
    code, output = blocks[1].removeprefix("python\n"), blocks[3].strip("\n")
    (tmp_path / "lingua-tiny").symlink_to(lingua_checkpoints["xlm-roberta"])
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/integrations.md", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.strip("\n") == output
