"""A real Triton server (the tritonserver binary of nvidia-pytriton, python backend running
ONNX Runtime), started by the tests on loopback ports.

Tolerance: results through Triton equal the in-process ONNX Runtime results within 1e-5
(the same graph runs on both sides; only the rows batched together differ).
"""

import shutil
import threading
import time

import numpy as np
import pytest

# Under the README's dev install these are present: a missing one is a broken install
# and fails here, it does not skip.
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from engine.pipeline.encode import BatchingConfig
from engine.errors import BackendError, ExportError
from engine.measuring import call_batches, call_blocks
from engine.pruner import Pruner
from engine.triton.server import TritonServer
from export.triton_repository import RepositoryOptions, build_repository
from tests.utils import CORE_MAX_BATCH, FAMILY_NAMES, free_ports, load_test, run_in_threads
from tests.utils import PASSAGES, QUESTION

pytestmark = pytest.mark.server

TOL = 1e-5


def _same(a, b, tol=TOL):
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert [s.text for s in ra.sentences] == [s.text for s in rb.sentences]
        np.testing.assert_allclose(
            [s.probability for s in ra.sentences], [s.probability for s in rb.sentences], atol=tol
        )
        assert ra.reranking_score == pytest.approx(rb.reranking_score, abs=1e-4)
        assert [s.kept for s in ra.sentences] == [s.kept for s in rb.sentences]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_triton_equals_in_process(server, pruners, name, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    remote = Pruner.connect(url, name, protocol=protocol)
    assert remote.spec.family.name == name
    _same(remote.prune(QUESTION, PASSAGES), pruners[name][0].prune(QUESTION, PASSAGES))
    # A batch larger than the core's max_batch_size reaches TritonBackend.infer_many,
    # which splits it (the Pruner clamps its own batches: undo that here).
    # passages of 1 to 4 sentences: the chunks of one batch come back with different
    # sentence widths and are re-padded when joined
    many = [f"Passage {i}." + " It talks about item {i}." * (i % 4) for i in range(40)]
    big = Pruner.connect(url, name, protocol=protocol)
    assert big.backend.max_batch_size == CORE_MAX_BATCH
    big.batching = BatchingConfig(max_batch_size=64)
    assert (
        max(b.shape[0] for b in call_batches(big, QUESTION, many, [[(0, len(p))] for p in many]))
        > CORE_MAX_BATCH
    )
    _same(big.prune(QUESTION, many), pruners[name][0].prune(QUESTION, many))


def _stats(server, model):
    import tritonclient.grpc as g

    st = g.InferenceServerClient(server.grpc_url).get_inference_statistics(model).model_stats[0]
    return st.inference_count, st.execution_count


def test_dynamic_batching_happens_and_changes_nothing(server, pruners):
    name = "xprovence"
    local = pruners[name][0]
    questions = [f"Question number {i} about the pie?" for i in range(24)]
    expected = [local.prune(q, [PASSAGES[0]]) for q in questions]
    inf0, exe0 = _stats(server, name)
    clients = [Pruner.connect(server.grpc_url, name) for _ in range(6)]
    results = [None] * len(questions)
    errors = []
    barrier = threading.Barrier(len(questions))

    def work(i):
        barrier.wait()
        try:
            results[i] = clients[i % len(clients)].prune(questions[i], [PASSAGES[0]])
        except Exception as exc:
            errors.append(repr(exc))

    run_in_threads(work, len(questions), join_s=60)
    assert not errors and all(r is not None for r in results), errors[:3]
    # Triton updates its statistics after it has sent the responses: on a busy machine the
    # last execution's counts can lag the clients by a moment
    deadline = time.monotonic() + 10
    while True:
        inf1, exe1 = _stats(server, name)
        if inf1 - inf0 >= len(questions) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert inf1 - inf0 == len(questions)  # one row per request
    assert exe1 - exe0 < inf1 - inf0  # ... run in fewer executions
    for got, exp in zip(results, expected):
        _same(got, exp)


def test_load_test_no_lost_or_mixed_results(server, pruners):
    """8 concurrent clients for 3 seconds (bounded count too): every result matches the
    in-process result of its own request."""
    name = "opensearch"
    local = pruners[name][0]
    docs = [
        f"The stadium {i} was built in {1900 + i}. It holds {i * 1000} people. Football is played."
        for i in range(16)
    ]
    expected = {i: local.prune(f"When was stadium {i} built?", [docs[i]]) for i in range(16)}

    def call(p, k, n):
        i = (k * 7 + n) % 16
        _same(p.prune(f"When was stadium {i} built?", [docs[i]]), expected[i])
        return i

    done, errors = load_test(lambda k: Pruner.connect(server.grpc_url, name), call, clients=8)
    assert not errors, errors[:3]
    assert len(done) >= 8


def test_faults_not_started_killed_restarted(exported, pruners, tmp_path):
    # a repository of the one model it calls: its server starts twice
    build_repository(
        exported["opensearch"],
        tmp_path,
        RepositoryOptions(name="opensearch", text_instances=1),
        log=lambda m: None,
    )
    repository = tmp_path
    h, g, m = free_ports(3)
    t0 = time.monotonic()
    with pytest.raises(BackendError, match="not reachable"):
        Pruner.connect(f"127.0.0.1:{g}", "opensearch", ready_timeout=2)
    assert time.monotonic() - t0 < 10
    server = TritonServer(repository, http_port=h, grpc_port=g, metrics_port=m).start()
    try:
        client = Pruner.connect(server.grpc_url, "opensearch", timeout=5, retries=4, backoff=0.5)
        http = Pruner.connect(
            server.http_url, "opensearch_text", protocol="http", timeout=5, retries=2, backoff=0.2
        )
        expected = pruners["opensearch"][0].prune(QUESTION, PASSAGES[:2])
        _same(client.prune(QUESTION, PASSAGES[:2]), expected)
        _same(http.prune(QUESTION, PASSAGES[:2]), expected)
        server.kill()
        t0 = time.monotonic()
        with pytest.raises(BackendError, match="failed"):
            for _ in range(50):
                client.prune(QUESTION, PASSAGES)
        with pytest.raises(BackendError, match="failed"):
            http.prune(QUESTION, PASSAGES)
        assert time.monotonic() - t0 < 30  # nothing hangs
        server.start()  # same ports
        _same(client.prune(QUESTION, PASSAGES[:2]), expected)  # the same clients work again, rightly
        _same(http.prune(QUESTION, PASSAGES[:2]), expected)
    finally:
        server.stop()


def test_unknown_model_is_a_clear_error(server):
    with pytest.raises(BackendError, match="not ready.*models there"):
        Pruner.connect(server.grpc_url, "no-such-model")


@pytest.mark.parametrize(
    "target, accel", [("cpu", False), ("gpu-onnx", False), ("gpu-onnx", True), ("gpu-tensorrt", False)]
)
def test_generated_configs_are_valid_triton_configs(exported, tmp_path, target, accel):
    import json
    import onnx

    folder = exported["opensearch"]
    if accel:  # TensorRT takes no contrib op: the optimized graph is refused, the export's plain graph given
        with pytest.raises(ExportError, match="TensorRT cannot take.*com.microsoft.Attention"):
            build_repository(
                folder, tmp_path, RepositoryOptions(target=target, trt_accelerator=True), log=print
            )
        folder = tmp_path / "with-trt"
        shutil.copytree(exported["opensearch"], folder)
        plain = onnx.load(str(folder / "model.onnx"))
        for n in plain.graph.node:
            n.domain = ""  # a stand-in for prune export --tensorrt's plain graph: no contrib op
        onnx.save(plain, str(folder / "model.trt.onnx"))
    model_dir = build_repository(
        folder,
        tmp_path,
        RepositoryOptions(target=target, name="m", max_batch_size=32, trt_accelerator=accel),
        log=lambda m: None,
    )
    if accel:
        assert (model_dir / "1" / "model.onnx").read_bytes() == (folder / "model.trt.onnx").read_bytes()
    cfg = text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    graph = onnx.load(str(folder / "model.onnx")).graph
    assert [i.name for i in cfg.input] == [i.name for i in graph.input]
    assert [o.name for o in cfg.output] == [o.name for o in graph.output]
    for i in cfg.input:
        assert i.data_type == model_config_pb2.TYPE_INT64 and list(i.dims) == [-1]
    assert list(cfg.output[0].dims) == [1] and list(cfg.output[0].reshape.shape) == []
    assert cfg.output[1].data_type == model_config_pb2.TYPE_FP32 and list(cfg.output[1].dims) == [-1]
    assert cfg.max_batch_size == 32 and all(b <= 32 for b in cfg.dynamic_batching.preferred_batch_size)
    kind = cfg.instance_group[0].kind
    if target == "cpu":
        assert cfg.backend == "python" and kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
        assert (model_dir / "1" / "model.py").is_file() and (model_dir / "1" / "model.onnx").is_file()
    else:
        assert kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
        assert cfg.platform == {"gpu-onnx": "onnxruntime_onnx", "gpu-tensorrt": "tensorrt_plan"}[target]
    if accel:
        acc = cfg.optimization.execution_accelerators.gpu_execution_accelerator[0]
        assert acc.name == "tensorrt" and acc.parameters["precision_mode"] == "FP16"
    manifest = json.loads(cfg.parameters["prune_manifest"].string_value)
    assert manifest["family"] == "opensearch"
    if target == "gpu-onnx":  # the keys Triton's onnxruntime backend reads, not the python core's
        assert cfg.parameters["arena_extend_strategy"].string_value == "1"
        assert not {"intra_op_threads", "ort_arena", "ort_denormals"} & set(cfg.parameters)
    for w in cfg.model_warmup:
        assert w.inputs["attention_mask"].input_data_file
        assert (model_dir / "warmup" / w.inputs["attention_mask"].input_data_file).is_file()


def test_python_backend_joins_lengths_and_isolates_a_bad_request(server, pruners):
    """Requests of different lengths batched together are padded inside the python
    backend, run once and split back: each equals its own in-process result. A malformed
    request in the same batch gets its own error; the others still run."""
    import tritonclient.grpc as g

    name = "opensearch"
    local = pruners[name][0]
    names = local.spec.input_names
    batches = []
    for i, length in enumerate([32, 96, 64, 160]):
        blocks = call_blocks(local, QUESTION, [PASSAGES[3][: length * 3]], [[(0, length * 3)]])
        b = local._batches(blocks[:1])[0]
        batches.append(b)
    assert len({b.shape[1] for b in batches}) == 4
    expected = [local.backend.infer(b) for b in batches]
    results, errors = [None] * 4, []
    barrier = threading.Barrier(5)
    client = g.InferenceServerClient(server.grpc_url)

    def send(feeds, k=None):
        tensors = []
        for n, arr in feeds.items():
            t = g.InferInput(n, list(arr.shape), "INT64")
            t.set_data_from_numpy(arr)
            tensors.append(t)
        barrier.wait()
        try:
            res = client.infer(name, tensors, client_timeout=30)
            results[k] = (res.as_numpy("rerank_score").reshape(-1), res.as_numpy("sentence_probs"))
        except Exception as exc:
            errors.append((k, str(exc)))

    bad = {n: batches[0].inputs(names)[n] for n in names}
    bad["sentence_ids"] = bad["sentence_ids"][:, :10]  # shapes disagree
    threads = [threading.Thread(target=send, args=(b.inputs(names), k)) for k, b in enumerate(batches)]
    threads.append(threading.Thread(target=send, args=(bad, None)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [k for k, _ in errors] == [None] and "disagree in shape" in errors[0][1]
    for (r_got, p_got), (r_exp, p_exp) in zip(results, expected):
        np.testing.assert_allclose(r_got, r_exp, atol=1e-5)
        np.testing.assert_allclose(p_got, p_exp, atol=1e-5)


def test_retry_succeeds_after_a_connection_error(server):
    client = Pruner.connect(server.grpc_url, "opensearch", retries=2, backoff=0.01).backend.transport
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("failed to connect to all addresses; connection refused")
        return "ok"

    assert client._call(flaky) == "ok" and len(calls) == 2
    with pytest.raises(ValueError):  # not a connection error: no retry
        client._call(lambda: (_ for _ in ()).throw(ValueError("bad shape")))


def test_infer_many_splits_and_repads_the_sentence_axis(server, pruners):
    """A 40-row batch through a core whose max_batch_size is 16: three requests whose
    sentence widths differ (1, 3, 2), joined back into one [40, 3] result equal to the
    in-process result of the whole batch."""
    local = pruners["opensearch"][0]
    remote = Pruner.connect(server.grpc_url, "opensearch")
    counts = [1] * 16 + [3] * 16 + [2] * 8
    passages = [" ".join(f"Sentence {k} of passage {i}." for k in range(n)) for i, n in enumerate(counts)]
    from engine.pipeline.encode import collate
    from engine.pipeline.text import split_sentences

    spans = [split_sentences(p) for p in passages]
    assert [len(sp) for sp in spans] == counts
    blocks = call_blocks(local, QUESTION, passages, spans)
    batch = collate(blocks, list(range(len(blocks))), 128, local.spec.pad_id)
    assert batch.shape[0] == 40 > CORE_MAX_BATCH
    ((r_got, p_got),) = remote.backend.infer_many([batch])
    r_exp, p_exp = local.backend.infer(batch)
    assert p_got.shape == p_exp.shape == (40, 3)
    np.testing.assert_allclose(r_got, r_exp, atol=1e-5)
    np.testing.assert_allclose(p_got, p_exp, atol=1e-5)
