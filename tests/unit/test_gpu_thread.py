"""The process's one GPU thread (engine/backends/gpu_shared.GpuThread), with plain functions for
jobs: every user shares it and the last one ends it; jobs waiting with the same key are merged
into one run within their limit, each caller handed its own result; idle tasks wait for a quiet
moment. And the gpu_memory setting's parsing, and the memory budget's arithmetic."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from engine.backends.gpu_memory import DeviceMemory, MemoryBudget
from engine.backends.gpu_shared import IDLE_AFTER_S, GpuThread
from engine.errors import BackendError
from engine.settings import memory_limit
from tests.utils import FakeDevice

pytestmark = pytest.mark.unit


def test_every_user_shares_one_thread_and_the_last_release_ends_it():
    a, b = GpuThread.shared(), GpuThread.shared()
    try:
        assert a is b and a.thread.is_alive()
        assert a.call(threading.get_ident) == a.thread.ident
        a.release()
        assert b.thread.is_alive()  # one user is left
    finally:
        b.release()
    assert not b.thread.is_alive()
    with pytest.raises(BackendError, match="stopped"):
        b.call(lambda: 1)
    c = GpuThread.shared()  # a later user starts a new one
    try:
        assert c is not b and c.call(lambda: 2) == 2
    finally:
        c.release()


def hold(gpu: GpuThread) -> threading.Event:
    """Keep the thread busy until the returned event is set (so that jobs queue up behind)."""
    go, started = threading.Event(), threading.Event()

    def busy() -> None:
        started.set()
        go.wait(10)

    threading.Thread(target=gpu.call, args=(busy,), daemon=True).start()
    assert started.wait(10)
    return go


def submit(gpu: GpuThread, jobs: list[tuple], run) -> tuple[dict, list[threading.Thread]]:
    """Each (key, rows, limit, payload) of `jobs` from a thread of its own, in order; results by payload."""
    out: dict = {}

    def one(key, rows, limit, payload) -> None:
        try:
            out[payload] = gpu.merge(key, rows, limit, run, payload)
        except Exception as exc:  # handed back to the caller
            out[payload] = exc

    threads = []
    for job in jobs:
        t = threading.Thread(target=one, args=job)
        t.start()
        threads.append(t)
        time.sleep(0.02)  # queued in this order
    return out, threads


def test_waiting_jobs_of_one_key_run_as_one_within_their_limit():
    gpu = GpuThread.shared()
    runs: list[list] = []

    def run(payloads: list) -> list:
        runs.append(list(payloads))
        return [p * 10 for p in payloads]

    try:
        go = hold(gpu)
        # key "a": rows 2, 1, 2, 3 under a limit of 5 -> [1, 2, 4] together (2+1+2), 3 left for later;
        # key "b" is never merged with "a"
        jobs = [("a", 2, 5, 1), ("a", 1, 5, 2), ("b", 1, 5, 3), ("a", 2, 5, 4), ("a", 3, 5, 5)]
        out, threads = submit(gpu, jobs, run)
        go.set()
        for t in threads:
            t.join(10)
        assert out == {p: p * 10 for p in (1, 2, 3, 4, 5)}  # each caller its own result
        assert runs == [[1, 2, 4], [3], [5]]  # one run merged three jobs
    finally:
        gpu.release()


def test_jobs_carrying_arrays_are_merged_and_the_thread_stays_up():
    # the queue takes merged jobs out by identity: arrays, which have no truth value, must not be compared
    gpu = GpuThread.shared()
    runs: list[int] = []

    def run(payloads: list) -> list:
        runs.append(len(payloads))
        return [p * 2 for p in payloads]

    try:
        go = hold(gpu)
        arrays = [np.full((2, 3), k, np.int64) for k in range(3)]
        out: dict = {}
        threads = []
        for k, key in enumerate("xyx"):  # the second x is taken out from behind the y
            t = threading.Thread(
                target=lambda k=k, key=key: out.update({k: gpu.merge(key, 2, 8, run, arrays[k])})
            )
            t.start()
            threads.append(t)
            time.sleep(0.02)
        go.set()
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads) and gpu.thread.is_alive()
        assert all(np.array_equal(out[k], arrays[k] * 2) for k in range(3))
        assert runs == [2, 1]  # the two x jobs in one run, then y
    finally:
        gpu.release()


def test_a_failed_run_fails_every_caller_in_it_and_the_thread_goes_on():
    gpu = GpuThread.shared()

    def run(payloads: list) -> list:
        if 13 in payloads:
            raise RuntimeError("bad batch")
        return payloads

    try:
        go = hold(gpu)
        out, threads = submit(gpu, [("k", 1, 4, 12), ("k", 1, 4, 13)], run)
        go.set()
        for t in threads:
            t.join(10)
        assert all(isinstance(out[p], RuntimeError) for p in (12, 13))
        assert gpu.merge("k", 1, 4, run, 7) == 7
    finally:
        gpu.release()


def test_idle_tasks_run_only_after_a_quiet_moment():
    gpu = GpuThread.shared()
    ran: list[float] = []
    last_job: list[float] = []

    class Owner:
        def step(self) -> bool:
            ran.append(time.monotonic())
            return False

    owner = Owner()
    try:
        gpu.add_idle(owner.step)
        for _ in range(5):
            gpu.call(lambda: last_job.append(time.monotonic()))
            time.sleep(IDLE_AFTER_S / 4)  # jobs closer together than IDLE_AFTER_S
        deadline = time.monotonic() + 5
        while not ran and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ran and ran[0] >= last_job[-1] + IDLE_AFTER_S * 0.9
        gpu.remove_idle(owner)
        count = len(ran)
        gpu.call(lambda: None)
        time.sleep(IDLE_AFTER_S * 5)
        assert len(ran) == count
    finally:
        gpu.release()


@pytest.mark.parametrize(
    "text, value",
    [
        ("0.8", 0.8),
        ("1", 1.0),
        ("24GiB", 24 * 2**30),
        ("512MiB", 512 * 2**20),
        ("20GB", 20 * 10**9),
        ("1B", 1),
    ],
)
def test_the_memory_setting_is_a_share_or_a_size(text, value):
    assert memory_limit(text) == value


@pytest.mark.parametrize("text", ["0", "1.5", "100", "-0.2", "24", "GiB", "12 parsecs"])
def test_a_memory_setting_that_is_neither_is_refused(text):
    with pytest.raises(ValueError):
        memory_limit(text)


def test_the_budget_fits_a_fixed_and_a_per_token_cost_and_stops_at_it():
    memory = FakeDevice(10_000)
    budget = MemoryBudget(memory, 0.5)  # 5,000 bytes of the 10,000 free at load
    budget.reserve_tokens = 1000  # the dynamic session's largest batch
    assert budget.budget == 5000 and budget.fits(64, 64)  # nothing measured yet: no prediction
    mark = budget.mark()
    memory.now -= 100
    budget.weights = budget.took(mark)
    assert budget.keep(1, 64, 228, 0.5)  # 100 bytes a session holds whatever its size, 2 a token
    assert budget.cost() == (0.0, 228 / 64)  # one shape: all of its bytes per token (over-predicts)
    assert budget.keep(2, 64, 356, 0.5)
    fixed, per_token = budget.cost()
    assert round(fixed) == 100 and round(per_token, 6) == 2
    assert budget.predicted(4, 128) == 100 + 2 * 512
    # held 684; 8 x 128 would add 2,148 and the reserve 2,000: 4,832 <= 5,000; 16 x 128 would not
    assert budget.fits(8, 128) and not budget.fits(16, 128)
    assert not budget.keep(16, 128, 4200, 1.0)  # passed the budget when made: refused, not held
    assert budget.refused == [(16, 128)] and budget.used == 684 and not budget.over()
    assert budget.measured[-1] == (2048, 4200)  # its figures still teach the prediction
    report = budget.report()
    assert report["budget_bytes"] == 5000 and report["total_bytes"] == 684
    assert [s["bytes"] for s in report["shapes"]] == [228, 356] and report["refused_shapes"] == ["16x128"]
    unmeasured = MemoryBudget(DeviceMemory("cpu"), 0.8)
    assert unmeasured.budget is None and unmeasured.fits(512, 512) and not unmeasured.over()
    assert MemoryBudget(FakeDevice(10**9), memory_limit("1MiB")).budget == 2**20
