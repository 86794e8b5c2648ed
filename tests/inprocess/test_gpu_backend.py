"""The GPU graph's backend (#60), checked on the CPU provider (the same sessions, without
CUDA graphs): one copy of the weights handed to every session, one thread that makes and
runs every session, the copies synchronised before each replay, a dynamic session until a
shape is captured, the cap on captured shapes, and the outputs against the fp32 PyTorch
reference. onnxruntime is handed in behind a recorder (tests.utils.Recorder), so the tests
read which thread made each call and in what order."""

from __future__ import annotations

import threading
import time

import numpy as np
import onnx
import onnxruntime
import pytest

from engine.backends.gpu_graph import GpuGraphBackend, graph_rows
from engine.backends.gpu_shared import SHARE_MIN_BYTES, SharedWeights
from engine.pipeline.encode import BatchingConfig, ModelBatch
from engine.errors import BackendError
from engine.pruner import Pruner
from tests.utils import FAMILY_NAMES, PASSAGES, QUESTION, SESSION_CALLS, THREADS, Recorder, a_batch, unwrapped

pytestmark = pytest.mark.inprocess

BUDGET = BatchingConfig(max_batch_tokens=1024, max_batch_size=64)


def settled(core: GpuGraphBackend, timeout: float = 60.0) -> None:
    """Wait until the GPU thread has captured every shape it was asked for."""
    end = time.time() + timeout
    while core.gpu.call(lambda: len(core.wanted)) and time.time() < end:
        time.sleep(0.05)
    assert not core.wanted, "the idle captures did not finish"


@pytest.fixture
def recorded(gpu_exports):
    recorder = Recorder()
    core = GpuGraphBackend(
        gpu_exports["xprovence"] / "model.onnx",
        [64, 128],
        device="cpu",
        batching=BUDGET,
        threads=1,
        merge=False,  # each batch in its own shape: the outputs below are compared exactly
        ort=recorder.wrap(onnxruntime, "onnxruntime"),
    )
    yield core, recorder
    core.close()


def test_one_thread_makes_and_runs_every_session(recorded):
    core, recorder = recorded
    shapes = [(3, 64), (2, 128)]
    for rows, length in shapes:  # the first of each on the dynamic session; captured when idle
        core.infer(a_batch(rows, length, 0))
    settled(core)
    assert set(core.shapes) == {(4, 64), (2, 128)}
    work = [(rows, length, seed) for seed in range(20) for rows, length in shapes]
    expected = {w: core.infer(a_batch(*w)) for w in work}
    got: dict = {}

    def client(k: int) -> None:
        for w in work[k::4]:
            got[w] = core.infer(a_batch(*w))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(work)
    for w in work:  # each caller got its own batch's outputs, whatever ran beside it
        assert np.array_equal(got[w][0], expected[w][0]) and np.array_equal(got[w][1], expected[w][1]), w
    session_calls = [c for c in recorder.calls if c.name.split(".")[0].rstrip("()") in SESSION_CALLS]
    assert len(session_calls) > 200
    assert {c.thread for c in session_calls} == {core.gpu.thread.ident}
    runs = [c for c in session_calls if c.name == "InferenceSession.run_with_iobinding"]
    assert len(runs) >= 2 + 2 * len(work) + len(core.shapes)
    ordered = sorted(session_calls, key=lambda c: c.start)
    assert all(a.end <= b.start for a, b in zip(ordered, ordered[1:]))  # never two at once


def test_a_replay_reads_inputs_that_were_copied_and_synchronised(recorded):
    core, recorder = recorded
    core.infer(a_batch(2, 64, 1))
    settled(core)
    for seed in range(5):
        core.infer(a_batch(2, 64, seed))
    steps = recorder.named(
        "OrtValue.update_inplace",
        "IOBinding.synchronize_inputs",
        "IOBinding.bind_cpu_input",
        "InferenceSession.run_with_iobinding",
        "IOBinding.synchronize_outputs",
        "OrtValue.numpy",
    )
    names = [c.name for c in steps]
    captured = 0
    for i, name in enumerate(names):
        if name != "InferenceSession.run_with_iobinding":
            continue
        if (
            names[i - 1] == "IOBinding.bind_cpu_input"
        ):  # the dynamic session: ORT copies bound CPU inputs itself
            continue
        captured += 1
        assert names[i - 1] == "IOBinding.synchronize_inputs", names[i - 5 : i + 1]
        assert names[i - 4 : i - 1] == ["OrtValue.update_inplace"] * 3, names[i - 5 : i + 1]
        assert names[i + 1] == "IOBinding.synchronize_outputs"
    assert captured >= 6  # the capture's run and the five replays


