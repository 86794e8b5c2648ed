"""`prune bench` as a registry of paths, a runner and a report (engine.bench.registry): which
paths the flags make possible, their ids, selection, and that nothing starts until run."""

from pathlib import Path

import pytest

from engine.bench.registry import GROUPS, registry, select
from engine.bench.runner import measure
from engine.bench.session import BenchOptions, Session
from engine.machine.timing import interleave

pytestmark = pytest.mark.unit

MODELS = {"fp32": Path("fp32"), "int8": Path("int8")}


def names(paths):
    return [p.name for p in paths]


def test_the_registry_lists_what_the_flags_make_possible():
    plain = registry(BenchOptions(MODELS, Path("d.jsonl")), "provence")
    assert names(plain) == [
        "onnxruntime-fp32",
        "onnxruntime-fp32, fixed batches of 8 in input order",
        "onnxruntime-int8",
        "onnxruntime-int8 in-process c1",
        "onnxruntime-int8 in-process c4",
        "onnxruntime-int8 in-process c16",
        "api-in-process c1 (int8)",
        "api-in-process c1 merged (int8)",
        "api-in-process c4 (int8)",
        "api-in-process c4 merged (int8)",
        "api-in-process c16 (int8)",
        "api-in-process c16 merged (int8)",
    ]
    assert not [
        p for p in registry(BenchOptions({"fp32": Path("f")}, Path("d")), "provence") if p.group == "api"
    ]
    gpu = registry(
        BenchOptions({"fp16": Path("f")}, Path("d.jsonl"), device="cuda", serving=True), "provence"
    )
    assert [n for n in names(gpu) if n.startswith("api")] == [
        f"api-in-process c{c}{how} (fp16)" for c in (1, 4, 16) for how in ("", " merged")
    ]  # serving on the GPU: the GPU graph's fp16 export, unmerged against merged
    full = registry(
        BenchOptions(MODELS, Path("d.jsonl"), checkpoint="ck", triton=True, replicas=2), "embedding"
    )
    groups = {p.group for p in full}
    assert groups == set(GROUPS) - {"deployment"}
    assert [p.id for p in full if p.group == "peer"] == [
        "peer-fastembed-onnx-runtime-fp32-plain-export-embed-cosine-no-decisions",
        "peer-fastembed-onnx-runtime-int8-dynamic-per-tensor-weights-embed-cosine-no-decisions",
        "peer-sentence-transformers-torch-fp32-encode-cosine-no-decisions",
    ]
    assert "triton-text-grpc 2 replicas c16 (int8)" in names(full)
    # sentence-transformers' own ONNX and OpenVINO int8 exports, from an environment of their own
    remote = registry(BenchOptions(MODELS, Path("d"), checkpoint="ck", peer_python="py"), "embedding")
    assert [p.id for p in remote if p.group == "peer"][3:] == [
        "peer-sentence-transformers-onnx-backend-its-dynamic-int8-export-optimum-encode-cosine-no-decisions",
        "peer-sentence-transformers-openvino-backend-its-static-int8-export-nncf-encode-cosine-no-decisions",
    ]
    assert "api-text-grpc c4 (int8)" in names(full)
    # peers belong to the embedding family only; a deployment adds its own paths
    assert not [
        p for p in registry(BenchOptions(MODELS, Path("d"), checkpoint="ck"), "provence") if p.group == "peer"
    ]
    dep = registry(BenchOptions(MODELS, Path("d"), server_url="h:1", api_url="http://h:2"), "provence")
    assert [p.id for p in dep if p.group == "deployment"] == [
        "deployment-text-grpc-c1",
        "deployment-text-grpc-c4",
        "deployment-text-grpc-c16",
        "deployment-api-c1",
        "deployment-api-c4",
        "deployment-api-c16",
    ]


def test_ids_are_unique_and_stable():
    full = registry(
        BenchOptions(
            {**MODELS, "fp16": Path("f")},
            Path("d"),
            checkpoint="ck",
            triton=True,
            replicas=3,
            server_url="h:1",
            api_url="u",
        ),
        "embedding",
    )
    ids = [p.id for p in full]
    assert len(ids) == len(set(ids))
    assert "triton-text-grpc-c16-int8" in ids and "onnxruntime-int8-in-process-c4" in ids


