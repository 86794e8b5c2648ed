"""The passage gate (engine.pipeline.decide.gate_passages, `passage_margin`): a passage whose
reranking score is below the call's best minus the margin keeps nothing. By hand; the
same results when a call is cut into parts and gated again whole; the default model on
real RAG calls (the passages that do not answer come back empty, the ones that do keep
their sentences); the trained families unchanged unless a call asks; and every surface
(in-process, the Triton text model with a call cut into requests, the HTTP API, batch
files) answering a call alike."""

from __future__ import annotations

import json
import math

import pytest

from engine.errors import InputError
from tests.utils import DATA, THREADS

pytestmark = pytest.mark.server


# ---------------------------------------------------------------------- the default model


def _rag_calls(n: int | None = None):
    rows = [json.loads(line) for line in (DATA / "squad-dev-rag.jsonl").read_text().splitlines()]
    return rows[:n]


def test_the_default_model_empties_the_passages_that_do_not_answer(default_cache):
    """Real weights, real RAG calls (question + up to 20 passages of its article): at the
    defaults most passages that do not hold the answer keep nothing and the answer passage
    keeps a sentence; without the gate every passage keeps one (what the gate fixes). Every
    other call of the 32 (the suite's time; `prune eval --rag-data` reports all of them: the
    README's figures)."""
    from engine.pruner import Pruner

    pruner = Pruner.load(default_cache["model"], threads=THREADS)
    emptied = nongold = gold_kept = 0
    calls = _rag_calls()[::2]
    for n, row in enumerate(calls):
        gated = pruner.prune(row["question"], row["passages"])
        # the first 4 calls again without the gate (the suite's time: the rest is the same check)
        ungated = pruner.prune(row["question"], row["passages"], passage_margin=-1) if n < 4 else gated
        if n < 4:
            assert all(r.pruned_context for r in ungated if r.sentences)  # the old behaviour
        for g, u in zip(gated, ungated):
            assert [s.probability for s in g.sentences] == [s.probability for s in u.sentences]
            assert g.reranking_score == u.reranking_score
            if g.index == row["gold"]:
                gold_kept += bool(g.pruned_context)
            else:
                nongold += 1
                emptied += not g.pruned_context
                if g.pruned_context:
                    assert g.pruned_context == u.pruned_context  # kept passages decide as before
    assert emptied / nongold >= 0.85, f"only {emptied}/{nongold} non-gold passages emptied"
    assert gold_kept / len(calls) >= 0.85, f"the gold passage kept something in {gold_kept} calls"


def test_the_readme_call_empties_the_unrelated_passage(default_cache):
    from engine.pruner import Pruner

    pruner = Pruner.load(default_cache["model"], threads=THREADS)
    q = "What is the crust at the bottom of a paella called?"
    docs = [
        "Paella is a rice dish from Valencia. A good paella has a thin layer of toasted rice at the bottom "
        "of the pan, which Valencians call socarrat.",
        "A volcano forms where molten rock reaches the surface. Magma that erupts is called lava.",
    ]
    got = pruner.prune(q, docs)
    assert "socarrat" in got[0].pruned_context and got[1].pruned_context == ""
    assert got[1].compression_rate == 1.0
    assert pruner.prune(q, docs, passage_margin=-1)[1].pruned_context == "Magma that erupts is called lava."
    assert pruner.prune(q, docs[1:])[0].pruned_context  # alone, the volcano passage is the call's best


@pytest.mark.parametrize(
    "question, passages, answer",
    [
        (
            "中国的首都是哪里？",
            [
                "上海是中国最大的城市。它位于长江口。",
                "北京是中国的首都。北京有很多历史古迹。",
                "长城很长。它建于古代。",
            ],
            "北京是中国的首都。",
        ),
        (
            "東京タワーの高さは何メートルですか？",
            [
                "富士山は日本一高い山です。山頂は寒いです。",
                "東京タワーは港区にあります。東京タワーの高さは333メートルです。",
                "京都には寺が多い。",
            ],
            "東京タワーの高さは333メートルです。",
        ),
        (
            "한국의 수도는 어디입니까?",
            [
                "부산은 항구 도시입니다. 해변이 유명합니다.",
                "서울은 한국의 수도입니다. 인구가 많습니다.",
                "김치는 맛있습니다.",
            ],
            "서울은 한국의 수도입니다.",
        ),
        (
            "Qual é a capital de Portugal?",
            [
                "O Porto fica no norte. É famoso pelo vinho.",
                "Lisboa é a capital de Portugal. Fica junto ao rio Tejo.",
                "O fado é uma música tradicional.",
            ],
            "Lisboa é a capital de Portugal.",
        ),
    ],
)
def test_calls_in_other_languages_keep_the_answer_and_empty_the_rest(
    default_cache, question, passages, answer
):
    """The default model's encoder is English, so in Chinese, Japanese and Korean the
    lexical part carries the decision, counting character bigrams (engine.pipeline.decide)."""
    from engine.pruner import Pruner

    got = Pruner.load(default_cache["model"], threads=THREADS).prune(question, passages)
    assert [r.pruned_context for r in got] == ["", answer, ""]


