"""The GPU graph as a serving process (#70), checked on the CPU provider (the same sessions,
without CUDA graphs): every GPU model of a process on the one GPU thread, concurrent callers'
batches merged into one run with each caller's rows handed back, every serving shape captured
before the load returns (smallest first, within the cap and the memory budget), the budget
measured per shape and refusing what passes it, weights that were copied instead of shared
falling back to one dynamic session, and /info and /metrics showing the figures. The device's
memory is a fake here (`FakeDevice`): each session takes bytes by the tokens of its shape."""

from __future__ import annotations

import threading
import weakref

import numpy as np
import onnxruntime
import pytest

from engine.backends.gpu_graph import GpuGraphBackend
from engine.pipeline.encode import BatchingConfig
from engine.pruner import Pruner
from tests.utils import PASSAGES, QUESTION, SESSION_CALLS, THREADS, FakeDevice, Recorder, a_batch

pytestmark = pytest.mark.inprocess

BUDGET = BatchingConfig(max_batch_tokens=1024, max_batch_size=64)
MiB = 2**20


class MeteredOrt:
    """onnxruntime, each session it makes holding bytes of `device` while it lives: `per_token`
    for each token of a fixed shape, `dynamic` for a session without one."""

    def __init__(self, device: FakeDevice, per_token: int, dynamic: int):
        self.device, self.per_token, self.dynamic = device, per_token, dynamic
        self.fixed_made = 0  # sessions made at a fixed shape (captures)

    def __getattr__(self, name: str):
        return getattr(onnxruntime, name)

    def InferenceSession(self, *args, **kwargs):  # noqa: N802 (onnxruntime's name)
        session = onnxruntime.InferenceSession(*args, **kwargs)
        shape = session.get_inputs()[0].shape
        fixed = all(isinstance(d, int) for d in shape)
        cost = self.per_token * shape[0] * shape[1] if fixed else self.dynamic
        self.fixed_made += fixed
        self.device.now -= cost
        weakref.finalize(session, lambda: setattr(self.device, "now", self.device.now + cost))
        return session


def test_warm_all_captures_the_serving_shapes_smallest_first_before_the_load_returns(gpu_exports):
    core = GpuGraphBackend(
        gpu_exports["xprovence"] / "model.onnx",
        [64, 128],
        device="cpu",
        batching=BUDGET,
        warm="all",
        max_graphs=5,
        threads=THREADS,
    )
    try:
        every = core.serving_shapes()
        assert every[:6] == [(1, 64), (2, 64), (1, 128), (4, 64), (2, 128), (8, 64)]  # by tokens
        assert sorted(core.shapes) == sorted(every[:5])  # made at load, up to the cap
        report = core.report()
        assert report["captured"] == 5 and len(report["shapes"]) == 5
        assert all(s["capture_seconds"] > 0 for s in report["shapes"])
        assert report["weights_shared"] is None and report["budget_bytes"] is None  # not measured here
        core.infer(a_batch(5, 64, 1))  # 8 x 64 is past the cap: the dynamic session, and no capture wanted
        assert core.gpu.call(lambda: (core.dynamic.runs, list(core.wanted))) == (1, [])
    finally:
        core.close()


def test_no_capture_goes_past_the_memory_budget(gpu_exports):
    device = FakeDevice(10_000 * MiB)
    ort = MeteredOrt(device, per_token=MiB, dynamic=50 * MiB)  # a 2 x 64 shape holds 128 MiB
    core = GpuGraphBackend(
        gpu_exports["xprovence"] / "model.onnx",
        [64, 128],
        device="cpu",
        batching=BUDGET,
        warm="all",
        memory_limit=1500 * MiB,
        memory=device,
        threads=THREADS,
        ort=ort,
    )
    try:
        report = core.report()
        held = [(s["rows"], s["length"], s["bytes"]) for s in report["shapes"]]
        # room is kept for the dynamic session's largest batch (16 x 64 = 1,024 tokens: 1,024 MiB here):
        # 50 (dynamic) + 64 + 128 + 128 + 256 (4 x 64) + 1,024 > 1,500: 4 x 64 is refused, and every later one
        assert held == [(1, 64, 64 * MiB), (2, 64, 128 * MiB), (1, 128, 128 * MiB)]
        assert ort.fixed_made == 3  # the refused shapes were predicted past the budget: never built
        assert report["reserved_for_dynamic_bytes"] == 1024 * MiB
        assert report["total_bytes"] == (50 + 64 + 128 + 128) * MiB
        assert report["budget_bytes"] == 1500 * MiB
        assert report["dynamic_session_bytes"] == 50 * MiB
        assert (
            report["weights_shared"] is None
        )  # < VERIFY_MIN_BYTES of weights: a session's own bytes weigh as much
        assert "4x64" in report["refused_shapes"]
        core.infer(a_batch(3, 64, 2))  # 4 x 64: on the dynamic session, never captured later
        assert core.gpu.call(lambda: (core.dynamic.runs, list(core.wanted))) == (1, [])
    finally:
        core.close()
    tiny = GpuGraphBackend(  # a first shape that alone passes the budget is released when measured
        gpu_exports["xprovence"] / "model.onnx",
        [64],
        device="cpu",
        batching=BUDGET,
        warm=[(1, 64)],
        memory_limit=80 * MiB,
        memory=device,
        threads=THREADS,
        ort=ort,
    )
    try:
        assert tiny.shapes == {} and tiny.memory.refused == [(1, 64)]
        assert tiny.report()["total_bytes"] == 50 * MiB
    finally:
        tiny.close()


