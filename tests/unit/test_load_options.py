"""A model's load options have one definition (engine.models.loading.LoadOptions), read from the
environment once where a process starts and passed down."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from engine.pipeline.encode import BatchingConfig
from engine.errors import InputError, PruneError, SettingError
from engine.models.loading import LoadOptions

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
NAMES = {f.name for f in fields(LoadOptions)}


def test_load_options_are_checked_when_made():
    for bad in (
        {"backend": "tensorrt"},
        {"dtype": "int4"},
        {"attn": "flash"},
        {"arena": "grow"},
        {"denormals": "round"},
        {"precision": "fp16"},
        {"threads": -1},
        {"threads": True},
        {"backend": "onnxruntime", "precision": "bf16"},
        {"tensorrt": True},
    ):
        with pytest.raises(PruneError):
            LoadOptions(**bad)
    assert LoadOptions(precision="bf16").named_backend == "openvino"
    assert LoadOptions(threads=0).threads is None  # 0: every core, as ONNX Runtime says
    with pytest.raises(InputError, match="unknown load option 'thread'; the options are backend"):
        LoadOptions.from_env({}, thread=2)


def test_the_environment_is_read_by_from_env_and_what_is_given_wins():
    env = {"PRUNE_INTRA_OP_THREADS": "3", "PRUNE_ORT_ARENA": "keep", "PRUNE_MAX_BATCH_TOKENS": "4096"}
    o = LoadOptions.from_env(env)
    assert (o.threads, o.arena, o.batching.max_batch_tokens, o.batching.max_batch_size) == (
        3,
        "keep",
        4096,
        64,
    )
    o = LoadOptions.from_env(
        env, threads=1, batching=BatchingConfig(max_batch_tokens=512), device="cuda", tensorrt="engines"
    )
    assert (o.threads, o.batching.max_batch_tokens, o.tensorrt, o.tensorrt_cache) == (
        1,
        512,
        True,
        Path("engines"),
    )
    assert LoadOptions.from_env({}) == LoadOptions()
    with pytest.raises(SettingError, match="PRUNE_ORT_ARENA"):
        LoadOptions.from_env({"PRUNE_ORT_ARENA": "bogus"})
    assert LoadOptions.from_env({}).denormals == "flush"
    assert LoadOptions.from_env({"PRUNE_ORT_DENORMALS": "keep"}).denormals == "keep"
    with pytest.raises(SettingError, match="PRUNE_ORT_DENORMALS"):
        LoadOptions.from_env({"PRUNE_ORT_DENORMALS": "ftz"})


def _calls(paths, name):
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == name
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "Pruner"
            ):
                yield path, node


def test_every_load_keyword_in_the_code_is_a_load_option():
    files = [
        p
        for d in ("engine", "export", "benchmarks", "dev", "triton_models")
        for p in (ROOT / d).rglob("*.py")
    ]
    seen = 0
    for path, call in _calls(files, "load"):
        seen += 1
        given = {k.arg for k in call.keywords if k.arg is not None}
        # compressor: a second model beside the pruner (Pruner.load's own keyword), not how it opens
        assert given <= NAMES | {"log", "options", "compressor"}, (path, given - NAMES)
    assert seen > 12


def test_nothing_below_the_doors_reads_the_environment():
    below = [
        *sorted((ROOT / "engine" / "backends").glob("*.py")),
        *(ROOT / "engine" / "pipeline" / n for n in ("encode.py", "decide.py", "families.py")),
    ]
    for path in below:
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert "setting" not in names and "environ" not in attrs and "getenv" not in attrs, path