def test_every_session_is_given_the_one_copy_of_the_weights(recorded):
    core, recorder = recorded
    for rows, length in [(1, 64), (4, 64), (1, 128)]:
        core.infer(a_batch(rows, length, 2))
    settled(core)
    shared = {name: unwrapped(value) for name, value in core.weights.values.items()}
    made = [i for i, c in enumerate(recorder.calls) if c.name == "InferenceSession()"]
    assert len(made) == 1 + len(core.shapes) == 4  # the dynamic session and three captured shapes
    given = [c for c in recorder.calls if c.name == "SessionOptions.add_initializer"]
    assert len(given) == 4 * len(shared)
    for k, at in enumerate(made):
        before = [
            c
            for c in recorder.calls[made[k - 1] if k else 0 : at]
            if c.name == "SessionOptions.add_initializer"
        ]
        assert {name: id(value) for name, value in (c.args for c in before)} == {
            name: id(value) for name, value in shared.items()
        }
    # the sessions read a graph that holds none of the shared weights' bytes
    skeleton = onnx.load(str(core.weights.graph), load_external_data=False)
    inline = [t.name for t in skeleton.graph.initializer if t.name in shared and t.raw_data]
    assert inline == []
    from onnx import numpy_helper

    source = onnx.load(str(core.source))
    floats = {
        t.name: numpy_helper.to_array(t).nbytes for t in source.graph.initializer if t.data_type in (1, 10)
    }
    assert (
        set(shared) == {name for name, size in floats.items() if size >= SHARE_MIN_BYTES}
        and len(shared) >= 10
    )
    assert core.weights.bytes == sum(floats[name] for name in shared) > 0.95 * sum(floats.values())