def test_weights_copied_instead_of_shared_fall_back_to_one_dynamic_session(gpu_exports, monkeypatch):
    import engine.backends.gpu_graph as gpu_graph

    monkeypatch.setattr(gpu_graph, "VERIFY_MIN_BYTES", 0)  # the test model's weights are small
    device = FakeDevice(10_000 * MiB)
    graph = gpu_exports["xprovence"] / "model.onnx"
    shared = GpuGraphBackend(  # a dynamic session that takes none of the weights' bytes: shared in place
        graph, [64], device="cpu", memory=device, threads=THREADS, ort=MeteredOrt(device, MiB, dynamic=0)
    )
    try:
        assert shared.weights_shared is True and shared.weights.values
    finally:
        shared.close()
    plain = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    core = None
    with pytest.warns(RuntimeWarning, match="copied the shared weights"):
        core = GpuGraphBackend(
            graph,
            [64],
            device="cpu",
            batching=BUDGET,
            warm="all",
            memory=device,
            threads=THREADS,
            ort=MeteredOrt(device, per_token=MiB, dynamic=4000 * MiB),  # as much as a copy of the weights
            log=(said := []).append,
        )
    try:
        assert core.weights_shared is False and core.max_graphs == 0 and core.shapes == {}
        assert any("COPIED" in line for line in said)
        core.infer(a_batch(1, 64, 4))  # a shape never captured later either
        assert core.gpu.call(lambda: (list(core.wanted), len(core.shapes))) == ([], 0)
        batch = a_batch(2, 64, 3)
        rerank, probs = core.infer(batch)
        want = plain.run(None, batch.inputs(core.input_names))
        np.testing.assert_allclose(rerank, want[0], atol=1e-6)
        np.testing.assert_allclose(probs, want[1], atol=1e-6)
    finally:
        core.close()


def test_concurrent_batches_of_one_length_run_as_one_and_each_caller_gets_its_rows(gpu_exports):
    lazy = GpuGraphBackend(
        gpu_exports["xprovence"] / "model.onnx", [64], device="cpu", batching=BUDGET, threads=THREADS
    )
    try:  # a merged run never holds more rows than a captured shape (or the caller's own): no more
        assert lazy._merge_limit(2, 64) == 2 and lazy._merge_limit(3, 64) == 4  # memory than a lone call's
        lazy.capture(8, 64)
        assert lazy._merge_limit(2, 64) == 8
    finally:
        lazy.close()
    core = GpuGraphBackend(
        gpu_exports["xprovence"] / "model.onnx",
        [64],
        device="cpu",
        batching=BUDGET,
        warm="all",
        threads=THREADS,
    )
    try:
        assert core._merge_limit(1, 64) == 16  # every serving shape captured: up to the token budget's
        batches = [a_batch(rows, 64, seed) for seed, rows in enumerate((2, 3, 1, 2))]
        solo = [core.infer(b) for b in batches]
        go, busy = threading.Event(), threading.Event()

        def hold() -> None:
            busy.set()
            go.wait(10)

        holder = threading.Thread(target=core.gpu.call, args=(hold,))
        holder.start()
        assert busy.wait(10)
        got: dict[int, tuple] = {}
        callers = [
            threading.Thread(target=lambda i=i: got.update({i: core.infer(batches[i])})) for i in range(4)
        ]
        for c in callers:
            c.start()
        while core.gpu.call.__self__._jobs.__len__() < 4:  # all four wait behind the held thread
            threading.Event().wait(0.01)
        go.set()
        for c in callers + [holder]:
            c.join(30)
        assert core.merged == {"runs": 1, "batches": 4}  # 2 + 3 + 1 + 2 rows: one 8 x 64 run
        for i, b in enumerate(batches):
            assert got[i][1].shape == (b.shape[0], 64)
            np.testing.assert_allclose(got[i][0], solo[i][0], atol=2e-3)
            np.testing.assert_allclose(got[i][1], solo[i][1], atol=2e-3)
            for j in range(4):  # and not another caller's rows
                if j != i and got[j][1].shape == got[i][1].shape:
                    assert not np.allclose(got[i][1], solo[j][1], atol=2e-3)
    finally:
        core.close()