def test_select_by_name_or_id_and_a_clear_error_when_nothing_matches():
    paths = registry(BenchOptions(MODELS, Path("d"), triton=True), "provence")
    assert names(select(paths, "^triton-text-grpc-c16-int8$")) == ["triton-text-grpc c16 (int8)"]
    assert names(select(paths, "text-grpc c16")) == [
        "triton-text-grpc c16 (int8)",
        "api-text-grpc c16 (int8)",
    ]
    with pytest.raises(ValueError, match="no benchmark path matches 'nothing'.*--list"):
        select(paths, "nothing")


def test_options_are_checked():
    with pytest.raises(ValueError, match="serves the CPU repository"):
        BenchOptions(MODELS, Path("d"), device="cuda", triton=True)
    with pytest.raises(ValueError, match="cpu or cuda"):
        BenchOptions(MODELS, Path("d"), device="tpu")
    with pytest.raises(ValueError, match="at least 1"):
        BenchOptions(MODELS, Path("d"), repeats=0)


def test_the_runner_starts_only_selected_paths_and_leaves_out_what_cannot_run(monkeypatch):
    started = []

    class Q:
        question, passages = "q", ["a", "b"]

    class Fake:
        """Stands in for the pruner that counts the workload's tokens."""

        def batches(self, enc):
            return []

        def encode(self, *a):
            return None

    from engine.bench import runner as bench_mod
    from engine.bench.session import BenchPath

    monkeypatch.setattr(bench_mod, "workload_batches", lambda p, qs: [])

    def runs(name):
        def start(s):
            started.append(name)

            def run(r):
                r.latencies = [0.01]
                return 0.01

            return run

        return start

    paths = [
        BenchPath("a", "in-process", runs("a")),
        BenchPath("b", "in-process", lambda s: None),
        BenchPath("c", "in-process", runs("c")),
    ]
    session = Session(BenchOptions(MODELS, Path("d"), repeats=2), [Q()], log=lambda m: None)
    session._cache[("pruner", "fp32", (("backend", "onnxruntime"),))] = Fake()
    results = measure(session, select(paths, "^[ab]$"), 2)
    assert started == ["a"]  # c was not selected: never started
    assert list(results) == ["a"] and results["a"].seconds == [0.01, 0.01]


def test_interleave_runs_every_variant_once_a_round():
    order = []
    times = interleave(
        {"x": lambda: order.append("x"), "y": lambda: order.append("y") or 0.5},
        3,
        log=lambda m: None,
        warmup=True,
    )
    assert order == ["x", "y"] * 4  # one warm-up round, untimed
    assert times["y"] == [0.5, 0.5, 0.5] and len(times["x"]) == 3
    with pytest.raises(ValueError):
        interleave({}, 0)


def test_openvino_adds_its_paths_beside_onnxruntime():
    ov = registry(BenchOptions(MODELS, Path("d"), openvino=True), "provence")
    assert [p.id for p in ov if p.id.startswith("openvino")] == [
        "openvino-fp32",
        "openvino-bf16",
        "openvino-int8-nncf-static",
        "openvino-int8-nncf-static-bf16-rest",
    ]
    assert not [
        p for p in registry(BenchOptions(MODELS, Path("d")), "provence") if p.id.startswith("openvino")
    ]


def test_what_a_user_gets_without_flags_is_the_first_in_process_path(tmp_path):
    """The default model as `Pruner.load("default")` loads it (`prune bench` passes its
    auto export as models["default"]): its path comes before the engine's other in-process
    paths, named by the precision auto picked and measured on that pick's arithmetic."""
    import json

    default = tmp_path / "default"
    listed = registry(BenchOptions({**MODELS, "default": default}, Path("d")), "embedding")
    assert [p.group for p in listed][0] == "in-process" and listed[0].name.startswith(
        "default (not exported yet"
    )
    default.mkdir()
    (default / "manifest.json").write_text(
        json.dumps(
            {
                "format": "prune-engine/1",
                "family": "embedding",
                "max_length": 512,
                "graph": "model.xml",
                "precision": "ov-int8",
                "tokenizer": {"file": "tokenizer.json", "cls_id": 101, "sep_id": 102, "pad_id": 0},
                "auto": {"picked": "ov-int8-bf16"},
            }
        )
    )
    first = registry(BenchOptions({**MODELS, "default": default}, Path("d")), "embedding")[0]
    assert first.id.startswith("default-ov-int8-bf16") and first.precision == "int8" and first.graph == "fp32"
    assert not [
        p for p in registry(BenchOptions(MODELS, Path("d")), "embedding") if p.name.startswith("default")
    ]
