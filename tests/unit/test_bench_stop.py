"""`prune bench` stopped early keeps what it measured (#55): its runner (engine.bench.registry)
stops when its budget is spent or SIGTERM comes (gpu.sh runs it under `timeout`), keeps every
repeat that ended, and says which paths were not measured and why; a path that cannot start
or fails is a reason in the report, not a crash. The report of such a run is written
(engine.bench.report.markdown)."""

import os
import signal
from pathlib import Path

import pytest

from engine.bench import runner as bench_mod
from engine.bench.runner import measure
from engine.bench.session import BenchOptions, BenchPath, Session
from engine.bench.report import markdown
from engine.bench.runs import BenchStopped, Stop

pytestmark = pytest.mark.unit

MODELS = {"fp32": Path("fp32")}


class Q:
    question, passages = "q", ["a", "b"]


class Clock:
    """A clock the runners move: each repeat takes `step` seconds."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def session_with(stop: Stop, monkeypatch) -> Session:
    monkeypatch.setattr(bench_mod, "workload_batches", lambda p, qs: [])
    session = Session(BenchOptions(MODELS, Path("d"), repeats=3), [Q()], log=lambda m: None, stop=stop)
    session._cache[("pruner", "fp32", (("backend", "onnxruntime"),))] = object()
    return session


def path(name: str, each=None, start=None) -> BenchPath:
    """A path whose every repeat calls `each(round)` and takes 0.01 s."""
    calls = {"n": 0}

    def begin(s):
        if start is not None:
            return start(s)

        def run(r):
            calls["n"] += 1
            if each is not None:
                each(calls["n"])
            r.latencies = [0.01]
            return 0.01

        return run

    return BenchPath(name, "in-process", begin)


def test_a_spent_budget_keeps_the_rounds_that_ended(monkeypatch):
    clock = Clock()
    stop = Stop(budget_s=25, clock=clock)

    def tick(n):
        clock.now += 10  # every repeat takes 10 s of the budget

    session = session_with(stop, monkeypatch)
    results = measure(session, [path("a", tick), path("b", tick), path("c", tick)], 3)
    # a: 10 s, b: 20 s, c: 30 s -> spent before a's second repeat
    assert {n: len(r.seconds) for n, r in results.items()} == {"a": 1, "b": 1, "c": 1}
    assert stop.reason == "its budget of 25 s was spent"
    # a budget spent before a path starts: it is not started, and says so
    clock2 = Clock()
    stop2 = Stop(budget_s=15, clock=clock2)
    session2 = session_with(stop2, monkeypatch)

    def slow_start(s):
        clock2.now += 20  # starting it spends the budget: it never runs
        return lambda r: 0.01

    results2 = measure(session2, [path("x", start=slow_start), path("y")], 2)
    assert results2 == {}
    assert session2.reasons["y"] == "not started: prune bench stopped (its budget of 15 s was spent)"
    assert session2.reasons["x"].startswith("started, no repeat ended")


def test_sigterm_stops_a_repeat_at_once_and_keeps_the_rest(monkeypatch):
    stop = Stop()
    session = session_with(stop, monkeypatch)
    seen = []

    def term_in_round_2(n):
        if n == 2:
            if signal.getsignal(signal.SIGTERM) == stop.signalled:
                os.kill(os.getpid(), signal.SIGTERM)  # arrives inside the repeat: it is cut short
            else:  # not the main thread: no handler to send it to
                stop.signalled(signal.SIGTERM)
            seen.append("after the signal")  # never reached

    before = signal.getsignal(signal.SIGTERM)
    with stop.on_signals():
        results = measure(session, [path("a"), path("b", term_in_round_2), path("c")], 3)
        assert not stop.armed
        stop.signalled(signal.SIGTERM)  # while the report is written: recorded, no raise
    assert signal.getsignal(signal.SIGTERM) == before
    assert seen == []
    assert {n: len(r.seconds) for n, r in results.items()} == {"a": 2, "b": 1, "c": 1}
    assert stop.reason == "SIGTERM"


def test_paths_that_cannot_start_or_fail_are_reasons_not_crashes(monkeypatch):
    session = session_with(Stop(), monkeypatch)

    def broken_start(s):
        raise RuntimeError("torch.compile: inductor failed")

    def fails_in_round_2(n):
        if n == 2:
            raise RuntimeError("CUDA error")

    results = measure(
        session,
        [
            path("ok"),
            path("broken", start=broken_start),
            path("absent", start=lambda s: s.not_here("no GPU here")),
            path("flaky", fails_in_round_2),
        ],
        3,
    )
    assert {n: len(r.seconds) for n, r in results.items()} == {"ok": 3, "flaky": 1}
    assert session.reasons["broken"] == "failed to start: RuntimeError: torch.compile: inductor failed"
    assert session.reasons["absent"] == "no GPU here"
    assert session.reasons["flaky"] == "failed in round 2: RuntimeError: CUDA error"


def test_stop_check_and_arming():
    clock = Clock()
    stop = Stop(budget_s=5, clock=clock)
    stop.check()
    clock.now = 5
    with pytest.raises(BenchStopped, match="budget of 5 s"):
        stop.check()
    unlimited = Stop()
    unlimited.check()
    with unlimited.measuring():
        with pytest.raises(BenchStopped, match="SIGTERM"):
            unlimited.signalled(signal.SIGTERM)
    assert not unlimited.armed


def test_the_report_of_a_stopped_run_is_written():
    partial = {
        "date": "2026-12-04",
        "machine": {"cpus": 2, "python": "3.11", "onnxruntime": "1.31.1"},
        "settings": {"queries": 10, "passages": 200, "tokens": 110743, "data": "d", "repeats": 2},
        "stopped": "SIGTERM",
        "elapsed_s": 118.0,
        "paths": [
            {
                "path": "onnxruntime-cuda-fp16",
                "passages_per_s": 77.6,
                "tokens_per_s": 42993.0,
                "p50_ms": 237.0,
                "p95_ms": 250.0,
                "p99_ms": 260.0,
                "speedup_vs_reference": None,
                "repeats": 1,
            }
        ],
        "not_measured": ["torch-compile-batched-fp16"],
        "not_measured_reasons": {"torch-compile-batched-fp16": "not started: prune bench stopped (SIGTERM)"},
    }
    text = markdown(partial, "prune bench --device cuda")
    assert "**Stopped early**: SIGTERM (after 118 s)" in text and "onnxruntime-cuda-fp16 1" in text
    assert "- torch-compile-batched-fp16: not started: prune bench stopped (SIGTERM)" in text
    assert "| onnxruntime-cuda-fp16 | 77.6 |" in text
    # stopped before anything was measured: the machine, the settings and why, nothing else
    early = markdown(
        {
            "machine": {},
            "settings": {"queries": 10},
            "paths": [],
            "not_measured": [],
            "not_measured_reasons": {},
            "stopped": "its budget of 5 s was spent",
            "elapsed_s": 5.2,
        },
        "prune",
    )
    assert "No path was measured." in early and "budget of 5 s" in early


def test_on_a_gpu_each_path_first_runs_once_untimed(monkeypatch):
    """Sessions per shape, CUDA graphs and compiles are made in a GPU path's first pass: it
    runs once before the repeats, its seconds kept apart (`warmup_s`); a path that fails
    there is a reason, not a crash."""
    monkeypatch.setattr(bench_mod, "workload_batches", lambda p, qs: [])
    o = BenchOptions({"fp16": Path("f16")}, Path("d"), device="cuda", repeats=2)
    session = Session(o, [Q()], log=lambda m: None)
    session._cache[("pruner", "fp16", (("backend", "onnxruntime"),))] = object()
    calls = []

    def first_fails(n):
        if n == 1:
            raise RuntimeError("cannot capture the CUDA graph")

    results = measure(session, [path("a", calls.append), path("b", first_fails)], 2)
    assert calls == [1, 2, 3]  # the warm-up, then 2 timed repeats
    assert len(results["a"].seconds) == 2 and results["a"].extra["warmup_s"] >= 0
    assert list(results) == ["a"]
    assert session.reasons["b"] == "failed in its warm-up pass: RuntimeError: cannot capture the CUDA graph"


def test_under_a_budget_the_engine_starts_first_and_each_path_runs_once_at_its_start(monkeypatch):
    """A peer's long start (torch.compile compiling) must not leave the engine's path, or a
    path already started, without a repeat: under a budget the in-process paths start first
    and each path's first repeat runs as soon as it has started."""
    monkeypatch.setattr(bench_mod, "workload_batches", lambda p, qs: [])
    clock = Clock()
    o = BenchOptions(MODELS, Path("d"), repeats=3, budget_s=100)
    session = Session(o, [Q()], log=lambda m: None, stop=Stop(100, clock=clock))
    session._cache[("pruner", "fp32", (("backend", "onnxruntime"),))] = object()
    events = []

    def runs(name, start_s=0.0):
        def start(s):
            events.append(f"start {name}")
            clock.now += start_s

            def run(r):
                events.append(f"run {name}")
                clock.now += 1
                r.latencies = [0.01]
                return 0.01

            return run

        return BenchPath(name, "reference" if name != "engine" else "in-process", start)

    results = measure(session, [runs("torch"), runs("compile", start_s=97), runs("engine")], 3)
    assert events == [
        "start engine",
        "run engine",
        "start torch",
        "run torch",
        "start compile",
        "run compile",
    ]
    assert {n: len(r.seconds) for n, r in results.items()} == {"engine": 1, "torch": 1, "compile": 1}
    assert session.stop.reason == "its budget of 100 s was spent"