@pytest.fixture
def recorded_models(gpu_exports, lingua_fp16, tiktoken_offline):
    """A pruner and an LLMLingua-2 compressor, each on its GPU graph (the CPU provider), through
    one recording onnxruntime."""
    from engine.backends.gpu_token_probs import GpuTokenProbs
    from engine.compressor import Compressor

    recorder = Recorder()
    ort = recorder.wrap(onnxruntime, "onnxruntime")
    spec = Pruner.load(gpu_exports["xprovence"], threads=THREADS)
    core = GpuGraphBackend(
        gpu_exports["xprovence"] / "model.onnx",
        [64, 128, 256, 512],
        device="cpu",
        batching=BatchingConfig(max_batch_tokens=2048, max_batch_size=16),
        warm="all",
        max_graphs=6,
        threads=THREADS,
        ort=ort,
    )
    pruner = Pruner(core, spec.encoder.tokenizer, spec.spec, BatchingConfig())
    session = Compressor.load(lingua_fp16["bert"], threads=THREADS)
    lingua = GpuTokenProbs(
        lingua_fp16["bert"] / "model.onnx", device="cpu", threads=THREADS, warm="all", max_graphs=6, ort=ort
    )
    compressor = Compressor(session.tokenizer, lingua, session.count.encoding)
    yield pruner, compressor, recorder
    pruner.close()
    compressor.close()


def test_a_pruner_and_a_compressor_run_on_the_one_gpu_thread(recorded_models):
    from tests.utils import CASES

    pruner, compressor, recorder = recorded_models
    assert pruner.backend.gpu is compressor.core.backend.gpu  # the process's one GPU thread
    texts = [CASES["en-rate-force"][0], CASES["long-chunks"][0]]
    alone_p = [pruner.prune(QUESTION, PASSAGES[k:] + PASSAGES[:k], threshold=0.3) for k in range(3)]
    alone_c = [compressor.compress(t, rate=0.5).to_dict() for t in texts]
    got: dict = {}
    errors: list = []

    def client(k: int) -> None:
        try:
            for i in range(4):
                if (k + i) % 2:
                    got[("p", k, i)] = pruner.prune(
                        QUESTION, PASSAGES[k % 3 :] + PASSAGES[: k % 3], threshold=0.3
                    )
                else:
                    got[("c", k, i)] = compressor.compress(texts[k % 2], rate=0.5).to_dict()
        except Exception as exc:  # handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(got) == 24
    for (kind, k, _), out in got.items():
        if kind == "c":
            assert out == alone_c[k % 2]  # the same words as the compressor alone
            continue
        for a, b in zip(alone_p[k % 3], out):  # the pruner's decisions as alone, within fp16's tolerance
            assert [s.kept for s in a.sentences] == [s.kept for s in b.sentences]
            assert abs(a.reranking_score - b.reranking_score) <= 2e-3
    session_calls = [c for c in recorder.calls if c.name.split(".")[0].rstrip("()") in SESSION_CALLS]
    assert len({c.name for c in session_calls if c.name == "InferenceSession.run_with_iobinding"}) == 1
    assert {c.thread for c in session_calls} == {pruner.backend.gpu.thread.ident}  # made and run there
    ordered = sorted(session_calls, key=lambda c: c.start)
    assert all(a.end <= b.start for a, b in zip(ordered, ordered[1:]))  # never two at once
    assert pruner.backend.shapes and compressor.core.backend.shapes  # both captured


def test_info_and_metrics_show_the_device_figures(gpu_exports):
    from fastapi.testclient import TestClient

    from engine.http.app import create_app

    device = FakeDevice(10_000 * MiB)
    spec = Pruner.load(gpu_exports["xprovence"], threads=THREADS)
    core = GpuGraphBackend(
        gpu_exports["xprovence"] / "model.onnx",
        [64, 128],
        device="cpu",
        batching=BUDGET,
        warm=[(1, 64), (2, 128)],
        memory=device,
        threads=THREADS,
        ort=MeteredOrt(device, per_token=MiB, dynamic=50 * MiB),
    )
    pruner = Pruner(core, spec.encoder.tokenizer, spec.spec, BatchingConfig())
    try:
        with TestClient(create_app(pruner)) as client:
            info = client.get("/info").json()["device"]["model"]
            assert info["budget_bytes"] == int(0.8 * 10_000 * MiB)  # the default: 80% of the free memory
            assert [(s["rows"], s["length"], s["bytes"]) for s in info["shapes"]] == [
                (1, 64, 64 * MiB),
                (2, 128, 256 * MiB),
            ]
            assert info["total_bytes"] == (50 + 64 + 256) * MiB
            from prometheus_client.parser import text_string_to_metric_families

            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(client.get("/metrics").text)
                for s in family.samples
            }
            model = (("model", "model"),)
            assert samples[("prune_gpu_shape_bytes", (*model, ("shape", "2x128")))] == 256 * MiB
            assert samples[("prune_gpu_capture_seconds", (*model, ("shape", "1x64")))] > 0
            assert samples[("prune_gpu_held_bytes", model)] == 370 * MiB
            assert samples[("prune_gpu_captured_shapes", model)] == 2
    finally:
        pruner.close()
