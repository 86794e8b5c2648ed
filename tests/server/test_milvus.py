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
HITS = [
    "The stadium was built in 1923. It holds 80,000 people. Football is played there.",
    "Paris is the capital of France. The stadium in Paris was built in 1998 for the cup.",
    "Nothing here answers. The weather was fine.",
    "😀 The stadium 中文 was built long ago. 🏟️ It was rebuilt in 2001.",
]


def pymilvus_params(threshold=None, pre_tags=None, post_tags=None, highlight_only=None) -> dict[str, str]:
    """A pymilvus SemanticHighlighter's params as Milvus forwards them to the model service:
    rendered by pymilvus' own Prepare.highlighter_schema (str() of a value, JSON of a list),
    less the three Milvus keeps (zilliz_highlight_provider.go)."""
    from pymilvus import SemanticHighlighter
    from pymilvus.client.prepare import Prepare

    h = SemanticHighlighter(
        [QUERY],
        ["document"],
        threshold=threshold,
        pre_tags=pre_tags,
        post_tags=post_tags,
        highlight_only=highlight_only,
        model_deployment_id="dep-1",
        max_client_batch_size=8,
    )
    return {
        kv.key: kv.value
        for kv in Prepare.highlighter_schema(h).params
        if kv.key.lower() not in ("model_deployment_id", "max_client_batch_size", "timeout_ms")
    }


def milvus_embedding_params(**function_params) -> dict[str, str]:
    """A pymilvus text-embedding Function's params as Milvus's zilliz provider forwards them on
    an insert: rendered by pymilvus (str() of each value), less the two Milvus keeps, with
    `input_type` document (zilliz_embedding_provider.go)."""
    from pymilvus import Function, FunctionType
    from pymilvus.client.prepare import Prepare

    f = Function(
        "embed",
        FunctionType.TEXTEMBEDDING,
        input_field_names=["document"],
        output_field_names=["dense"],
        params={"provider": "zilliz", "model_deployment_id": "dep-1", **function_params},
    )
    return {
        **{
            kv.key: kv.value
            for kv in Prepare.convert_function_to_function_schema(f).params
            if kv.key.lower() not in ("model_deployment_id", "timeout_ms")
        },
        "input_type": "document",
    }


def checked(answer: dict, documents: list[str]) -> list[dict]:
    """A Highlight answer checked as Milvus checks it; its results."""
    assert answer["code"] == "OK", answer
    assert answer["status"]["code"] == 0
    results = answer["results"]
    assert len(results) == len(documents)  # "highlights size must equal to documents size"
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
    answers = milvus_calls(
        address,
        [
            {
                "rpc": "Highlight",
                "query": QUERY,
                "documents": HITS,
                "params": pymilvus_params(
                    threshold=t, pre_tags=["<mark>"], post_tags=["</mark>"], highlight_only=True
                ),
            }
            for t in thresholds
        ],
    )
    something = 0
    for t, answer in zip(thresholds, answers):
        expected = _prune(client, HITS, **({} if t is None else {"threshold": t}))
        for got, want in zip(checked(answer, HITS), expected):
            kept = [s for s in want["sentences"] if s["kept"]]
            assert got["sentences"] == [f"<mark>{s['text']}</mark>" for s in kept], t
            assert got["scores"] == pytest.approx([s["probability"] for s in kept], abs=1e-6)
            something += len(kept)
    assert something  # the comparison saw kept sentences, not only empty results