def test_the_sessions_read_the_shared_buffer_itself(tmp_path):
    # onnxruntime uses an initializer given to add_initializer in place: change the one buffer
    # and every session made with it sees the change (an Add: no kernel packs its weight)
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(SHARE_MIN_BYTES // 4, dtype=np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", w.size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", w.size])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [numpy_helper.from_array(w, "w")]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "add.onnx"))
    weights = SharedWeights(onnxruntime, tmp_path / "add.onnx", "cpu")
    sessions = []
    for _ in range(2):
        opts = onnxruntime.SessionOptions()
        weights.add_to(opts)
        sessions.append(
            onnxruntime.InferenceSession(str(weights.graph), opts, providers=["CPUExecutionProvider"])
        )
    feed = {"x": np.ones((1, w.size), np.float32)}
    assert all(np.array_equal(s.run(None, feed)[0][0], w + 1) for s in sessions)
    weights.values["w"].update_inplace(np.zeros_like(w))  # the one buffer, written in place
    assert all(np.array_equal(s.run(None, feed)[0][0], np.ones(w.size)) for s in sessions)
    weights.close()
    assert not weights.folder.exists()


def test_a_batch_runs_on_the_dynamic_session_until_its_shape_is_captured(gpu_exports):
    core = GpuGraphBackend(
        gpu_exports["xprovence"] / "model.onnx", [64, 128], device="cpu", batching=BUDGET, threads=THREADS
    )
    try:
        assert core.rows_for(64) == graph_rows(16) == (1, 2, 4, 8, 16) and core.rows_for(128) == (1, 2, 4, 8)
        assert core.shapes == {}  # nothing captured at load: no untimed sessions
        batch = a_batch(3, 64, 3)
        first = core.infer(batch)
        assert core.gpu.call(lambda: core.dynamic.runs) == 1
        settled(core)
        assert list(core.shapes) == [(4, 64)]  # 3 rows run in the 4-row shape
        again = core.infer(batch)
        assert core.shapes[(4, 64)].runs == 2  # its capture's run, then this batch
        assert first[1].shape == again[1].shape == (3, 64)
        assert np.allclose(first[1], again[1], atol=2e-3) and np.allclose(first[0], again[0], atol=2e-3)
        alone = [
            core.infer(
                ModelBatch(
                    batch.input_ids[i : i + 1],
                    batch.attention_mask[i : i + 1],
                    batch.sentence_ids[i : i + 1],
                    batch.token_type_ids[i : i + 1],
                    [i],
                )
            )
            for i in range(3)
        ]
        settled(core)
        assert np.allclose(
            np.concatenate([a[1] for a in alone]), again[1], atol=2e-3
        )  # spare rows change nothing
        with pytest.raises(BackendError, match="largest shape"):
            core.infer(ModelBatch(*(np.zeros((9, 128), np.int64) for _ in range(4)), list(range(9))))
        with pytest.raises(BackendError, match="lengths"):
            core.infer(ModelBatch(*(np.zeros((1, 96), np.int64) for _ in range(4)), [0]))
        with pytest.raises(BackendError, match="int64"):
            core.infer(ModelBatch(*(np.zeros((1, 64), np.int32) for _ in range(4)), [0]))
    finally:
        core.close()
    assert not core.gpu.thread.is_alive() and not core.weights.folder.exists()
    with pytest.raises(BackendError, match="closed"):
        core.infer(a_batch(1, 64, 0))


def test_past_the_cap_a_shape_stays_on_the_dynamic_session(gpu_exports):
    core = GpuGraphBackend(
        gpu_exports["provence"] / "model.onnx",
        [64],
        device="cpu",
        batching=BUDGET,
        max_graphs=1,
        warm=[(1, 64)],
        threads=THREADS,
    )
    try:
        assert list(core.shapes) == [(1, 64)]  # warmed at load
        batch = a_batch(2, 64, 4)
        out = [core.infer(batch) for _ in range(3)]
        settled(core)
        assert list(core.shapes) == [(1, 64)] and core.dynamic.runs == 3
        assert all(np.array_equal(o[1], out[0][1]) for o in out)
        assert "captured shapes (1x64; at most 1)" in core.describe()
    finally:
        core.close()


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_gpu_graph_sessions_agree_with_pytorch(gpu_exports, pruners, name):
    _, reference = pruners[name]
    spec_pruner = Pruner.load(gpu_exports[name], threads=THREADS)
    core = GpuGraphBackend(
        gpu_exports[name] / "model.onnx",
        [64, 128, 256, 512],
        device="cpu",
        batching=BatchingConfig(max_batch_tokens=2048, max_batch_size=16),
        threads=THREADS,
    )
    fixed = Pruner(core, spec_pruner.encoder.tokenizer, spec_pruner.spec, BatchingConfig())
    assert fixed.batching.strategy == "longest" and fixed.batching.buckets == (64, 128, 256, 512)
    total = same = 0
    try:
        for t in (0.1, 0.3, 0.5, 0.1):  # the first call on the dynamic session, later ones captured
            ref = reference.prune(QUESTION, PASSAGES, threshold=t)
            got = fixed.prune(QUESTION, PASSAGES, threshold=t)
            settled(core)
            for ra, rb in zip(ref, got):
                assert [(s.start, s.end) for s in ra.sentences] == [(s.start, s.end) for s in rb.sentences]
                assert abs(ra.reranking_score - rb.reranking_score) <= 0.01
                for a, b in zip(ra.sentences, rb.sentences):
                    assert abs(a.probability - b.probability) <= 0.005
                    total, same = total + 1, same + (a.kept == b.kept)
        assert same / total >= 0.99
        assert core.shapes and all(length in (64, 128, 256, 512) for _, length in core.shapes)
        assert sum(s.runs for s in core.shapes.values()) > len(core.shapes)  # captured shapes ran calls
    finally:
        core.close()


def test_under_load_a_busy_shape_is_captured_on_its_batch(gpu_exports):
    from engine.backends.gpu_graph import CAPTURE_AFTER

    core = GpuGraphBackend(
        gpu_exports["xprovence"] / "model.onnx", [64], device="cpu", batching=BUDGET, threads=THREADS
    )
    core.gpu.remove_idle(core)  # a load that never leaves the GPU idle
    try:
        batch = a_batch(2, 64, 5)
        first = core.infer(batch)
        for _ in range(CAPTURE_AFTER - 1):
            core.infer(batch)
        assert core.shapes == {} and core.dynamic.runs == CAPTURE_AFTER
        last = core.infer(batch)  # captured now, and run in it
        assert list(core.shapes) == [(2, 64)] and core.shapes[(2, 64)].runs == 2
        assert core.dynamic.runs == CAPTURE_AFTER
        assert np.allclose(first[1], last[1], atol=2e-3)
        assert (
            core.capture(1, 64) == (1, 64) and (1, 64) in core.shapes
        )  # a benchmark's capture before timing
    finally:
        core.close()


def test_what_the_gpu_thread_hands_back_is_the_callers_own(gpu_exports):
    # the bound output buffers are rewritten by the next batch: a caller must not be handed a view
    # of them (on the CPU provider OrtValue.numpy() can be one), or it reads another call's outputs
    core = GpuGraphBackend(
        gpu_exports["xprovence"] / "model.onnx",
        [64],
        device="cpu",
        batching=BUDGET,
        warm=[(2, 64)],
        threads=THREADS,
    )
    try:
        feeds = [{n: getattr(a_batch(2, 64, seed), n) for n in core.input_names} for seed in (1, 2)]
        first = core.gpu.call(core._run, (2, 64), feeds[0])
        kept = [a.copy() for a in first]
        core.gpu.call(core._run, (2, 64), feeds[1])
        assert all(np.array_equal(a, b) for a, b in zip(first, kept))
        assert not any(np.shares_memory(a, o.numpy()) for a in first for o in core.shapes[(2, 64)].outputs)
    finally:
        core.close()


def test_a_backend_dropped_without_close_ends_its_thread(gpu_exports):
    import gc

    core = GpuGraphBackend(gpu_exports["opensearch"] / "model.onnx", [64], device="cpu", threads=THREADS)
    core.infer(a_batch(1, 64, 0))
    thread, folder = core.gpu.thread, core.weights.folder
    del core
    gc.collect()
    thread.join(10)
    assert not thread.is_alive() and not folder.exists()


@pytest.mark.parametrize("layout", ["xlm-roberta", "bert"])
def test_the_compressors_gpu_graph_keeps_the_words_its_session_keeps(lingua_fp16, layout, tiktoken_offline):
    """LLMLingua-2's fp16 export on the GPU graph (GpuTokenProbs, here on the CPU provider): chunks
    padded to the graph's lengths and to its captured rows give the token probabilities of the same
    graph on a plain ONNX Runtime session (which runs each chunk at its own length), so the same
    words; the batches run in captured shapes once they are made."""
    from engine.backends.gpu_graph import graph_rows
    from engine.backends.gpu_token_probs import LINGUA_LENGTHS, GpuTokenProbs
    from engine.compressor import Compressor
    from engine.pipeline.lingua_decide import CompressOptions, plan
    from tests.utils import CASES

    session = Compressor.load(lingua_fp16[layout], threads=THREADS)
    core = GpuTokenProbs(lingua_fp16[layout] / "model.onnx", device="cpu", threads=THREADS)
    graph = Compressor(session.tokenizer, core, session.count.encoding)
    try:
        assert graph.batch_chunks == 16 and "GPU graph" in graph.describe()
        for rounds in range(2):  # the first on the dynamic session, the second in captured shapes
            for name, (context, options) in CASES.items():
                a = session.compress(context, **options, return_word_label=True).to_dict()
                b = graph.compress(context, **options, return_word_label=True).to_dict()
                assert a == b, (name, rounds)
            settled(core.backend)
        # the probabilities themselves: a padded position the mask let through moves them by 4e-3
        texts = [CASES["long-chunks"][0], CASES["en-rate-force"][0], *CASES["contexts-default"][0]]
        chunks = [
            c for cs in plan(session.tokenizer, texts, CompressOptions(), session.count).chunks for c in cs
        ]
        assert len(chunks) > 3
        for x, y in zip(session._token_probs(chunks), graph._token_probs(chunks)):
            np.testing.assert_allclose(x, y, atol=1e-4)
        shapes = core.backend.shapes
        assert shapes and all(n in LINGUA_LENGTHS and r in graph_rows(16) for r, n in shapes)
        assert sum(s.runs for s in shapes.values()) > len(shapes)  # captured shapes ran batches
    finally:
        graph.close()
    assert not core.backend.gpu.thread.is_alive()  # Compressor.close stopped the GPU thread
    with pytest.raises(BackendError, match="longer than 512"):
        GpuTokenProbs.token_probs(core, np.zeros((1, 513), np.int64), np.ones((1, 513), np.int64))


def test_the_compressor_on_cuda_without_onnxruntime_gpu_names_the_fix(lingua_fp16):
    from engine.compressor import Compressor
    from engine.errors import ModelLoadError

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: tests/inprocess/test_gpu.py runs it")
    with pytest.raises(ModelLoadError, match=r"prune-engine\[gpu\]"):
        Compressor.load(lingua_fp16["bert"], device="cuda")
