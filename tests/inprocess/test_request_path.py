"""The modules a `POST /v1/prune` runs code in, from the handler to the backend.

A newcomer following a request reads these and no others: the HTTP API's handler, its wire
types and its state; the call's cancellation (the worker runs it cancellable, the batches are
checked between them); the pruner, which orders the steps; the call's options and rules, the
sentences, the tokens, the decisions; the backend. The set is the layout's promise
(docs/development.md): a change that puts another module on the path changes it here, on
purpose. Traced on a warm server (the second request), for a trained family and the default one.
"""

from __future__ import annotations

import sys
import threading

import pytest

pytestmark = pytest.mark.inprocess

REQUEST_PATH = {
    "http/app.py",
    "http/models.py",
    "http/state.py",
    "cancellation.py",
    "pruner.py",
    "pipeline/inputs.py",
    "pipeline/text.py",
    "pipeline/encode.py",
    "pipeline/decide.py",
    "backends/onnxruntime.py",
}

BODY = {
    "question": "What is pruning?",
    "passages": [
        "Pruning drops sentences. It keeps answers. The sky is blue.",
        "Another passage here. With two sentences.",
    ],
}


def traced_modules(pruner) -> set[str]:
    """The engine modules whose functions run during the second of two /v1/prune requests."""
    from fastapi.testclient import TestClient

    from engine.http.app import create_app

    seen: set[str] = set()
    on = threading.Event()

    def trace(frame, event, arg):
        if on.is_set() and event == "call":
            path = frame.f_code.co_filename.replace("\\", "/")
            if "/engine/" in path:
                seen.add(path.rsplit("/engine/", 1)[1])
        return None

    sys.settrace(trace)
    threading.settrace(trace)  # the API's worker threads start after this
    try:
        with TestClient(create_app(pruner)) as client:
            assert client.post("/v1/prune", json=BODY).status_code == 200
            on.set()
            response = client.post("/v1/prune", json=BODY)
            on.clear()
    finally:
        sys.settrace(None)
        threading.settrace(None)
    assert response.status_code == 200, response.text
    assert len(response.json()["results"]) == 2
    return seen


@pytest.mark.parametrize("family", ["provence", "embedding"])
def test_a_prune_request_runs_code_in_ten_modules(exported, family):
    from engine.pruner import Pruner

    pruner = Pruner.load(exported[family], threads=1)
    try:
        assert traced_modules(pruner) == REQUEST_PATH
    finally:
        pruner.close()
