"""One set of input rules (engine.pipeline.inputs) through every entry point: the in-process
Pruner, the text-model client, and the text model's own decoding (the server side).

The same bad call gets the same InputError and message from each; empty and
whitespace-only passages are accepted by each and come back alike."""

from __future__ import annotations

import re

import numpy as np
import pytest

from engine.errors import InputError
from engine.pipeline.inputs import Limits
from tests.utils import FAMILY_NAMES  # noqa: F401  (the fixtures' families)

pytestmark = pytest.mark.server


Q = "When was the stadium built?"
OK = ["The stadium was built in 1923. It holds 80,000 people."]
LIMITS = Limits(max_passages=3, max_chars=len(Q) + 120)

# name -> (question, passages, options, message): the message is matched in full
BAD = {
    "empty question": ("", OK, {}, "question is empty"),
    "whitespace question": (" \n\t", OK, {}, "question is empty"),
    "question not a str": (5, OK, {}, "question must be a str, got int"),
    "passages not a list": (Q, 5, {}, "passages must be a list of str, got int"),
    "passage not a str": (Q, ["fine.", b"bytes"], {}, "passage 1 must be a str, got bytes"),
    "lone surrogate in the question": (
        "why \ud800?",
        OK,
        {},
        "the question is not valid Unicode: a lone surrogate '\\ud800' at character 4",
    ),
    "lone surrogate in a passage": (
        Q,
        ["fine.", "a \udfff b"],
        {},
        "passage 1 is not valid Unicode: a lone surrogate '\\udfff' at character 2",
    ),
    "over the passage limit": (Q, ["a."] * 4, {}, "4 passages in one call; the limit is 3"),
    "over the character limit": (
        Q,
        ["a" * 60, "b" * 61],
        {},
        f"the call holds more than {len(Q) + 120} characters (question and passages "
        "together, passed at passage 1); split it into several calls",
    ),
    "threshold out of range": (Q, OK, {"threshold": 1.5}, "threshold must be in [0, 1], got 1.5"),
    "threshold NaN": (
        Q,
        OK,
        {"threshold": float("nan")},
        "threshold must be a finite number in [0, 1], got nan",
    ),
    "alpha out of range": (Q, OK, {"alpha": 2.0}, "alpha must be in [0, 1], got 2.0"),
    "top_k zero": (Q, OK, {"top_k": 0}, "top_k must be a positive integer, got 0"),
    "unknown title rule": (
        Q,
        OK,
        {"title": "always"},
        "title must be one of ('first_sentence', 'none'), got 'always'",
    ),
    "unknown windows": (
        Q,
        OK,
        {"windows": "tokens"},
        "windows must be one of ('reference', 'sentences'), got 'tokens'",
    ),
}
#: what the wire cannot carry (BYTES are bytes, UTF-8 has no lone surrogates): the client
#: refuses these before anything is sent, and the server never sees them
CLIENT_ONLY = {
    "question not a str",
    "passages not a list",
    "passage not a str",
    "lone surrogate in the question",
    "lone surrogate in a passage",
}


@pytest.fixture(scope="module")
def entry_points(server, pruners):
    """name -> prune(question, passages, **options), each with the call limits LIMITS."""
    from engine.pruner import Pruner
    from engine.remote.text_pruner import TritonTextPruner
    from engine.triton.wire import read_request

    base = pruners["xprovence"][0]
    local = Pruner(base.backend, base.encoder.tokenizer, base.spec, limits=LIMITS)
    remote = Pruner.connect(server.grpc_url, "xprovence_text")
    from engine.protocol import PrunerProtocol

    assert isinstance(remote, TritonTextPruner)
    assert isinstance(local, PrunerProtocol) and isinstance(remote, PrunerProtocol)
    remote.limits = LIMITS

    def decode(question, passages, **options):
        """The server side: the tensors a client sends, through the text model's decoding."""
        tensors = {
            "question": np.array([question.encode()], dtype=np.object_),
            "passages": np.array([p.encode() for p in passages], dtype=np.object_),
        }
        for k, v in options.items():
            tensors[k] = np.array([v.encode()], dtype=np.object_) if isinstance(v, str) else np.array([v])
        return read_request(tensors.get, LIMITS)

    yield {"in-process": local.prune, "text-model client": remote.prune, "text-model decoding": decode}
    remote.close()


@pytest.mark.parametrize("case", list(BAD))
def test_the_same_bad_call_gets_the_same_error_everywhere(entry_points, case):
    question, passages, options, message = BAD[case]
    seen = {}
    for name, prune in entry_points.items():
        if name == "text-model decoding" and case in CLIENT_ONLY:
            continue
        with pytest.raises(InputError) as err:
            prune(question, passages, **options)
        seen[name] = (type(err.value), str(err.value))
    assert set(seen.values()) == {(InputError, message)}, seen


def test_the_server_answers_a_bad_request_with_the_same_message(server):
    """Sent as raw tensors to the real text model (its own limits), the error carries the
    message, marked as bad input."""
    import tritonclient.grpc as grpcclient
    from engine.triton.wire import INPUT_ERROR_PREFIX

    client = grpcclient.InferenceServerClient(server.grpc_url)
    for case in ("empty question", "threshold out of range", "unknown windows"):
        question, passages, options, message = BAD[case]
        values = {
            "question": np.array([question.encode()], dtype=np.object_),
            "passages": np.array([p.encode() for p in passages], dtype=np.object_),
        }
        types = {"question": "BYTES", "passages": "BYTES"}
        for k, v in options.items():
            values[k] = (
                np.array([v.encode()], dtype=np.object_) if isinstance(v, str) else np.array([v], np.float32)
            )
            types[k] = "BYTES" if isinstance(v, str) else "FP32"
        tensors = []
        for k, arr in values.items():
            t = grpcclient.InferInput(k, list(arr.shape), types[k])
            t.set_data_from_numpy(arr)
            tensors.append(t)
        with pytest.raises(Exception, match=re.escape(INPUT_ERROR_PREFIX + message)):
            client.infer("xprovence_text", tensors, client_timeout=30)


def test_empty_and_whitespace_passages_are_accepted_alike(entry_points, pruners):
    passages = ["", OK[0], " \n\t "]
    results = {
        name: prune(Q, passages) for name, prune in entry_points.items() if name != "text-model decoding"
    }
    for name, got in results.items():
        assert [r.index for r in got] == [0, 1, 2], name
        for k in (0, 2):
            r = got[k]
            assert (r.sentences, r.reranking_score, r.pruned_context) == ([], None, ""), (name, r)
        assert got[1].sentences and got[1].reranking_score is not None
    a, b = results["in-process"], results["text-model client"]
    assert [r.compression_rate for r in a] == pytest.approx([r.compression_rate for r in b], abs=1e-6)
    req = entry_points["text-model decoding"](Q, passages)
    assert req.passages == passages