def test_the_trained_families_decide_as_before_unless_a_call_asks(pruners):
    q = "When was the stadium built?"
    docs = [
        "The stadium was built in 1923. It holds 80,000 people.",
        "Paris is the capital of France.",
        "The river flows to the sea. The stadium opened in 1924.",
        "",
    ]
    for name in ("provence", "xprovence", "open_provence", "opensearch"):
        p = pruners[name][0]
        assert p.family.rules.passage_margin is None
        assert [r.to_dict() for r in p.prune(q, docs)] == [
            r.to_dict() for r in p.prune(q, docs, passage_margin=-1)
        ]
    p = pruners["xprovence"][0]
    off = p.prune(q, docs, threshold=0.0)  # every sentence kept: the gate's effect is visible
    best = max(r.reranking_score for r in off if r.reranking_score is not None)
    on = p.prune(q, docs, threshold=0.0, passage_margin=0.0)
    assert [bool(r.pruned_context) for r in on] == [r.reranking_score == best for r in off]


# ---------------------------------------------------------------------- every surface


def _call():
    """A call of 120 passages (more than the text model takes per request: 50): the two
    passages that name the question's words come first, so the later requests' own best
    passages pass their request's gate and must be emptied once the call is whole."""
    q = "When was the stadium in Lisbon built?"
    docs = [
        "The stadium in Lisbon was built in 1956. It holds 50,000 people.",
        "Lisbon's stadium was built when the city grew. Its roof came later.",
    ]
    docs += [f"Passage {i} talks about item {i}. Rivers flow to the sea near town {i}." for i in range(118)]
    return q, docs


def _decisions(results):
    return [(r.index, r.pruned_context, [s.kept for s in r.sentences]) for r in results]


def test_the_text_model_gates_a_call_cut_into_requests_as_in_process(pruners, server):
    from engine.pruner import Pruner
    from tests.utils import TEXT_MAX_PASSAGES

    local = pruners["embedding"][0]
    q, docs = _call()
    assert len(docs) > 2 * TEXT_MAX_PASSAGES
    want = local.prune(q, docs)
    # the test means something: the last request, alone, keeps a passage the whole call empties
    alone = local.prune(q, docs[2 * TEXT_MAX_PASSAGES :])
    assert any(r.pruned_context for r in alone)
    assert not any(r.pruned_context for r in want[2 * TEXT_MAX_PASSAGES :])
    assert any(r.pruned_context for r in want[:2])
    with Pruner.connect(server.grpc_url, "embedding_text") as remote:
        assert remote.family.rules.passage_margin == 0.1
        got = remote.prune(q, docs)
        assert _decisions(got) == _decisions(want)
        for margin in (0.0, 0.3, -1.0):
            assert _decisions(remote.prune(q, docs, passage_margin=margin)) == _decisions(
                local.prune(q, docs, passage_margin=margin)
            )
        assert _decisions(remote.prune(q, docs, top_k=5)) == _decisions(local.prune(q, docs, top_k=5))
        with pytest.raises(InputError, match="passage_margin"):
            remote.prune(q, docs, passage_margin=math.inf)


def test_the_http_api_and_its_client_gate_as_in_process(pruners):
    import urllib.request

    from engine.remote.http_client import HttpPruner
    from tests.utils import serve_api

    local = pruners["embedding"][0]
    q, docs = _call()
    with serve_api(local) as url, HttpPruner(url) as http:
        assert http.family.rules.passage_margin == 0.1
        with urllib.request.urlopen(url + "/info") as r:
            assert json.load(r)["defaults"]["passage_margin"] == 0.1
        for margin in (None, 0.0, -1.0):
            assert _decisions(http.prune(q, docs, passage_margin=margin)) == _decisions(
                local.prune(q, docs, passage_margin=margin)
            )
        body = json.dumps({"question": q, "passages": docs, "passage_margin": "wide"}).encode()
        req = urllib.request.Request(
            url + "/v1/prune", data=body, headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req)
        assert err.value.code == 422


