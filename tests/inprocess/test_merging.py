"""Concurrent calls merged on an in-process core (engine/backends/merging.py; `merge_calls`):
batches of one length that wait together run as one, each caller handed its own rows and its
own sentence columns, and a call's results are those of the same call alone."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.backends.merging import MergingBackend
from engine.errors import InputError
from engine.models.loading import LoadOptions
from engine.pipeline.encode import ModelBatch
from engine.pruner import Pruner
from tests.utils import PASSAGES, QUESTION, THREADS

pytestmark = pytest.mark.inprocess


def a_batch(rows: int, length: int, sentences: int, seed: int) -> ModelBatch:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 100, size=(rows, length)).astype(np.int64)
    mask = np.ones_like(ids)
    sid = np.tile(np.minimum(np.arange(length) // 8, sentences - 1), (rows, 1)).astype(np.int64)
    sid[:, 0] = -1
    return ModelBatch(ids, mask, sid, np.zeros_like(ids), list(range(rows)))


def hold(thread) -> threading.Event:
    go, started = threading.Event(), threading.Event()

    def busy() -> None:
        started.set()
        go.wait(10)

    threading.Thread(target=thread.call, args=(busy,), daemon=True).start()
    assert started.wait(10)
    return go


def test_waiting_batches_of_one_length_run_as_one_with_each_callers_rows_and_columns(exported):
    pruner = Pruner.load(exported["xprovence"], threads=THREADS)
    core = MergingBackend(pruner.backend)
    try:
        batches = [
            a_batch(rows, 64, sentences, seed)
            for seed, (rows, sentences) in enumerate([(2, 3), (1, 5), (3, 2)])
        ]
        solo = [pruner.backend.infer(b) for b in batches]
        go = hold(core.thread)
        got: dict = {}
        callers = [
            threading.Thread(target=lambda i=i: got.update({i: core.infer(batches[i])})) for i in range(3)
        ]
        for c in callers:
            c.start()
        while len(core.thread._jobs) < 3:
            threading.Event().wait(0.01)
        go.set()
        for c in callers:
            c.join(30)
        assert core.merged == {"runs": 1, "batches": 3}
        for i, (rerank, probs) in enumerate(solo):
            assert got[i][1].shape == probs.shape  # its own sentence columns, not the run's
            np.testing.assert_allclose(got[i][0], rerank, rtol=0, atol=1e-6)
            np.testing.assert_allclose(got[i][1], probs, rtol=0, atol=1e-6)
    finally:
        core.close()


def test_concurrent_calls_through_a_merging_pruner_get_what_each_gets_alone(exported):
    with pytest.raises(InputError, match="merge_calls"):
        LoadOptions(merge_calls="sometimes")
    merged = Pruner.load(exported["provence"], threads=THREADS, merge_calls="on")
    alone = Pruner.load(exported["provence"], threads=THREADS, merge_calls="off")
    try:
        assert isinstance(merged.backend, MergingBackend) and not isinstance(alone.backend, MergingBackend)
        assert "concurrent calls merged" in merged.describe()
        calls = [PASSAGES[k:] + PASSAGES[:k] for k in range(len(PASSAGES))]
        want = [alone.prune(QUESTION, c, threshold=0.3) for c in calls]
        got: dict = {}
        threads = [
            threading.Thread(
                target=lambda i=i: got.update({i: merged.prune(QUESTION, calls[i], threshold=0.3)})
            )
            for i in range(len(calls))
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(got) == len(calls)
        for i, results in got.items():
            for a, b in zip(want[i], results):
                assert [s.kept for s in a.sentences] == [s.kept for s in b.sentences]
                assert a.pruned_context == b.pruned_context
                assert abs(a.reranking_score - b.reranking_score) <= 1e-5
                assert (
                    max(abs(x.probability - y.probability) for x, y in zip(a.sentences, b.sentences)) <= 1e-5
                )
        assert merged.backend.report()["merged_batches"] >= 2  # calls did wait together
    finally:
        merged.close()
        alone.close()
