"""A call with no passages (`"passages": []`): a call with nothing to prune, answered with no
results on every surface that takes a list (Python, /v1/prune, TEI's /rerank, Cohere's rerank),
its question and options checked all the same (docs/http-api.md says why, against TEI's and
Cohere's 400)."""

from __future__ import annotations

import pytest

from engine.errors import InputError

pytestmark = pytest.mark.inprocess

QUESTION = "When was the stadium built?"


@pytest.fixture(scope="module")
def client(exported):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from engine.http.app import ApiConfig, create_app
    from engine.pruner import Pruner

    pruner = Pruner.load(exported["xprovence"], threads=1)
    with TestClient(create_app(pruner, ApiConfig(model_name="x")).app) as c:
        yield pruner, c


def test_no_passages_is_no_results_everywhere(client):
    pruner, c = client
    assert pruner.prune(QUESTION, []) == []
    reply = c.post("/v1/prune", json={"question": QUESTION, "passages": []})
    assert (reply.status_code, reply.json()) == (200, {"model": "x", "results": []})
    reply = c.post("/rerank", json={"query": QUESTION, "texts": []})
    assert (reply.status_code, reply.json()) == (200, [])
    for route in ("/v1/rerank", "/v2/rerank"):
        reply = c.post(route, json={"query": QUESTION, "documents": []})
        assert reply.status_code == 200 and reply.json()["results"] == [], (route, reply.text)
    # one passage answers one result: the empty answer is the list's length, not a shortcut
    one = c.post("/v1/prune", json={"question": QUESTION, "passages": ["It was built in 1923."]}).json()
    assert [r["index"] for r in one["results"]] == [0]


@pytest.mark.parametrize(
    "body, error",
    [
        ({"question": "", "passages": []}, "question"),
        ({"question": QUESTION, "passages": [], "threshold": 2}, "threshold must be in [0, 1]"),
        ({"question": QUESTION, "passages": [], "top_k": 0}, "top_k must be a positive integer"),
        ({"question": QUESTION, "passages": [], "threshhold": 0.5}, "did you mean 'threshold'?"),
    ],
)
def test_no_passages_still_checks_the_question_and_the_options(client, body, error):
    pruner, c = client
    reply = c.post("/v1/prune", json=body)
    assert reply.status_code == 422 and error in reply.json()["error"], reply.text
    if "threshhold" not in body and body["question"]:
        with pytest.raises(InputError, match=error.split(" must")[0]):
            pruner.prune(
                body["question"], [], **{k: v for k, v in body.items() if k not in ("question", "passages")}
            )