def test_tags_rotate_and_highlight_only_false_gives_the_whole_text(served):
    _, client, address, _ = served
    tags = {"pre_tags": ["<b>", "<i>"], "post_tags": ["</b>", "</i>"]}
    only, whole, java, default = milvus_calls(
        address,
        [
            {
                "rpc": "Highlight",
                "query": QUERY,
                "documents": HITS,
                "params": pymilvus_params(threshold=0.0, highlight_only=True, **tags),
            },
            {
                "rpc": "Highlight",
                "query": QUERY,
                "documents": HITS,
                "params": pymilvus_params(threshold=0.0, highlight_only=False, **tags),
            },
            {
                "rpc": "Highlight",
                "query": QUERY,
                "documents": HITS,  # the Java SDK: lower-case booleans
                "params": {**pymilvus_params(threshold=0.0, **tags), "highlight_only": "false"},
            },
            {"rpc": "Highlight", "query": QUERY, "documents": HITS, "params": pymilvus_params(threshold=0.0)},
        ],
    )
    expected = _prune(client, HITS, threshold=0.0)
    assert max(sum(s["kept"] for s in want["sentences"]) for want in expected) >= 2  # the tags rotate
    for k, want in enumerate(expected):
        kept = [s for s in want["sentences"] if s["kept"]]
        assert checked(only, HITS)[k]["sentences"] == [
            ("<b>", "<i>")[i % 2] + s["text"] + ("</b>", "</i>")[i % 2] for i, s in enumerate(kept)
        ]
        assert checked(default, HITS)[k]["sentences"] == [f"<em>{s['text']}</em>" for s in kept]
        text, pos = "", 0
        for i, s in enumerate(kept):
            text += HITS[k][pos : s["start"]] + ("<b>", "<i>")[i % 2] + s["text"] + ("</b>", "</i>")[i % 2]
            pos = s["end"]
        text += HITS[k][pos:]
        got = checked(whole, HITS)[k]
        assert got == checked(java, HITS)[k]
        assert got["sentences"] == ([text] if kept else [])
        assert got["scores"] == (pytest.approx([max(s["probability"] for s in kept)]) if kept else [])


def test_rerank_scores_what_rerank_scores(served):
    _, client, address, _ = served
    (answer,) = milvus_calls(
        address,
        [
            {
                "rpc": "Rerank",
                "query": QUERY,
                "documents": HITS,
                "params": {"reranker": "model", "provider": "zilliz", "queries": json.dumps([QUERY])},
            }
        ],
    )
    assert answer["code"] == "OK" and answer["status"]["code"] == 0, answer
    tei = client.post("/rerank", json={"query": QUERY, "texts": HITS}).json()
    by_index = {r["index"]: r["score"] for r in tei}
    assert answer["scores"] == pytest.approx([by_index[i] for i in range(len(HITS))], abs=1e-6)


def test_embedding_is_the_encoders_or_unimplemented(served):
    family, _, address, embedder = served
    texts = [QUERY, HITS[0], "中文 😀"]
    query, document, empty = milvus_calls(
        address,
        [
            {"rpc": "Embedding", "texts": texts, "params": {"provider": "zilliz", "input_type": "query"}},
            {"rpc": "Embedding", "texts": texts[1:], "params": {"input_type": "document"}},
            {"rpc": "Embedding", "texts": [], "params": {}},
        ],
    )
    if embedder is None:
        assert query["code"] == "UNIMPLEMENTED" and "no embedding model" in query["details"], query
        return
    assert query["code"] == "OK" and query["status"]["code"] == 0, query
    want = embedder.encode(texts)
    assert np.allclose(np.array(query["dense"]), want, atol=1e-6)
    assert query["dim"] == [want.shape[1]] * 3 and query["dtype"] == [1] * 3  # DTYPE_FLOAT
    assert np.allclose(np.array(document["dense"]), want[1:], atol=1e-6)
    assert empty["code"] == "OK" and empty["dense"] == []


def test_bad_params_are_invalid_argument_and_the_server_keeps_answering(served):
    _, _, address, _ = served
    bad = [
        {"threshold": "high"},
        {"threshold": "2"},
        {"highlight_only": "maybe"},
        {"pre_tags": "<b>", "post_tags": "[]"},
        {"pre_tags": "[]", "post_tags": "[]"},
        {"post_tags": json.dumps([1, 2]), "pre_tags": '["<b>"]'},
        {"pre_tags": '["<b>"]'},
        {"post_tags": '["</b>"]'},
    ]  # the last two: tags only in pairs
    answers = milvus_calls(
        address,
        [{"rpc": "Highlight", "query": QUERY, "documents": HITS, "params": p} for p in bad]
        + [
            {"rpc": "Highlight", "query": " ", "documents": HITS, "params": {}},
            {"rpc": "Highlight", "query": QUERY, "documents": HITS, "params": {}},
        ],
    )
    for params, answer in zip(bad, answers):
        assert answer["code"] == "INVALID_ARGUMENT", (params, answer)
        assert list(params)[0] in answer["details"] or "threshold" in answer["details"], (params, answer)
    assert answers[-2]["code"] == "INVALID_ARGUMENT", answers[-2]  # an empty question
    checked(answers[-1], HITS)


