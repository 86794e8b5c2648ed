"""`prune repository --target gpu-graph` (#70): Triton's python core running the engine's GPU graph,
rehearsed on the CPU provider (`graph_device="cpu"`: a KIND_CPU instance, the same sessions without
CUDA graphs) in a real tritonserver: the shapes are captured in initialize(), before Triton says the
model is ready, and a client's calls give what the export gives in-process."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from engine.errors import ExportError
from engine.pruner import Pruner
from engine.triton.server import TritonServer
from export.triton_repository import RepositoryOptions, build_repository
from tests.utils import PASSAGES, QUESTION, THREADS, free_ports

pytestmark = pytest.mark.server

OPTIONS = dict(target="gpu-graph", name="g", max_batch_size=16, max_batch_tokens=2048, text_instances=1)


def test_gpu_graph_serves_an_fp16_export_and_refuses_others(gpu_exports, exported, tmp_path):
    with pytest.raises(ExportError, match="gpu-graph serves the GPU graph"):
        build_repository(exported["xprovence"], tmp_path / "r", RepositoryOptions(**OPTIONS), log=print)
    model = build_repository(
        gpu_exports["xprovence"], tmp_path / "r", RepositoryOptions(**OPTIONS), log=print
    )
    cfg = text_format.Parse((model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert (
        cfg.backend == "python" and cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    )
    assert cfg.parameters["runtime"].string_value == "gpu_graph"
    assert cfg.parameters["gpu_max_batch_size"].string_value == "16"
    assert (model / "1" / "model.py").is_file() and (model / "1" / "model.onnx").is_file()


def test_the_shapes_are_captured_before_triton_says_ready(gpu_exports, tmp_path, monkeypatch):
    monkeypatch.setenv("PRUNE_GPU_GRAPHS", "5")
    monkeypatch.setenv("PRUNE_INTRA_OP_THREADS", "1")
    repo = tmp_path / "repo"
    build_repository(
        gpu_exports["xprovence"], repo, RepositoryOptions(**OPTIONS, graph_device="cpu"), log=lambda m: None
    )
    log = tmp_path / "triton.log"
    h, g, m = free_ports(3)
    local = Pruner.load(gpu_exports["xprovence"], threads=THREADS)  # the same graph, one dynamic session
    with TritonServer(repo, http_port=h, grpc_port=g, metrics_port=m, log_file=log) as server:
        text = log.read_text(errors="replace")
        captured = text.find("GPU graph: 5 shapes captured")
        loaded = text.find("successfully loaded 'g'")
        assert 0 <= captured < loaded, text[-3000:]  # made in initialize(), before the model is ready
        with Pruner.connect(server.grpc_url, "g") as remote:
            for threshold in (0.1, 0.5):
                want = local.prune(QUESTION, PASSAGES, threshold=threshold)
                got = remote.prune(QUESTION, PASSAGES, threshold=threshold)
                for a, b in zip(want, got):
                    assert [s.kept for s in a.sentences] == [s.kept for s in b.sentences]
                    assert abs(a.reranking_score - b.reranking_score) <= 2e-3
                    for x, y in zip(a.sentences, b.sentences):
                        assert abs(x.probability - y.probability) <= 2e-3
    local.close()