def test_batch_files_gate_each_line_as_in_process(pruners, tmp_path):
    import io

    from engine.batchfile import run_file

    local = pruners["embedding"][0]
    q, docs = _call()
    lines = [
        {"id": "default", "question": q, "passages": docs},
        {"id": "margin", "question": q, "passages": docs, "passage_margin": 0.0},
        {"id": "off", "question": q, "passages": docs, "passage_margin": -1},
        {"id": "bad", "question": q, "passages": docs, "passage_margin": "x"},
    ]
    out = io.StringIO()
    run_file(local, io.StringIO("\n".join(json.dumps(x) for x in lines) + "\n"), out, progress=False)
    got = [json.loads(line) for line in out.getvalue().splitlines()]
    for rec, margin in zip(got[:3], (None, 0.0, -1)):
        want = local.prune(q, docs, passage_margin=margin)
        assert [(r["index"], r["pruned_context"]) for r in rec["results"]] == [
            (r.index, r.pruned_context) for r in want
        ]
    assert "passage_margin" in got[3]["error"]


def test_a_manifest_sets_or_clears_the_gate(exported):
    from engine.pipeline.spec import Manifest

    def spec_from_manifest(d):
        return Manifest.from_dict(d).spec()

    manifest = json.loads((exported["embedding"] / "manifest.json").read_text())
    assert manifest["defaults"]["passage_margin"] == 0.1  # written by the export
    assert spec_from_manifest(manifest).family.rules.passage_margin == 0.1
    del manifest["defaults"]["passage_margin"]  # an export made before the gate
    assert spec_from_manifest(manifest).family.rules.passage_margin == 0.1
    manifest["defaults"]["passage_margin"] = None  # the model's own choice: no gate
    assert spec_from_manifest(manifest).family.rules.passage_margin is None
    manifest["defaults"]["passage_margin"] = 0.25
    assert spec_from_manifest(manifest).family.rules.passage_margin == 0.25
    trained = json.loads((exported["provence"] / "manifest.json").read_text())
    assert spec_from_manifest(trained).family.rules.passage_margin is None


def test_the_adapters_drop_the_emptied_documents_and_take_the_margin(pruners):
    from langchain_core.documents import Document

    from engine.integrations.haystack import PruneRanker
    from engine.integrations.langchain import PruneCompressor
    from engine.integrations.llamaindex import PrunePostprocessor

    local = pruners["embedding"][0]
    q, docs = _call()
    docs = docs[:2] + docs[100:110]
    kept = [r.index for r in local.prune(q, docs) if r.pruned_context]
    assert 0 < len(kept) < len(docs)
    lc = PruneCompressor(pruner=local).compress_documents([Document(d) for d in docs], q)
    assert [d.page_content for d in lc] == [local.prune(q, docs)[i].pruned_context for i in kept]
    assert len(
        PruneCompressor(pruner=local, passage_margin=-1).compress_documents([Document(d) for d in docs], q)
    ) == len(docs)
    from haystack import Document as HDocument

    hs = PruneRanker(local, passage_margin=-1).run(query=q, documents=[HDocument(content=d) for d in docs])
    assert len(hs["documents"]) == len(docs)
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    li = PrunePostprocessor(pruner=local, passage_margin=0.0).postprocess_nodes(
        [NodeWithScore(node=TextNode(text=d)) for d in docs], QueryBundle(q)
    )
    assert len(li) == 1


def test_prune_runs_flags_apply_to_every_line_and_a_lines_own_options_win(pruners):
    import io

    from engine.pipeline.inputs import CallOptions
    from engine.batchfile import run_file

    local = pruners["embedding"][0]
    q, docs = _call()
    lines = [
        {"id": "flags", "question": q, "passages": docs},
        {"id": "own", "question": q, "passages": docs, "passage_margin": 0.0},
    ]
    out = io.StringIO()
    run_file(
        local,
        io.StringIO("\n".join(json.dumps(x) for x in lines) + "\n"),
        out,
        progress=False,
        options=CallOptions(passage_margin=-1),
    )
    got = [json.loads(line) for line in out.getvalue().splitlines()]
    for rec, margin in zip(got, (-1, 0.0)):
        assert [r["pruned_context"] for r in rec["results"]] == [
            r.pruned_context for r in local.prune(q, docs, passage_margin=margin)
        ]