def test_no_documents_is_no_call(served):
    _, _, address, _ = served
    (answer,) = milvus_calls(address, [{"rpc": "Highlight", "query": QUERY, "documents": [], "params": {}}])
    assert checked(answer, []) == []


#: Authorization values, and whether they carry the API key "sekret": the one rule of the HTTP
#: API and the model service (ApiConfig.authorizes), driven through both below
KEYS = [
    ("Bearer sekret", True),
    ("bearer sekret", True),
    ("BEARER sekret", True),
    ("Bearer  sekret", True),
    (None, False),
    ("", False),
    ("sekret", False),
    ("Bearer", False),
    ("Bearer nope", False),
    ("Bearer sekret2", False),
    ("Bearer SEKRET", False),
    ("Basic sekret", False),
    ("Bearersekret", False),
    ("Token sekret", False),
]


def test_both_surfaces_take_the_same_keys_and_count_apart(pruners):
    from engine.http.app import ApiConfig

    pruner = pruners["opensearch"][0]
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    config = ApiConfig(model_service=address, api_key="sekret", max_body_bytes=4000)
    call = {"rpc": "Highlight", "query": QUERY, "documents": HITS, "params": {}}
    with serve_api(pruner, config) as url:
        http = [
            httpx.post(
                f"{url}/v1/prune",
                json={"question": QUERY, "passages": HITS[:1]},
                timeout=60,
                headers={} if value is None else {"Authorization": value},
            ).status_code
            for value, _ in KEYS
        ]
        grpc = milvus_calls(
            address,
            [
                {**call, **({} if value is None else {"metadata": [["authorization", value]]})}
                for value, _ in KEYS
            ]
            + [
                {
                    **call,
                    "documents": ["A long text. " * 400],
                    "metadata": [["authorization", "Bearer sekret"]],
                }
            ],
        )
        metrics = httpx.get(f"{url}/metrics").text
    for (value, passes), status, answer in zip(KEYS, http, grpc):
        assert (status == 200, answer["code"] == "OK") == (passes, passes), (value, status, answer)
        assert status in (200, 401) and answer["code"] in ("OK", "UNAUTHENTICATED"), (value, status, answer)
    assert grpc[-1]["code"] == "RESOURCE_EXHAUSTED", grpc[-1]  # over --max-body-bytes
    passed = sum(passes for _, passes in KEYS)
    route = 'route="/milvus.proto.modelservice.HighlightService/Highlight"'
    # gRPC's status codes count apart from HTTP's statuses (a metric each: code vs status)
    assert f'prune_api_grpc_requests_total{{code="OK",{route}}} {passed}.0' in metrics, metrics
    assert (
        f'prune_api_grpc_requests_total{{code="UNAUTHENTICATED",{route}}} {len(KEYS) - passed}.0' in metrics
    )
    assert f'prune_api_requests_total{{route="/v1/prune",status="401"}} {len(KEYS) - passed}.0' in metrics
    assert 'status="OK"' not in metrics and 'code="200"' not in metrics


