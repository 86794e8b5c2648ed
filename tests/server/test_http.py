"""The HTTP API (engine.http) on a real port, for both engines (the in-process pruner and
a Triton text model): every endpoint's results equal the in-process Pruner's; real
third-party clients of each protocol (the Cohere SDK's v1 and v2 clients and LangChain's
CohereRerank; LlamaIndex's and Haystack's TEI rerankers) work unmodified; hostile requests get 4xx and the server keeps serving."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import math
import time

import pytest

pytest.importorskip("fastapi")
import httpx  # noqa: E402

from engine.http.app import ApiConfig  # noqa: E402
from tests.utils import Preceded, run_in_threads, serve_api as serving, started_threads  # noqa: E402

pytestmark = pytest.mark.server


def rank_score(r, family: str, raw: bool) -> float:
    """What TEI's `score` must be for an xprovence result, computed here by hand: the
    sigmoid of the rerank logit (0.0 for an empty text)."""
    assert family == "xprovence" and not raw
    return 0.0 if r.reranking_score is None else 1.0 / (1.0 + math.exp(-r.reranking_score))


Q = "When was the stadium built?"
TEXTS = [
    "The stadium was built in 1923. It holds 80,000 people.",
    "Paris is the capital of France.",
    "",
    "The river flows to the sea. The stadium opened in 1924 after a year of work.",
]


@pytest.fixture(scope="module", params=["in-process", "text model"])
def api(request, pruners):
    """(base URL, the in-process pruner whose results it must give, family name)."""
    from engine.pruner import Pruner

    local = pruners["xprovence"][0]
    if request.param == "in-process":
        engine = local
    else:
        engine = Pruner.connect(request.getfixturevalue("server").grpc_url, "xprovence_text")
    with serving(engine) as url:
        yield url, local, "xprovence"
    if engine is not local:
        engine.close()


def test_tei_rerank_equals_the_pruner(api):
    url, local, family = api
    expected = local.prune(Q, TEXTS)
    got = httpx.post(f"{url}/rerank", json={"query": Q, "texts": TEXTS, "return_text": True}, timeout=30)
    assert got.status_code == 200, got.text
    body = got.json()
    order = sorted(expected, key=lambda r: -rank_score(r, family, False))
    assert [b["index"] for b in body] == [r.index for r in order]
    for b, r in zip(body, order):
        assert b["score"] == pytest.approx(rank_score(r, family, False), abs=1e-5)
        assert b["text"] == r.context and b["pruned_text"] == r.pruned_context
    raw = httpx.post(
        f"{url}/rerank",
        json={"query": Q, "texts": TEXTS[:2], "raw_scores": True, "return_sentences": True},
        timeout=30,
    ).json()
    by_index = {b["index"]: b for b in raw}
    for r in expected[:2]:
        assert by_index[r.index]["score"] == pytest.approx(r.reranking_score, abs=1e-5)
        assert [s["text"] for s in by_index[r.index]["sentences"]] == [s.text for s in r.sentences]
        assert "text" not in by_index[r.index]


def test_cohere_rerank_equals_the_pruner(api):
    url, local, family = api
    expected = sorted(local.prune(Q, TEXTS), key=lambda r: -rank_score(r, family, False))[:2]
    docs = [TEXTS[0], {"text": TEXTS[1]}, TEXTS[2], TEXTS[3]]
    for route in ("/v1/rerank", "/v2/rerank"):
        body = httpx.post(
            url + route,
            json={"model": "m", "query": Q, "documents": docs, "top_n": 2, "return_documents": True},
            timeout=30,
        ).json()
        assert [r["index"] for r in body["results"]] == [r.index for r in expected]
        assert [r["document"]["text"] for r in body["results"]] == [r.context for r in expected]
        assert body["id"] and body["meta"]["api_version"]["version"] == "2"


def test_native_prune_equals_the_pruner(api):
    url, local, _ = api
    expected = local.prune(Q, TEXTS, threshold=0.3, top_k=2)
    body = httpx.post(
        f"{url}/v1/prune",
        json={"question": Q, "passages": TEXTS, "threshold": 0.3, "top_k": 2, "pre": "<b>", "post": "</b>"},
        timeout=30,
    ).json()
    assert len(body["results"]) == 2
    for got, r in zip(body["results"], expected):
        want = r.to_dict()
        assert set(got) == set(want) | {"highlighted"}  # every field of the result, no more
        for key in ("index", "context", "pruned_context", "blocks", "windows", "unknown_share"):
            assert got[key] == want[key], key
        for key in ("reranking_score", "compression_rate", "threshold", "lexical_weight"):
            assert got[key] == pytest.approx(want[key], abs=1e-5), key
        assert [{k: v for k, v in s.items() if k != "probability"} for s in got["sentences"]] == [
            {k: v for k, v in s.items() if k != "probability"} for s in want["sentences"]
        ]
        assert [s["probability"] for s in got["sentences"]] == pytest.approx(
            [s["probability"] for s in want["sentences"]], abs=1e-5
        )
        assert got["highlighted"] == r.highlight("<b>", "</b>")


def test_health_info_metrics_and_schema(api):
    url, local, family = api
    assert httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok"
    info = httpx.get(f"{url}/info", timeout=30).json()
    assert info["family"] == family and info["limits"] == local.limits.to_dict()
    httpx.post(f"{url}/rerank", json={"query": Q, "texts": TEXTS[:1]}, timeout=30)
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    assert 'prune_api_requests_total{route="/rerank",status="200"}' in metrics
    assert "prune_api_request_seconds_bucket" in metrics and "prune_api_in_flight" in metrics
    schema = httpx.get(f"{url}/openapi.json", timeout=30).json()
    assert {"/rerank", "/v1/rerank", "/v2/rerank", "/v1/prune", "/health", "/info"} <= set(schema["paths"])
    # no page that loads its scripts from a CDN (blank offline): the schema is the reference
    assert [httpx.get(f"{url}{page}", timeout=30).status_code for page in ("/docs", "/redoc")] == [404, 404]
    # every field of /v1/prune's answer is in the schema, typed
    passage = schema["components"]["schemas"]["PrunedPassage"]["properties"]
    plain = local.prune(Q, TEXTS[:1])[0].to_dict()
    assert "budget" not in plain  # present only on a call with budget_tokens
    # the compressed text: only on a call that compresses (tests/inprocess/test_compress_kept.py)
    assert set(passage) == set(plain) | {"highlighted", "budget", "compressed_context", "compressed_spans"}
    assert passage["budget"]["anyOf"][0] == {"$ref": "#/components/schemas/BudgetOut"}
    budgeted = local.prune(Q, TEXTS[:1], budget_tokens=1000)[0].to_dict()
    assert set(schema["components"]["schemas"]["BudgetOut"]["properties"]) == set(budgeted["budget"])
    assert passage["sentences"]["items"] == {"$ref": "#/components/schemas/SentenceOut"}
    assert schema["components"]["schemas"]["PruneResponse"]["properties"]["results"]["items"] == {
        "$ref": "#/components/schemas/PrunedPassage"
    }


def test_real_clients_work_unmodified(api):
    """Cohere's protocol: the Cohere SDK (v2 and v1 clients, base_url pointed here) and
    LangChain's CohereRerank; TEI's: LlamaIndex's TEI reranker and Haystack's TEI ranker;
    as their users call them."""
    url, local, family = api
    expected = sorted(local.prune(Q, TEXTS), key=lambda r: -rank_score(r, family, False))
    cohere = pytest.importorskip("cohere")
    v2 = cohere.ClientV2(api_key="unused", base_url=url).rerank(model="m", query=Q, documents=TEXTS, top_n=3)
    assert [r.index for r in v2.results] == [r.index for r in expected[:3]]
    assert [r.relevance_score for r in v2.results] == pytest.approx(
        [rank_score(r, family, False) for r in expected[:3]], abs=1e-5
    )
    v1 = cohere.Client(api_key="unused", base_url=url).rerank(
        model="m", query=Q, documents=TEXTS, return_documents=True
    )
    assert [r.document.text for r in v1.results] == [r.context for r in expected]
    tei = pytest.importorskip("llama_index.postprocessor.tei_rerank")
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    nodes = [NodeWithScore(node=TextNode(text=t)) for t in TEXTS if t]
    out = tei.TextEmbeddingInference(base_url=url, top_n=2).postprocess_nodes(
        nodes, query_bundle=QueryBundle(Q)
    )
    non_empty = [r for r in expected if r.context]
    assert [n.node.get_content() for n in out] == [r.context for r in non_empty[:2]]
    from langchain_cohere import CohereRerank  # Cohere's protocol, a second client
    from langchain_core.documents import Document as LcDocument

    reranker = CohereRerank(cohere_api_key="unused", base_url=url, model="m", top_n=2)
    lc = reranker.compress_documents([LcDocument(page_content=t) for t in TEXTS], Q)
    assert [d.page_content for d in lc] == [r.context for r in expected[:2]]
    assert [d.metadata["relevance_score"] for d in lc] == pytest.approx(
        [rank_score(r, family, False) for r in expected[:2]], abs=1e-5
    )
    from haystack import Document
    from haystack.components.rankers import HuggingFaceTEIRanker, hugging_face_tei

    docs = [Document(content=t) for t in TEXTS if t]
    ranker = HuggingFaceTEIRanker(url=url, top_k=3)
    ranked = ranker.run(query=Q, documents=docs)["documents"]
    assert [d.content for d in ranked] == [r.context for r in non_empty[:3]]
    assert [d.score for d in ranked] == pytest.approx(
        [rank_score(r, family, False) for r in non_empty[:3]], abs=1e-5
    )
    right = ranker.run(
        query=Q, documents=docs, truncation_direction=hugging_face_tei.TruncationDirection.RIGHT
    )
    assert [d.content for d in right["documents"]] == [d.content for d in ranked]


def test_concurrent_clients_each_get_their_own_results(api):
    """8 clients, 12 calls each, every call its own question and texts: nothing lost or mixed."""
    url, local, family = api
    calls = [
        (
            f"When was stadium {i} built?",
            [
                f"Stadium {i} was built in {1900 + i}. It holds {i * 100} people.",
                f"Town {i} has a river. The river is {i} km long.",
            ],
        )
        for i in range(96)
    ]
    expected = [
        [
            (r.index, r.pruned_context)
            for r in sorted(local.prune(q, t), key=lambda r: -rank_score(r, family, False))
        ]
        for q, t in calls
    ]
    errors = []

    def client(k: int) -> None:
        with httpx.Client(timeout=60) as http:
            for i in range(k, len(calls), 8):
                q, t = calls[i]
                body = http.post(f"{url}/rerank", json={"query": q, "texts": t}).json()
                if [(b["index"], b["pruned_text"]) for b in body] != expected[i]:
                    errors.append((i, body))

    run_in_threads(client, 8, join_s=120)
    assert not errors, errors[:2]


# --------------------------------------------------------------------------- hostile


@pytest.fixture(scope="module")
def guarded(pruners):
    config = ApiConfig(api_key="s3cret", max_body_bytes=200_000, body_timeout=1.0, max_concurrent=4)
    with serving(pruners["opensearch"][0], config) as url:
        yield url


def _raw(url: str, data: bytes, pause: float = 0.0) -> bytes:
    """Bytes written to the API's socket as they are (with an optional pause in the middle)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        half = len(data) // 2
        s.sendall(data[:half])
        time.sleep(pause)
        try:
            s.sendall(data[half:])
        except OSError:
            pass
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


