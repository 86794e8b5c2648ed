"""prune index / prune ask on a Milvus Lite file wait for its server: pymilvus connects to the
socket of a server process Milvus Lite starts, which on a busy machine comes later than
pymilvus waits; the pipeline retries (and says so) for up to LITE_START_S, and a database
that never answers is one clear error. A server's URI is tried once."""

import types

import pytest

from engine.rag import retrieval
from engine.rag.retrieval import Pipeline, PipelineError

pytestmark = pytest.mark.unit


def fake_pymilvus(failures: int, calls: list):
    class MilvusClient:
        def __init__(self, **kwargs):
            calls.append(kwargs)
            if len(calls) <= failures:
                raise ConnectionError("Fail connecting to server on unix:/tmp/x_rag.db.sock")

    return types.SimpleNamespace(MilvusClient=MilvusClient)


def test_a_slow_milvus_lite_is_waited_for(tmp_path, monkeypatch):
    calls, said = [], []
    monkeypatch.setattr(retrieval, "_milvus", lambda: fake_pymilvus(3, calls))
    monkeypatch.setattr(retrieval.time, "sleep", lambda s: None)
    pipe = Pipeline(tmp_path / "rag.db", log=said.append)
    assert pipe._connect(create=True) is not None and len(calls) == 4
    assert said == [f"{tmp_path / 'rag.db'}: Milvus Lite is starting; waiting up to 60 s for it ..."]


def test_a_milvus_lite_that_never_starts_is_one_clear_error(tmp_path, monkeypatch):
    calls = []
    clock = iter(range(0, 10_000, 10))  # each look at the clock: 10 s later
    monkeypatch.setattr(retrieval, "_milvus", lambda: fake_pymilvus(10_000, calls))
    monkeypatch.setattr(retrieval.time, "sleep", lambda s: None)
    monkeypatch.setattr(retrieval.time, "monotonic", lambda: next(clock))
    with pytest.raises(
        PipelineError, match=r"did not answer within 60 s\) \(ConnectionError: Fail connecting"
    ):
        Pipeline(tmp_path / "rag.db")._connect(create=True)
    assert 5 <= len(calls) <= 8


def test_a_milvus_lite_that_failed_to_start_is_not_waited_for(tmp_path, monkeypatch):
    """A file that is not a database: Milvus Lite's server exits and pymilvus says so at once
    (a ConnectionConfigException); waiting would only delay the error."""

    class MilvusClient:
        def __init__(self, **kwargs):
            calls.append(kwargs)
            raise RuntimeError("Open local milvus failed")

    calls = []
    monkeypatch.setattr(retrieval, "_milvus", lambda: types.SimpleNamespace(MilvusClient=MilvusClient))
    with pytest.raises(PipelineError, match="cannot open it as a Milvus Lite database \\(RuntimeError"):
        Pipeline(tmp_path / "rag.db")._connect(create=True)
    assert len(calls) == 1


def test_a_milvus_server_is_tried_once(monkeypatch):
    calls = []
    monkeypatch.setattr(retrieval, "_milvus", lambda: fake_pymilvus(1, calls))
    with pytest.raises(PipelineError, match="cannot open it as a Milvus server"):
        Pipeline("http://127.0.0.1:1")._connect(create=False)
    assert len(calls) == 1
