"""Milvus's model service (engine/http/milvus.py), called as Milvus calls it.

No Milvus 2.6.8+ can be installed here (milvus-lite has no semantic highlighter, PyPI's
embedded `milvus` is 2.3), so the caller is tests/server/milvus_client.py: stubs generated
at test time from the vendored proto, in a process of its own, dialling as Milvus's Go
client does (gzip, its metadata, params as pymilvus renders them: str() of each value, JSON
for lists). The answers are checked as Milvus checks them (one result per document, as many
scores as sentences; dense vectors read as little-endian float32) and against the HTTP API:
Highlight keeps what /v1/prune keeps for the same question, documents and threshold, Rerank
scores what /rerank scores, Embedding is the encoder's embedding."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("grpc_tools", reason="the model service needs grpcio-tools ([model-service])")
pytest.importorskip("pymilvus", reason="the highlighter's params are rendered by pymilvus ([milvus])")
import httpx  # noqa: E402

from tests.utils import ApiProcess, free_ports, milvus_calls, serve_api  # noqa: E402

pytestmark = pytest.mark.server

QUERY = "When was the stadium built?"
HITS = ["The stadium was built in 1923. It holds 80,000 people. Football is played there.",
        "Paris is the capital of France. The stadium in Paris was built in 1998 for the cup.",
        "Nothing here answers. The weather was fine.",
        "😀 The stadium 中文 was built long ago. 🏟️ It was rebuilt in 2001."]


def pymilvus_params(threshold=None, pre_tags=None, post_tags=None, highlight_only=None) -> dict[str, str]:
    """A pymilvus SemanticHighlighter's params as Milvus forwards them to the model service:
    rendered by pymilvus' own Prepare.highlighter_schema (str() of a value, JSON of a list),
    less the three Milvus keeps (zilliz_highlight_provider.go)."""
    from pymilvus import SemanticHighlighter
    from pymilvus.client.prepare import Prepare
    h = SemanticHighlighter([QUERY], ["document"], threshold=threshold, pre_tags=pre_tags, post_tags=post_tags,
                            highlight_only=highlight_only, model_deployment_id="dep-1", max_client_batch_size=8)
    return {kv.key: kv.value for kv in Prepare.highlighter_schema(h).params
            if kv.key.lower() not in ("model_deployment_id", "max_client_batch_size", "timeout_ms")}


def checked(answer: dict, documents: list[str]) -> list[dict]:
    """A Highlight answer checked as Milvus checks it; its results."""
    assert answer["code"] == "OK", answer
    assert answer["status"]["code"] == 0
    results = answer["results"]
    assert len(results) == len(documents)            # "highlights size must equal to documents size"
    for r in results:
        assert len(r["sentences"]) == len(r["scores"])  # Milvus 2.6.9+: "sentences length ... does not match"
    return results


@pytest.fixture(scope="module", params=["opensearch", "embedding"])
def served(request, pruners, default_cache):
    from engine.http.app import ApiConfig
    from engine.rag.embedder import Embedder
    pruner = pruners[request.param][0]
    (port,) = free_ports(1)
    embedder = Embedder.load(default_cache["encoder"], threads=1) if request.param == "embedding" else None
    config = ApiConfig(model_service=f"127.0.0.1:{port}")
    with serve_api(pruner, config, embedder) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield request.param, client, f"127.0.0.1:{port}", embedder


def _prune(client: httpx.Client, documents: list[str], **options) -> list[dict]:
    r = client.post("/v1/prune", json={"question": QUERY, "passages": documents, **options})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def test_highlight_keeps_what_v1_prune_keeps(served):
    _, client, address, _ = served
    thresholds = [None, 0.0, 0.3, 0.5, 0.9]
    answers = milvus_calls(address, [{"rpc": "Highlight", "query": QUERY, "documents": HITS,
                                "params": pymilvus_params(threshold=t, pre_tags=["<mark>"], post_tags=["</mark>"],
                                                          highlight_only=True)} for t in thresholds])
    something = 0
    for t, answer in zip(thresholds, answers):
        expected = _prune(client, HITS, **({} if t is None else {"threshold": t}))
        for got, want in zip(checked(answer, HITS), expected):
            kept = [s for s in want["sentences"] if s["kept"]]
            assert got["sentences"] == [f"<mark>{s['text']}</mark>" for s in kept], t
            assert got["scores"] == pytest.approx([s["probability"] for s in kept], abs=1e-6)
            something += len(kept)
    assert something        # the comparison saw kept sentences, not only empty results


def test_tags_rotate_and_highlight_only_false_gives_the_whole_text(served):
    _, client, address, _ = served
    tags = {"pre_tags": ["<b>", "<i>"], "post_tags": ["</b>", "</i>"]}
    only, whole, java, default = milvus_calls(address, [
        {"rpc": "Highlight", "query": QUERY, "documents": HITS,
         "params": pymilvus_params(threshold=0.0, highlight_only=True, **tags)},
        {"rpc": "Highlight", "query": QUERY, "documents": HITS,
         "params": pymilvus_params(threshold=0.0, highlight_only=False, **tags)},
        {"rpc": "Highlight", "query": QUERY, "documents": HITS,       # the Java SDK: lower-case booleans
         "params": {**pymilvus_params(threshold=0.0, **tags), "highlight_only": "false"}},
        {"rpc": "Highlight", "query": QUERY, "documents": HITS, "params": pymilvus_params(threshold=0.0)}])
    expected = _prune(client, HITS, threshold=0.0)
    assert max(sum(s["kept"] for s in want["sentences"]) for want in expected) >= 2     # the tags rotate
    for k, want in enumerate(expected):
        kept = [s for s in want["sentences"] if s["kept"]]
        assert checked(only, HITS)[k]["sentences"] == [
            ("<b>", "<i>")[i % 2] + s["text"] + ("</b>", "</i>")[i % 2] for i, s in enumerate(kept)]
        assert checked(default, HITS)[k]["sentences"] == [f"<em>{s['text']}</em>" for s in kept]
        text, pos = "", 0
        for i, s in enumerate(kept):
            text += HITS[k][pos:s["start"]] + ("<b>", "<i>")[i % 2] + s["text"] + ("</b>", "</i>")[i % 2]
            pos = s["end"]
        text += HITS[k][pos:]
        got = checked(whole, HITS)[k]
        assert got == checked(java, HITS)[k]
        assert got["sentences"] == ([text] if kept else [])
        assert got["scores"] == (pytest.approx([max(s["probability"] for s in kept)]) if kept else [])


def test_rerank_scores_what_rerank_scores(served):
    _, client, address, _ = served
    (answer,) = milvus_calls(address, [{"rpc": "Rerank", "query": QUERY, "documents": HITS,
                                  "params": {"reranker": "model", "provider": "zilliz",
                                             "queries": json.dumps([QUERY])}}])
    assert answer["code"] == "OK" and answer["status"]["code"] == 0, answer
    tei = client.post("/rerank", json={"query": QUERY, "texts": HITS}).json()
    by_index = {r["index"]: r["score"] for r in tei}
    assert answer["scores"] == pytest.approx([by_index[i] for i in range(len(HITS))], abs=1e-6)


def test_embedding_is_the_encoders_or_unimplemented(served):
    family, _, address, embedder = served
    texts = [QUERY, HITS[0], "中文 😀"]
    query, document, empty = milvus_calls(address, [
        {"rpc": "Embedding", "texts": texts, "params": {"provider": "zilliz", "input_type": "query"}},
        {"rpc": "Embedding", "texts": texts[1:], "params": {"input_type": "document"}},
        {"rpc": "Embedding", "texts": [], "params": {}}])
    if embedder is None:
        assert query["code"] == "UNIMPLEMENTED" and "no embedding model" in query["details"], query
        return
    assert query["code"] == "OK" and query["status"]["code"] == 0, query
    want = embedder.encode(texts)
    assert np.allclose(np.array(query["dense"]), want, atol=1e-6)
    assert query["dim"] == [want.shape[1]] * 3 and query["dtype"] == [1] * 3        # DTYPE_FLOAT
    assert np.allclose(np.array(document["dense"]), want[1:], atol=1e-6)
    assert empty["code"] == "OK" and empty["dense"] == []


def test_bad_params_are_invalid_argument_and_the_server_keeps_answering(served):
    _, _, address, _ = served
    bad = [{"threshold": "high"}, {"threshold": "2"}, {"highlight_only": "maybe"}, {"pre_tags": "<b>"},
           {"pre_tags": "[]"}, {"post_tags": json.dumps([1, 2])}]
    answers = milvus_calls(address, [{"rpc": "Highlight", "query": QUERY, "documents": HITS, "params": p} for p in bad]
                     + [{"rpc": "Highlight", "query": " ", "documents": HITS, "params": {}},
                        {"rpc": "Highlight", "query": QUERY, "documents": HITS, "params": {}}])
    for params, answer in zip(bad, answers):
        assert answer["code"] == "INVALID_ARGUMENT", (params, answer)
        assert list(params)[0] in answer["details"] or "threshold" in answer["details"], (params, answer)
    assert answers[-2]["code"] == "INVALID_ARGUMENT", answers[-2]             # an empty question
    checked(answers[-1], HITS)


def test_no_documents_is_no_call(served):
    _, _, address, _ = served
    (answer,) = milvus_calls(address, [{"rpc": "Highlight", "query": QUERY, "documents": [], "params": {}}])
    assert checked(answer, []) == []


def test_api_key_limits_and_metrics(pruners):
    from engine.http.app import ApiConfig
    pruner = pruners["opensearch"][0]
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    config = ApiConfig(model_service=address, api_key="sekret", max_body_bytes=4000)
    with serve_api(pruner, config) as url:
        call = {"rpc": "Highlight", "query": QUERY, "documents": HITS, "params": {}}
        plain, keyed, wrong, large = milvus_calls(address, [
            call, {**call, "metadata": [["authorization", "Bearer sekret"]]},
            {**call, "metadata": [["authorization", "Bearer nope"]]},
            {**call, "documents": ["A long text. " * 400], "metadata": [["authorization", "Bearer sekret"]]}])
        assert plain["code"] == wrong["code"] == "UNAUTHENTICATED", (plain, wrong)
        checked(keyed, HITS)
        assert large["code"] == "RESOURCE_EXHAUSTED", large         # over --max-body-bytes
        metrics = httpx.get(f"{url}/metrics").text
    route = 'route="/milvus.proto.modelservice.HighlightService/Highlight"'
    assert f'prune_api_requests_total{{{route},status="OK"}} 1.0' in metrics, metrics
    assert f'prune_api_requests_total{{{route},status="UNAUTHENTICATED"}} 2.0' in metrics, metrics


def test_prune_api_with_the_default_model_serves_milvus(default_cache):
    """The command a user runs: `prune api --model default --model-service-port P` (the
    default model and its encoder from the test cache)."""
    (port,) = free_ports(1)
    api = ApiProcess("default", "--model-service-port", str(port), env=default_cache["env"])
    try:
        address = f"127.0.0.1:{port}"
        highlight, rerank, embedding = milvus_calls(address, [
            {"rpc": "Highlight", "query": QUERY, "documents": HITS, "params": pymilvus_params(threshold=0.5)},
            {"rpc": "Rerank", "query": QUERY, "documents": HITS, "params": {}},
            {"rpc": "Embedding", "texts": [QUERY], "params": {"input_type": "query"}}])
        expected = api.prune(question=QUERY, passages=HITS, threshold=0.5)
        assert [r["sentences"] for r in checked(highlight, HITS)] == [
            [f"<em>{s['text']}</em>" for s in r["sentences"] if s["kept"]] for r in expected]
        assert any(r["sentences"] for r in checked(highlight, HITS))       # the real model keeps the answer
        assert rerank["scores"][0] == max(rerank["scores"])
        assert len(embedding["dense"][0]) == 384                           # all-MiniLM-L6-v2
    finally:
        api.close()


def test_a_taken_port_is_one_clear_line_before_the_model_loads(exported, capsys):
    import socket
    from engine.cli import main
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["api", "--model", str(exported["opensearch"]), "--port", str(free_ports(1)[0]),
                     "--model-service-port", str(port)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"prune api: error: --model-service-port {port}: 127.0.0.1:{port} is in use; "
                                 "choose another port"], \
        (code, err)
