"""The OpenVINO backend (engine/backends/openvino.py) against the fp32 PyTorch reference,
every family; bf16 where the CPU computes it and a clear error where it does not; the NNCF
static INT8 export (export/ov_int8.py): an IR folder that loads on OpenVINO, whose answers
do not depend on the passages batched beside them; and the CLI's flags.

Tolerances: OpenVINO fp32 probabilities within 1e-5 and reranking scores within 1e-4 of
PyTorch (as ONNX Runtime's, tests/inprocess/test_parity.py); bf16 within 2e-2 (its 8-bit
mantissa; docs/precisions.md gives the fidelity on real weights).
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.cli import main
from engine.machine.cpu import AUTO_PRECISIONS, CpuKind
from engine.errors import ModelLoadError
from engine.pruner import Pruner
from tests.utils import FAMILY_NAMES, PASSAGES, QUESTION, run_in_threads

pytestmark = pytest.mark.inprocess

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("openvino", reason="OpenVINO comes with the [openvino] extra (in [dev])")
from engine.backends.openvino import BF16_FLAGS, bf16_supported  # noqa: E402

PROB_TOL, RERANK_TOL = 1e-5, 1e-4


def _probs(results):
    return [np.array([s.probability for s in r.sentences]) for r in results]


@pytest.fixture(scope="module")
def ov_pruners(exported):
    return {name: Pruner.load(exported[name], backend="openvino", threads=1) for name in FAMILY_NAMES}


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_openvino_fp32_equals_pytorch(ov_pruners, pruners, name):
    ov, (_, torch_p) = ov_pruners[name], pruners[name]
    assert ov.describe().startswith("openvino CPU, fp32 inference, ONNX graph")
    for threshold in (0.1, 0.5):
        a = ov.prune(QUESTION, PASSAGES, threshold=threshold, lexical_weight=0)
        b = torch_p.prune(QUESTION, PASSAGES, threshold=threshold, lexical_weight=0)
        for ra, rb, pa, pb in zip(a, b, _probs(a), _probs(b)):
            np.testing.assert_allclose(pa, pb, atol=PROB_TOL, rtol=0)
            assert abs(ra.reranking_score - rb.reranking_score) <= RERANK_TOL
            assert [s.kept for s in ra.sentences] == [s.kept for s in rb.sentences]


def test_a_shared_pruner_answers_the_same_from_many_threads(ov_pruners):
    ov = ov_pruners["xprovence"]
    want = _probs(ov.prune(QUESTION, PASSAGES, lexical_weight=0))
    got, errors = [], []

    def work():
        try:
            got.append(_probs(ov.prune(QUESTION, PASSAGES, lexical_weight=0)))
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    run_in_threads(lambda _: work(), 4, join_s=None)
    assert not errors and len(got) == 4
    for g in got:
        for a, b in zip(g, want):
            np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not bf16_supported(), reason=f"this CPU does not compute bf16 ({' / '.join(BF16_FLAGS)})")
def test_bf16_inference_is_close_to_pytorch(exported, pruners):
    ov = Pruner.load(exported["xprovence"], backend="openvino", precision="bf16", threads=1)
    assert "bf16 inference" in ov.describe()
    for pa, pb in zip(
        _probs(ov.prune(QUESTION, PASSAGES, lexical_weight=0)),
        _probs(pruners["xprovence"][1].prune(QUESTION, PASSAGES, lexical_weight=0)),
    ):
        np.testing.assert_allclose(pa, pb, atol=2e-2, rtol=0)


@pytest.mark.skipif(bf16_supported(), reason="this CPU computes bf16: the error path is for CPUs that do not")
def test_bf16_where_the_cpu_lacks_it_is_a_clear_error(exported):
    with pytest.raises(
        ModelLoadError, match="bf16 needs a CPU that computes in bf16 .avx512_bf16 or amx_bf16."
    ):
        Pruner.load(exported["opensearch"], backend="openvino", precision="bf16")


def _preferring(folder, tmp_path, backend, precision):
    """A copy of an export whose manifest prefers `backend` at `precision`."""
    import shutil

    from engine.pipeline.spec import Manifest, Runtime

    out = tmp_path / f"{folder.name}-{backend}-{precision}"
    shutil.copytree(folder, out)
    Manifest.read(out).with_changes(runtime=Runtime(backend, precision)).write(out)
    return out


def test_an_export_runs_where_its_manifest_prefers_unless_told_otherwise(exported, tmp_path, monkeypatch):
    """The manifest's `runtime` (prune export --precision auto's pick) is what Pruner.load,
    prune run and prune repository use when no backend is named; a named one wins; where
    this machine cannot run the preference, ONNX Runtime fp32 runs the same graph, saying why."""
    import engine.backends.openvino as ov_backend

    folder = _preferring(exported["opensearch"], tmp_path, "openvino", "fp32")
    assert Pruner.load(folder, threads=1).describe().startswith("openvino CPU, fp32 inference")
    assert Pruner.load(folder, "onnxruntime", threads=1).describe().startswith("onnxruntime")
    assert Pruner.load(exported["opensearch"], threads=1).describe().startswith("onnxruntime")
    said = []
    assert Pruner.load(folder, threads=1, log=said.append).describe().startswith("openvino") and not said

    bf16 = _preferring(exported["opensearch"], tmp_path, "openvino", "bf16")
    monkeypatch.setattr(ov_backend, "bf16_supported", lambda core=None: False)
    with pytest.warns(
        RuntimeWarning, match="prefers openvino bf16 .* this CPU does not compute bf16.*ONNX Runtime fp32"
    ):
        assert Pruner.load(bf16, threads=1).describe().startswith("onnxruntime")
    monkeypatch.setitem(__import__("sys").modules, "openvino", None)  # OpenVINO not installed
    Pruner.load(folder, threads=1, log=said.append)
    assert said and "OpenVINO is not installed" in said[0] and "ONNX Runtime fp32" in said[0]
    monkeypatch.undo()

    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    assert (
        main(
            [
                "repository",
                "--model",
                str(bf16),
                "--out",
                str(tmp_path / "r"),
                "--name",
                "p",
                "--no-text-model",
                "-q",
            ]
        )
        == 0
    )
    cfg = text_format.Parse(
        (tmp_path / "r" / "p" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert (cfg.parameters["runtime"].string_value, cfg.parameters["inference_precision"].string_value) == (
        "openvino",
        "bf16",
    )
    assert (
        main(
            [
                "repository",
                "--model",
                str(bf16),
                "--out",
                str(tmp_path / "r2"),
                "--name",
                "p",
                "--no-text-model",
                "--backend",
                "onnxruntime",
                "-q",
            ]
        )
        == 0
    )
    cfg = text_format.Parse(
        (tmp_path / "r2" / "p" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert cfg.parameters["runtime"].string_value == "onnxruntime"


def test_bad_settings_are_clear_errors(exported):
    from engine.errors import InputError

    with pytest.raises(InputError, match="OpenVINO inference precision: backend='openvino'"):
        Pruner.load(exported["opensearch"], "onnxruntime", precision="bf16")
    with pytest.raises(ModelLoadError, match="must be one of"):
        Pruner.load(exported["opensearch"], backend="openvino", precision="int4")
    with pytest.raises(ModelLoadError, match="threads must be at least 1"):
        Pruner.load(exported["opensearch"], backend="openvino", threads=-1)
    with pytest.raises(InputError, match="runs on the CPU"):
        Pruner.load(exported["opensearch"], backend="openvino", device="cuda")


def test_the_static_int8_export_loads_on_openvino_and_records_its_settings(exported_ov_int8, exported):
    p = Pruner.load(exported_ov_int8, threads=1)  # an IR folder: OpenVINO whatever the default backend
    assert p.describe().startswith("openvino CPU, fp32 inference, IR graph model.xml")
    manifest = json.loads((exported_ov_int8 / "manifest.json").read_text())
    assert manifest["precision"] == "ov-int8" and manifest["openvino"]["calibration_blocks"] > 0
    assert manifest["openvino"]["ignored_patterns"] and manifest["openvino"]["preset"] == "mixed"
    assert not (exported_ov_int8 / "model.onnx").exists()
    xml = (exported_ov_int8 / "model.xml").read_text()
    assert "FakeQuantize" in xml or "FakeConvert" in xml  # quantized, not a copy of the fp32 graph
    fp32 = Pruner.load(exported["embedding"], threads=1)
    a = p.prune(QUESTION, PASSAGES, lexical_weight=0)
    b = fp32.prune(QUESTION, PASSAGES, lexical_weight=0)
    diffs = [np.abs(x - y).max() for x, y in zip(_probs(a), _probs(b))]
    assert 0 < max(diffs) < 0.25, diffs


def test_static_int8_answers_do_not_depend_on_the_batch(exported_ov_int8):
    """Static scales: a passage scored alone equals the same passage in a call of five."""
    p = Pruner.load(exported_ov_int8, threads=1)
    together = p.prune(QUESTION, PASSAGES, lexical_weight=0)
    for i, passage in enumerate(PASSAGES):
        alone = p.prune(QUESTION, [passage], lexical_weight=0)[0]
        np.testing.assert_allclose(_probs([alone])[0], _probs([together[i]])[0], atol=1e-6, rtol=0)


def test_the_cli_exports_ov_int8_and_runs_openvino(checkpoints, exported, tmp_path, capsys):
    out = tmp_path / "ov"
    assert (
        main(
            [
                "export",
                "--model",
                str(checkpoints["opensearch"]),
                "--out",
                str(out),
                "--precision",
                "ov-int8",
                "-q",
            ]
        )
        == 0
    )
    assert json.loads((out / "manifest.json").read_text())["precision"] == "ov-int8"
    printed = capsys.readouterr()
    assert not printed.out and not printed.err  # -q: nothing, NNCF's progress bars included
    doc = "The stadium was built in 1923. It holds 80,000 people."
    runs = {}
    for backend in ("onnxruntime", "openvino"):
        assert (
            main(
                [
                    "run",
                    "--model",
                    str(exported["opensearch"]),
                    "--backend",
                    backend,
                    "--question",
                    "When?",
                    "--context",
                    doc,
                    "--json",
                    "-q",
                ]
            )
            == 0
        )
        runs[backend] = json.loads(capsys.readouterr().out)[0]
    assert [s["kept"] for s in runs["openvino"]["sentences"]] == [
        s["kept"] for s in runs["onnxruntime"]["sentences"]
    ]
    np.testing.assert_allclose(
        [s["probability"] for s in runs["openvino"]["sentences"]],
        [s["probability"] for s in runs["onnxruntime"]["sentences"]],
        atol=PROB_TOL,
    )
    assert main(["run", "--model", str(out), "--question", "When?", "--context", doc, "--json", "-q"]) == 0
    assert len(json.loads(capsys.readouterr().out)[0]["sentences"]) == 2


def test_prune_bench_measures_openvino_beside_onnxruntime(exported, exported_ov_int8, tmp_path, capsys):
    from tests.utils import write_tiny_data

    data = write_tiny_data(tmp_path)
    assert (
        main(
            [
                "bench",
                "--data",
                str(data / "rag.jsonl"),
                "--model",
                str(exported["embedding"]),
                "--openvino",
                "--ov-int8",
                str(exported_ov_int8),
                "--queries",
                "2",
                "--repeats",
                "1",
                "--paths",
                "^(onnxruntime-fp32|openvino)$|openvino-",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    report = json.loads(next(tmp_path.glob("bench-*/bench.json")).read_text())
    ids = [r["id"] for r in report["paths"]]
    assert ids[0] == "onnxruntime-fp32" and "openvino-fp32" in ids and "openvino-int8-nncf-static" in ids
    assert ("openvino-bf16" in ids) == bf16_supported()
    assert ("openvino-bf16" in report["not_measured"]) != bf16_supported()
    assert all(r["passages_per_s"] > 0 for r in report["paths"])
    rows = {r["id"]: r for r in report["paths"]}
    assert rows["openvino-fp32"]["limit"].startswith("fp32 GEMM")
    assert rows["openvino-int8-nncf-static"]["limit"].startswith("int8 GEMM")
    gemm = report["limits"]["gemm"]
    assert gemm["openvino"]["fp32_gflops"] > 0 and gemm["openvino"]["int8_gops"] > 0
    assert ("bf16_gflops" in gemm["openvino"]) == bf16_supported()
    for kind, key in (("fp32", "fp32_gflops"), ("int8", "int8_gops")):  # the faster runtime's rate
        assert gemm["limits"][kind]["rate"] == max(gemm[key], gemm["openvino"][key])
    if bf16_supported():
        assert (
            rows["openvino-bf16"]["limit"].startswith("bf16 GEMM")
            and 0 < rows["openvino-bf16"]["limit_share"]
        )


#: the parameters Triton's openvino backend reads (its README and src/openvino.cc)
OPENVINO_BACKEND_PARAMETERS = {
    "PERFORMANCE_HINT",
    "CPU_EXTENSION_PATH",
    "INFERENCE_NUM_THREADS",
    "COMPILATION_NUM_THREADS",
    "HINT_BF16",
    "NUM_STREAMS",
    "SKIP_OV_DYNAMIC_BATCHSIZE",
    "ENABLE_BATCH_PADDING",
    "RESHAPE_IO_LAYERS",
    "TARGET_DEVICE",
}


@pytest.mark.parametrize("source", ["onnx", "ov-int8"])
def test_cpu_openvino_target_writes_what_tritons_openvino_backend_loads(
    exported, exported_ov_int8, tmp_path, source
):
    """`prune repository --target cpu-openvino`: NVIDIA's container is not here, so the files
    are checked as that backend checks them (its ValidateConfigureModel): a ModelConfig that
    parses, the graph at default_model_filename, every config input and output present in
    the graph with its rank and type, and only parameters the backend knows in upper case."""
    import openvino as ov
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from export.triton_repository import RepositoryOptions, build_repository

    folder = exported["embedding"] if source == "onnx" else exported_ov_int8
    build_repository(
        folder,
        tmp_path,
        RepositoryOptions(target="cpu-openvino", name="m", instances=2, intra_op_threads=3),
        log=lambda m: None,
    )
    cfg = text_format.Parse((tmp_path / "m" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert (cfg.backend, cfg.max_batch_size) == ("openvino", 0) and not cfg.HasField("dynamic_batching")
    assert (cfg.instance_group[0].count, cfg.instance_group[0].kind) == (
        2,
        model_config_pb2.ModelInstanceGroup.KIND_CPU,
    )
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert {k for k in params if k.isupper()} <= OPENVINO_BACKEND_PARAMETERS
    assert (params["NUM_STREAMS"], params["PERFORMANCE_HINT"], params["INFERENCE_NUM_THREADS"]) == (
        "1",
        "LATENCY",
        "3",
    )
    assert "HINT_BF16" not in params and params["prune_text_model"] == "m_text"
    graph = tmp_path / "m" / "1" / cfg.default_model_filename
    assert cfg.default_model_filename == ("model.onnx" if source == "onnx" else "model.xml")
    model = ov.Core().read_model(str(graph))  # the IR's weights are beside it as model.bin
    ports = {p.get_any_name(): p for p in [*model.inputs, *model.outputs]}
    types = {model_config_pb2.TYPE_INT64: ov.Type.i64, model_config_pb2.TYPE_FP32: ov.Type.f32}
    for tensor in [*cfg.input, *cfg.output]:
        port = ports[tensor.name]
        assert port.get_partial_shape().rank.get_length() == len(tensor.dims), tensor.name
        assert port.get_element_type() == types[tensor.data_type], tensor.name
    assert {t.name for t in cfg.input} == {p.get_any_name() for p in model.inputs}
    for warmup in cfg.model_warmup:
        assert all(len(i.dims) == 2 for i in warmup.inputs.values())
    text = text_format.Parse(
        (tmp_path / "m_text" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert text.backend == "python" and text.parameters["core_model"].string_value == "m"


def test_openvino_repository_settings_are_checked(exported, exported_ov_int8, tmp_path, capsys):
    from engine.errors import ExportError
    from export.triton_repository import RepositoryOptions, build_repository
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    with pytest.raises(
        ExportError, match="is an OpenVINO IR .ov-int8.: it serves on the cpu or cpu-openvino"
    ):
        build_repository(
            exported_ov_int8, tmp_path / "a", RepositoryOptions(target="gpu-onnx"), log=lambda m: None
        )
    with pytest.raises(ExportError, match="inference_precision bf16 is OpenVINO's"):
        build_repository(
            exported["embedding"],
            tmp_path / "b",
            RepositoryOptions(inference_precision="bf16"),
            log=lambda m: None,
        )
    with pytest.raises(ExportError, match="runtime openvino is the cpu target's python core"):
        build_repository(
            exported["embedding"],
            tmp_path / "c",
            RepositoryOptions(target="gpu-onnx", runtime="openvino"),
            log=lambda m: None,
        )
    assert not any((tmp_path / d).exists() for d in "abc")
    # the CLI: bf16 on Triton's openvino backend is its HINT_BF16
    assert (
        main(
            [
                "repository",
                "--model",
                str(exported["embedding"]),
                "--out",
                str(tmp_path / "r"),
                "--name",
                "m",
                "--target",
                "cpu-openvino",
                "--inference-precision",
                "bf16",
                "-q",
            ]
        )
        == 0
    )
    cfg = text_format.Parse(
        (tmp_path / "r" / "m" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert cfg.parameters["HINT_BF16"].string_value == "YES"
    assert (
        main(
            [
                "repository",
                "--model",
                str(exported["embedding"]),
                "--out",
                str(tmp_path / "r"),
                "--name",
                "p",
                "--backend",
                "openvino",
                "-q",
            ]
        )
        == 0
    )
    cfg = text_format.Parse(
        (tmp_path / "r" / "p" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert (cfg.backend, cfg.parameters["runtime"].string_value) == ("python", "openvino")
    assert (tmp_path / "r" / "p" / "1" / "model.py").is_file()


def test_export_precision_auto_writes_the_fastest_that_passes(checkpoints, tmp_path, capsys):
    """`prune export --precision auto` on the embedding checkpoint: fp32, int8, ov-int8 and,
    where the CPU has bf16, ov-bf16 (OpenVINO's bf16 inference of the fp32 graph), gated
    against fp32 and timed; the folder holds the pick, its manifest says why with every
    candidate's figures, and the runtime it prefers where the pick is a runtime's."""
    out = tmp_path / "auto"
    assert (
        main(["export", "--model", str(checkpoints["embedding"]), "--out", str(out), "--precision", "auto"])
        == 0
    )
    printed = capsys.readouterr()
    _check_auto(out)
    assert "<- picked" in printed.out + printed.err


def _check_auto(out):
    from export.auto import pick

    manifest = json.loads((out / "manifest.json").read_text())
    auto = manifest["auto"]
    tried = {p for p, why in CpuKind.here().auto_candidates(openvino=True).items() if why is None}
    if not bf16_supported():
        tried -= {"ov-bf16", "ov-int8-bf16"}
    assert set(auto["candidates"]) == tried and set(auto["not_tried"]) == set(AUTO_PRECISIONS) - tried
    for name, c in auto["candidates"].items():
        assert c["seconds"] > 0 and isinstance(c["passed"], bool), name
        if name != "fp32":
            assert 0 <= c["agreement"] <= 1 and "Spearman" in c["reason"]
    picked = auto["picked"]
    assert picked == pick(auto["candidates"])
    assert manifest["precision"] == {"ov-bf16": "fp32", "ov-int8-bf16": "ov-int8"}.get(picked, picked)
    bf16 = picked in ("ov-bf16", "ov-int8-bf16")
    assert manifest.get("runtime") == ({"backend": "openvino", "precision": "bf16"} if bf16 else None)
    assert auto["gate_documents"] == 24 and auto["machine"]["cpus"] > 0
    p = Pruner.load(out, threads=1)
    assert ("IR graph" in p.describe()) == picked.startswith("ov-int8")
    assert ("bf16 inference" in p.describe()) == bf16
    assert p.prune(QUESTION, PASSAGES)[0].sentences
    return auto


AVX2 = {"avx", "avx2", "fma"}
ZEN4 = AVX2 | {"avx512f", "avx512_vnni", "avx512_bf16"}
AMX = ZEN4 | {"amx_tile", "amx_int8", "amx_bf16"}


@pytest.mark.parametrize(
    "flags, exported",
    [
        (AVX2, {"fp32", "int8"}),
        (AVX2 | {"avx_vnni"}, {"fp32", "int8", "ov-int8"}),
        (AMX, {"fp32", "int8", "ov-int8"}),
    ],
)
def test_auto_tries_what_the_cpus_flags_make_worth_trying(checkpoints, tmp_path, flags, exported):
    """The candidates follow the CPU's kind (faked here): no OpenVINO static INT8 without int8
    dot products, bf16 only where the CPU computes it and OpenVINO's plugin agrees (so on this
    machine a faked AMX CPU still gets no bf16 candidate unless the real one has bf16)."""
    from export.auto import choose_precision

    kind = CpuKind(frozenset(flags))
    manifest = choose_precision(
        checkpoints["embedding"],
        tmp_path / "auto",
        export_args={},
        progress=False,
        log=lambda m: None,
        cpu=kind,
    )
    auto = manifest.data["auto"]
    if kind.bf16 and bf16_supported():
        exported = exported | {"ov-bf16", "ov-int8-bf16"}
    assert set(auto["candidates"]) == exported
    assert set(auto["not_tried"]) == set(AUTO_PRECISIONS) - exported
    assert auto["machine"]["cpu_kind"] == kind.name and auto["picked"] in exported
    if "ov-int8" not in exported:
        assert "no int8 dot products" in auto["not_tried"]["ov-int8"]
    if kind.bf16 and not bf16_supported():
        assert "OpenVINO's CPU plugin" in auto["not_tried"]["ov-bf16"]


@pytest.mark.skipif(not bf16_supported(), reason=f"this CPU does not compute bf16 ({' / '.join(BF16_FLAGS)})")
def test_the_bf16_candidate_is_the_fp32_graph_on_openvino_bf16(checkpoints, tmp_path, monkeypatch):
    """Where auto picks ov-bf16 the export is the fp32 graph with the manifest's runtime
    saying OpenVINO bf16 (the pick forced here: on the tiny random model the gate and the
    timing decide otherwise), and loading it runs that."""
    from export import auto as auto_module

    monkeypatch.setattr(auto_module, "pick", lambda candidates: "ov-bf16")
    auto_module.choose_precision(
        checkpoints["embedding"], tmp_path / "b", export_args={}, progress=False, log=lambda m: None
    )
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["auto"]["picked"] == "ov-bf16" and manifest["precision"] == "fp32"
    assert manifest["runtime"] == {"backend": "openvino", "precision": "bf16"}
    assert "bf16 inference, ONNX graph" in Pruner.load(tmp_path / "b", threads=1).describe()


def test_the_default_models_first_use_picks_as_auto_does(checkpoints, tmp_path, monkeypatch, capsys):
    """By default (PRUNE_DEFAULT_PRECISION unset: auto) the first use exports the default model (here the
    embedding test checkpoint in its place) as `prune export --precision auto` does, into a
    folder of its own, and `--model default` runs the pick."""
    import engine.models.default_model as dm

    monkeypatch.setattr(dm, "default_checkpoint", lambda: str(checkpoints["embedding"]))
    monkeypatch.setenv("PRUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PRUNE_DEFAULT_PRECISION", raising=False)  # the default: auto
    assert main(["run", "--model", "default", "--question", QUESTION, "--context", PASSAGES[0]]) == 0
    printed = capsys.readouterr()
    assert "the fastest precision that passes the fidelity gate" in printed.err and "<- picked" in printed.err
    (folder,) = (tmp_path / "cache").iterdir()
    assert folder.name.endswith("-auto") and folder == dm.default_model_dir("auto")
    _check_auto(folder)
    monkeypatch.setenv("PRUNE_DEFAULT_PRECISION", "fp8")
    assert main(["run", "--model", "default", "--question", QUESTION, "--context", PASSAGES[0]]) == 2
    assert "PRUNE_DEFAULT_PRECISION must be one of" in capsys.readouterr().err


def test_export_flags_that_do_not_go_together(checkpoints, tmp_path, capsys):
    ck = str(checkpoints["embedding"])
    assert (
        main(
            [
                "export",
                "--model",
                ck,
                "--out",
                str(tmp_path / "a"),
                "--precision",
                "int8",
                "--gate-data",
                "x.jsonl",
                "-q",
            ]
        )
        != 0
    )
    assert "--gate-data is for --precision auto" in capsys.readouterr().err
    assert (
        main(["export", "--model", ck, "--out", str(tmp_path / "b"), "--precision", "auto", "--tensorrt"])
        != 0
    )
    assert "not from --precision auto" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


SIGNAL_AFTER_TWO_PRUNERS = """
import gc, os, signal, sys
from engine.pruner import Pruner
first = Pruner.load(sys.argv[1], backend="openvino", threads=1)
second = Pruner.load(sys.argv[1], backend="openvino", threads=1)
first.prune("Q?", ["A sentence. Another one."]); second.prune("Q?", ["A sentence. Another one."])
del first; gc.collect()         # dropped in the order they were made
del second; gc.collect()
signal.signal(signal.SIGTERM, lambda signum, frame: print("handled", flush=True))
os.kill(os.getpid(), signal.SIGTERM)      # a handled signal on this thread, as prune api's SIGTERM
print("alive", flush=True)
"""


def test_a_handled_signal_after_two_openvino_pruners_is_not_a_segfault(exported):
    """OpenVINO's CPU plugin gives the thread that compiles a model an alternate signal stack
    of its own (one per Core) and puts the previous one back when that Core goes. Two Cores
    dropped in the order they were made left the thread on the first one's stack, unmapped:
    the next signal with a Python handler (SIGTERM to `prune api`, `prune bench`'s stop) was a
    SIGSEGV (the pytest worker deaths at test_bench_stop and test_gpu_paths). The engine's
    backends share one Core, so its stack stays mapped."""
    run = subprocess.run(
        [sys.executable, "-c", SIGNAL_AFTER_TWO_PRUNERS, str(exported["opensearch"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (run.returncode, run.stdout.split()) == (0, ["handled", "alive"]), (
        run.returncode,
        run.stderr[-2000:],
    )