KEY = {"Authorization": "Bearer s3cret"}


@pytest.mark.parametrize(
    "case",
    [
        "no key",
        "wrong key",
        "huge declared size",
        "a 100 MB body",
        "nested JSON",
        "invalid UTF-8",
        "10,001 texts",
        "a body sent slowly",
        "wrong types",
        "not JSON",
    ],
)
def test_hostile_requests_get_4xx_and_the_server_keeps_serving(guarded, case):
    url = guarded
    good = {"query": Q, "texts": TEXTS[:2]}
    if case == "no key":
        r = httpx.post(f"{url}/rerank", json=good)
        assert r.status_code == 401 and "API key" in r.json()["error"]
    elif case == "wrong key":
        r = httpx.post(f"{url}/rerank", json=good, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
    elif case == "huge declared size":
        reply = _raw(
            url,
            b"POST /rerank HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer s3cret\r\n"
            b"Content-Type: application/json\r\nContent-Length: 99999999999\r\n\r\n{}",
        )
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    elif case == "a 100 MB body":
        r = httpx.post(f"{url}/rerank", content=b"[" + b"1," * 50_000_000 + b"1]", headers=KEY, timeout=60)
        assert r.status_code == 413
    elif case == "nested JSON":
        r = httpx.post(f"{url}/rerank", content=b"[" * 50_000 + b"]" * 50_000, headers=KEY, timeout=30)
        assert r.status_code == 422, r.text
    elif case == "invalid UTF-8":
        r = httpx.post(
            f"{url}/rerank",
            content=b'{"query": "q\xff\xfe", "texts": ["a."]}',
            headers={**KEY, "content-type": "application/json"},
            timeout=30,
        )
        assert r.status_code in (400, 422) and "UTF-8" in r.json()["error"], r.text
    elif case == "10,001 texts":
        r = httpx.post(f"{url}/rerank", json={"query": Q, "texts": ["a."] * 10_001}, headers=KEY, timeout=30)
        assert r.status_code == 422 and "10001 passages in one call; the limit is 10000" in r.json()["error"]
    elif case == "a body sent slowly":
        body = json.dumps(good).encode()
        reply = _raw(
            url,
            b"POST /rerank HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer s3cret\r\nContent-Type: "
            b"application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body,
            pause=2.5,
        )
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    elif case == "wrong types":
        r = httpx.post(f"{url}/rerank", json={"query": ["q"], "texts": "a"}, headers=KEY, timeout=30)
        assert r.status_code == 422 and r.json()["error"].startswith("query:")
    elif case == "not JSON":
        r = httpx.post(f"{url}/rerank", content=b"{bad", headers={**KEY, "content-type": "application/json"})
        assert r.status_code == 422
    ok = httpx.post(f"{url}/rerank", json=good, headers=KEY, timeout=30)
    assert ok.status_code == 200 and len(ok.json()) == 2
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200


@pytest.mark.parametrize(
    "route, body",
    [("/v1/prune", {"question": Q, "passages": TEXTS[:2]}), ("/rerank", {"query": Q, "texts": TEXTS[:2]})],
)
def test_json_sent_as_a_form_is_told_the_content_type(guarded, route, body):
    """`curl -d '{...}'` without -H sends its JSON as application/x-www-form-urlencoded: the
    422 (the usual error body) says to send it with Content-Type: application/json."""
    r = httpx.post(
        f"{guarded}{route}",
        content=json.dumps(body).encode(),
        timeout=30,
        headers={**KEY, "content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 422, r.text
    error = r.json()
    assert set(error) == {"error", "error_type", "message"} and error["error_type"] == "Validation"
    assert "Content-Type: application/json" in error["error"] and "x-www-form-urlencoded" in error["error"]
    assert error["message"] == error["error"]


def test_past_max_concurrent_the_answer_is_429_with_retry_after(pruners):
    """Requests beyond `max_concurrent` in flight are refused at once, not queued without bound."""
    gate = threading.Event()
    with serving(
        Preceded(pruners["opensearch"][0], lambda: gate.wait(10)), ApiConfig(max_concurrent=2, workers=2)
    ) as url:
        results = []
        threads = started_threads(
            lambda: results.append(
                httpx.post(f"{url}/rerank", json={"query": Q, "texts": ["a."]}, timeout=30)
            ),
            2,
        )
        time.sleep(0.5)
        refused = httpx.post(f"{url}/rerank", json={"query": Q, "texts": ["a."]}, timeout=30)
        gate.set()
        for t in threads:
            t.join(30)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert [r.status_code for r in results] == [200, 200]


def test_health_does_not_flap_under_load_and_turns_503_when_the_engine_fails(pruners):
    """/health is not queued behind user requests: with one worker busy for ~9 s of queued
    calls (past the old fixed 5 s limit), every health check answers 200 in time; once the
    engine fails, it answers 503 until the engine answers again."""
    from engine.errors import BackendError

    broken = threading.Event()

    def busy():
        if broken.is_set():
            raise BackendError("the backend is gone")
        time.sleep(1.5)

    with serving(
        Preceded(pruners["opensearch"][0], busy), ApiConfig(max_concurrent=16, workers=1, request_timeout=60)
    ) as url:
        results = []
        threads = started_threads(
            lambda: results.append(
                httpx.post(f"{url}/rerank", json={"query": Q, "texts": ["a."]}, timeout=60)
            ),
            6,
        )
        checks = []
        while any(t.is_alive() for t in threads):
            t0 = time.monotonic()
            r = httpx.get(f"{url}/health", timeout=60)
            checks.append((r.status_code, r.json().get("checked"), time.monotonic() - t0))
            time.sleep(0.3)
        for t in threads:
            t.join(60)
        assert [r.status_code for r in results] == [200] * 6
        assert len(checks) >= 10 and all(code == 200 for code, _, _ in checks), checks
        assert max(took for _, _, took in checks) < 4.0, checks  # never waited for the queue
        assert {"probe", "requests"} <= {how for _, how, _ in checks}, checks
        broken.set()
        assert httpx.post(f"{url}/rerank", json={"query": Q, "texts": ["a."]}, timeout=30).status_code == 503
        sick = httpx.get(f"{url}/health", timeout=30)
        assert sick.status_code == 503 and sick.json()["error_type"] == "Unhealthy", sick.text
        broken.clear()
        assert httpx.get(f"{url}/health", timeout=30).json() == {"status": "ok", "checked": "probe"}


def test_a_request_past_its_deadline_is_504(pruners):
    base = pruners["opensearch"][0]

    class Stuck:
        def __getattr__(self, name):
            return getattr(base, name)

        def prune(self, *args, **kwargs):
            time.sleep(2)
            return base.prune(*args, **kwargs)

    with serving(Stuck(), ApiConfig(request_timeout=0.5)) as url:
        r = httpx.post(f"{url}/rerank", json={"query": Q, "texts": ["a."]}, timeout=30)
        assert r.status_code == 504 and "0.5 s" in r.json()["error"]


def test_the_schema_fuzzed_gets_no_5xx_and_every_response_matches_it(pruners, tmp_path):
    """schemathesis (property-based, from the OpenAPI schema) against the running API: no
    5xx, and every response's status code, content type and body as documented."""
    import re
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    st = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")
    if not Path(st).exists():
        pytest.skip("schemathesis is not installed (the test extra has it)")
    with serving(pruners["opensearch"][0]) as url:
        proc = subprocess.run(
            [
                st,
                "run",
                f"{url}/openapi.json",
                "--checks",
                "not_a_server_error,response_schema_conformance,status_code_conformance,"
                "content_type_conformance",
                "-n",
                "40",
                "--generation-deterministic",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200
    tail = proc.stdout[-3000:]
    assert proc.returncode == 0, tail
    generated = re.search(r"(\d+) generated", proc.stdout)
    assert generated and int(generated.group(1)) >= 200, tail


def test_prune_says_which_passages_the_model_does_not_know_and_the_log_says_it_once(pruners, caplog):
    """/v1/prune's unknown_share (the test checkpoints' BERT vocabulary has no Hangul) and
    the API's log line (logger prune.api), the first such call's only within a minute; TEI's and
    Cohere's rerank answers keep their protocols' shapes (no such field)."""
    ko = "서울은 한국의 수도입니다. 부산은 큰 항구 도시입니다."
    with serving(pruners["embedding"][0]) as url, caplog.at_level(logging.WARNING, logger="prune.api"):
        body = httpx.post(
            f"{url}/v1/prune", json={"question": Q, "passages": [TEXTS[0], ko]}, timeout=30
        ).json()
        assert [r["unknown_share"] > 0.5 for r in body["results"]] == [False, True]
        tei = httpx.post(f"{url}/rerank", json={"query": Q, "texts": [ko]}, timeout=30).json()
        cohere = httpx.post(f"{url}/v2/rerank", json={"query": Q, "documents": [ko]}, timeout=30).json()
        assert "unknown_share" not in tei[0] and "unknown_share" not in cohere["results"][0]
    lines = [r.getMessage() for r in caplog.records if r.name == "prune.api"]
    assert len(lines) == 1 and lines[0].startswith("1 of 2 passage(s) (index 1) are largely unknown"), lines
    assert "naver/xprovence-reranker-bgem3-v2" in lines[0]
