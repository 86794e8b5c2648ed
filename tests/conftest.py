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

