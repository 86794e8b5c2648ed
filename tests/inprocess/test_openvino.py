"""The OpenVINO backend (engine/backends/openvino.py) against the fp32 PyTorch reference,
every family; bf16 where the CPU computes it and a clear error where it does not; the NNCF
static INT8 export (export/openvino.py): an IR folder that loads on OpenVINO, whose answers
do not depend on the passages batched beside them; and the CLI's flags.

Tolerances: OpenVINO fp32 probabilities within 1e-5 and reranking scores within 1e-4 of
PyTorch (as ONNX Runtime's, tests/inprocess/test_parity.py); bf16 within 2e-2 (its 8-bit
mantissa; docs/precisions.md gives the fidelity on real weights).
"""
import json
import threading

import numpy as np
import pytest

from engine.cli import main
from engine.errors import ModelLoadError
from engine.pruner import Pruner
from tests.utils import FAMILY_NAMES, PASSAGES, QUESTION

pytestmark = pytest.mark.inprocess

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
        except Exception as exc:      # noqa: BLE001 (reported below)
            errors.append(exc)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(got) == 4
    for g in got:
        for a, b in zip(g, want):
            np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not bf16_supported(), reason=f"this CPU does not compute bf16 ({' / '.join(BF16_FLAGS)})")
def test_bf16_inference_is_close_to_pytorch(exported, pruners):
    ov = Pruner.load(exported["xprovence"], backend="openvino", precision="bf16", threads=1)
    assert "bf16 inference" in ov.describe()
    for pa, pb in zip(_probs(ov.prune(QUESTION, PASSAGES, lexical_weight=0)),
                      _probs(pruners["xprovence"][1].prune(QUESTION, PASSAGES, lexical_weight=0))):
        np.testing.assert_allclose(pa, pb, atol=2e-2, rtol=0)


@pytest.mark.skipif(bf16_supported(), reason="this CPU computes bf16: the error path is for CPUs that do not")
def test_bf16_where_the_cpu_lacks_it_is_a_clear_error(exported):
    with pytest.raises(ModelLoadError, match="bf16 needs a CPU that computes in bf16 .avx512_bf16 or amx_bf16."):
        Pruner.load(exported["opensearch"], backend="openvino", precision="bf16")


def test_bad_settings_are_clear_errors(exported):
    from engine.errors import InputError
    with pytest.raises(InputError, match="OpenVINO inference precision: backend='openvino'"):
        Pruner.load(exported["opensearch"], precision="bf16")
    with pytest.raises(ModelLoadError, match="must be one of"):
        Pruner.load(exported["opensearch"], backend="openvino", precision="int4")
    with pytest.raises(ModelLoadError, match="threads must be at least 1"):
        Pruner.load(exported["opensearch"], backend="openvino", threads=0)
    with pytest.raises(InputError, match="runs on the CPU"):
        Pruner.load(exported["opensearch"], backend="openvino", device="cuda")


@pytest.fixture(scope="module")
def ov_int8(exported, tmp_path_factory):
    from export.openvino import quantize
    out = tmp_path_factory.mktemp("ov-int8") / "embedding"
    manifest = quantize(exported["embedding"], out, log=lambda m: None)
    assert manifest.precision == "ov-int8" and manifest.graph == "model.xml"
    return out


def test_the_static_int8_export_loads_on_openvino_and_records_its_settings(ov_int8, exported):
    p = Pruner.load(ov_int8, threads=1)                 # an IR folder: OpenVINO whatever the default backend
    assert p.describe().startswith("openvino CPU, fp32 inference, IR graph model.xml")
    manifest = json.loads((ov_int8 / "manifest.json").read_text())
    assert manifest["precision"] == "ov-int8" and manifest["openvino"]["calibration_blocks"] > 0
    assert manifest["openvino"]["ignored_patterns"] and manifest["openvino"]["preset"] == "mixed"
    assert not (ov_int8 / "model.onnx").exists()
    xml = (ov_int8 / "model.xml").read_text()
    assert "FakeQuantize" in xml or "FakeConvert" in xml          # quantized, not a copy of the fp32 graph
    fp32 = Pruner.load(exported["embedding"], threads=1)
    a = p.prune(QUESTION, PASSAGES, lexical_weight=0)
    b = fp32.prune(QUESTION, PASSAGES, lexical_weight=0)
    diffs = [np.abs(x - y).max() for x, y in zip(_probs(a), _probs(b))]
    assert 0 < max(diffs) < 0.25, diffs


def test_static_int8_answers_do_not_depend_on_the_batch(ov_int8):
    """Static scales: a passage scored alone equals the same passage in a call of five."""
    p = Pruner.load(ov_int8, threads=1)
    together = p.prune(QUESTION, PASSAGES, lexical_weight=0)
    for i, passage in enumerate(PASSAGES):
        alone = p.prune(QUESTION, [passage], lexical_weight=0)[0]
        np.testing.assert_allclose(_probs([alone])[0], _probs([together[i]])[0], atol=1e-6, rtol=0)


def test_the_cli_exports_ov_int8_and_runs_openvino(checkpoints, exported, tmp_path, capsys):
    out = tmp_path / "ov"
    assert main(["export", "--model", str(checkpoints["opensearch"]), "--out", str(out), "--precision", "ov-int8",
                 "-q"]) == 0
    assert json.loads((out / "manifest.json").read_text())["precision"] == "ov-int8"
    capsys.readouterr()
    doc = "The stadium was built in 1923. It holds 80,000 people."
    runs = {}
    for backend in ("onnxruntime", "openvino"):
        assert main(["run", "--model", str(exported["opensearch"]), "--backend", backend, "--question", "When?",
                     "--context", doc, "--json", "-q"]) == 0
        runs[backend] = json.loads(capsys.readouterr().out)[0]
    assert [s["kept"] for s in runs["openvino"]["sentences"]] == [s["kept"] for s in runs["onnxruntime"]["sentences"]]
    np.testing.assert_allclose([s["probability"] for s in runs["openvino"]["sentences"]],
                               [s["probability"] for s in runs["onnxruntime"]["sentences"]], atol=PROB_TOL)
    assert main(["run", "--model", str(out), "--question", "When?", "--context", doc, "--json", "-q"]) == 0
    assert len(json.loads(capsys.readouterr().out)[0]["sentences"]) == 2


def test_prune_bench_measures_openvino_beside_onnxruntime(exported, tmp_path, capsys):
    from tests.utils import write_tiny_data
    data = write_tiny_data(tmp_path)
    assert main(["bench", "--data", str(data / "rag.jsonl"), "--model", str(exported["opensearch"]), "--openvino",
                 "--queries", "2", "--repeats", "1", "--paths", "^(onnxruntime-fp32|openvino)$|openvino-",
                 "--out", str(tmp_path)]) == 0
    report = json.loads(next(tmp_path.glob("bench-*/bench.json")).read_text())
    ids = [r["id"] for r in report["paths"]]
    assert ids[0] == "onnxruntime-fp32" and "openvino-fp32" in ids and "openvino-int8-nncf-static" in ids
    assert ("openvino-bf16" in ids) == bf16_supported()
    assert ("openvino-bf16" in report["not_measured"]) != bf16_supported()
    assert all(r["passages_per_s"] > 0 for r in report["paths"])
    ov = next(r for r in report["paths"] if r["id"] == "openvino-fp32")
    assert ov["limit"].startswith("fp32 GEMM")