def test_a_long_text_is_cut_to_the_encoders_window_and_counted(served):
    """A Milvus-shaped insert (the zilliz function's params, input_type document) of a text
    three times the encoder's window gets its vector: the embedding of the text's first window,
    as sentence-transformers and TEI's `truncate` cut; /metrics counts it. `truncate` false
    refuses it; `truncation_direction` Left keeps its end."""
    _, client, address, embedder = served
    if embedder is None:
        pytest.skip("this server has no encoder (Embedding answers UNIMPLEMENTED: tested above)")
    long = "The stadium was built long ago and many people watch football there every week. " * 60
    offsets = embedder.token_offsets(long)
    assert len(offsets) >= 3 * embedder.max_length
    before = _metric(client, "prune_api_truncated_texts_total")
    cut, refused, left = milvus_calls(
        address,
        [
            {"rpc": "Embedding", "texts": [long, QUERY], "params": milvus_embedding_params()},
            {"rpc": "Embedding", "texts": [QUERY, long], "params": milvus_embedding_params(truncate=False)},
            {
                "rpc": "Embedding",
                "texts": [long],
                "params": milvus_embedding_params(truncation_direction="Left"),
            },
        ],
    )
    assert cut["code"] == "OK" and cut["dim"] == [embedder.dim] * 2, cut
    room = embedder.max_length - 2  # [CLS] and [SEP] kept
    want = embedder.encode([long[: offsets[room - 1][1]], QUERY, long[offsets[-room][0] :]])
    assert np.allclose(np.array(cut["dense"]), want[:2], atol=1e-5)
    assert np.allclose(np.array(left["dense"][0]), want[2], atol=1e-5)
    assert refused["code"] == "INVALID_ARGUMENT" and f"at most {embedder.max_length}" in refused["details"], (
        refused
    )
    assert "text 1 is" in refused["details"]
    assert _metric(client, "prune_api_truncated_texts_total") == before + 2


def _metric(client: httpx.Client, name: str) -> float:
    """The value of an unlabelled metric of the API."""
    line = next(x for x in client.get("/metrics").text.splitlines() if x.startswith(name + " "))
    return float(line.split()[1])


def test_port_0_tells_the_port_it_bound(pruners):
    """`--model-service-port 0`: the system picks the port, and the server says which."""
    import re
    from engine.http.app import ApiConfig

    notes: list[str] = []
    with serve_api(pruners["opensearch"][0], ApiConfig(model_service="127.0.0.1:0"), log=notes.append):
        (note,) = [n for n in notes if "model service" in n]
        port = int(
            re.fullmatch(r"Milvus's model service listening on 127\.0\.0\.1:(\d+) \(gRPC\)", note).group(1)
        )
        (answer,) = milvus_calls(
            f"127.0.0.1:{port}", [{"rpc": "Highlight", "query": QUERY, "documents": HITS, "params": {}}]
        )
    assert port and checked(answer, HITS)


def test_prune_api_with_the_default_model_serves_milvus(default_cache):
    """The command a user runs: `prune api --model default --model-service-port P` (the
    default model and its encoder from the test cache)."""
    (port,) = free_ports(1)
    api = ApiProcess("default", "--model-service-port", str(port), env=default_cache["env"])
    try:
        address = f"127.0.0.1:{port}"
        highlight, rerank, embedding = milvus_calls(
            address,
            [
                {
                    "rpc": "Highlight",
                    "query": QUERY,
                    "documents": HITS,
                    "params": pymilvus_params(threshold=0.5),
                },
                {"rpc": "Rerank", "query": QUERY, "documents": HITS, "params": {}},
                {"rpc": "Embedding", "texts": [QUERY], "params": {"input_type": "query"}},
            ],
        )
        expected = api.prune(question=QUERY, passages=HITS, threshold=0.5)
        assert [r["sentences"] for r in checked(highlight, HITS)] == [
            [f"<em>{s['text']}</em>" for s in r["sentences"] if s["kept"]] for r in expected
        ]
        assert any(r["sentences"] for r in checked(highlight, HITS))  # the real model keeps the answer
        assert rerank["scores"][0] == max(rerank["scores"])
        assert len(embedding["dense"][0]) == 384  # all-MiniLM-L6-v2
    finally:
        api.close()


def test_a_taken_port_is_one_clear_line_before_the_model_loads(exported, capsys):
    import socket
    from engine.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(
            [
                "api",
                "--model",
                str(exported["opensearch"]),
                "--port",
                str(free_ports(1)[0]),
                "--model-service-port",
                str(port),
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        f"prune api: error: --model-service-port {port}: 127.0.0.1:{port} is in use; choose another port"
    ], (code, err)
