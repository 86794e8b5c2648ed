"""Shared fixtures: tiny random-weight checkpoints of every family, exported once per session."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

# No model hub is reachable in tests: fail fast instead of waiting on the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FAMILY_NAMES = ["provence", "xprovence", "open_provence", "opensearch", "embedding"]
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    from export.checkpoints import make_all
    root = tmp_path_factory.mktemp("checkpoints")
    return make_all(root)


@pytest.fixture(scope="session")
def exported(checkpoints, tmp_path_factory) -> dict[str, Path]:
    from export.onnx import export_model
    root = tmp_path_factory.mktemp("onnx")
    out = {}
    for name, ck in checkpoints.items():
        export_model(ck, root / name, log=lambda m: None)
        out[name] = root / name
    return out


@pytest.fixture(scope="session")
def pruners(exported, checkpoints):
    """(onnxruntime pruner, torch pruner) per family."""
    from engine.pruner import Pruner
    return {name: (Pruner.load(exported[name], threads=1), Pruner.load(checkpoints[name], backend="torch", threads=1))
            for name in FAMILY_NAMES}


def with_window(pruner, max_length: int, **batching):
    """The same model and backend with a smaller window (forces multi-block passages)."""
    from engine.batching import BatchingConfig
    from engine.pruner import Pruner
    spec = dataclasses.replace(pruner.spec, max_length=max_length)
    return Pruner(pruner.backend, pruner.encoder.tokenizer, spec,
                  BatchingConfig(**batching) if batching else None, min_context_tokens=16)



def free_ports(n):
    """n free loopback ports (a server started right after binds them)."""
    import socket
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


#: The shared test repository: small core batches (calls get split) and small text-model
#: limits (calls get chunked), so those paths run on tiny inputs.
CORE_MAX_BATCH = 16
TEXT_MAX_PASSAGES = 50
TEXT_MAX_CHARS = 60_000


@pytest.fixture(scope="session")
def repository(exported, tmp_path_factory):
    """Every family's core model `<family>` and text model `<family>_text` (cpu target)."""
    from export.triton import RepositoryOptions, build_repository
    repo = tmp_path_factory.mktemp("model_repository")
    for name in FAMILY_NAMES:
        build_repository(exported[name], repo,
                         RepositoryOptions(target="cpu", name=name, max_batch_size=CORE_MAX_BATCH,
                                           max_queue_delay_us=20000, text_instances=2,
                                           text_max_passages=TEXT_MAX_PASSAGES, text_max_chars=TEXT_MAX_CHARS),
                         log=lambda m: None)
    return repo


@pytest.fixture(scope="session")
def server(repository):
    """One real tritonserver for the Triton and text-model tests."""
    from engine.serve import TritonServer
    h, g, m = free_ports(3)
    with TritonServer(repository, http_port=h, grpc_port=g, metrics_port=m) as s:
        yield s
