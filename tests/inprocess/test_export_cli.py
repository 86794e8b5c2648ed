"""Export options and failures, and the `prune` command line end to end."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

from engine.cli import main
from engine.errors import ExportError
from engine.pruner import Pruner
from export.onnx import export_model

pytestmark = pytest.mark.inprocess


def test_manifest_and_graph_contract(exported):
    for name, folder in exported.items():
        m = json.loads((folder / "manifest.json").read_text())
        assert m["family"] == name and m["precision"] == "fp32" and m["opset"] == 17
        assert m["max_length"] == 512 and len(m["source"]["weights_sha256"]) == 64
        assert m["verification"]["max_abs_diff_sentence_probs"] < 1e-5
        graph = onnx.load(str(folder / "model.onnx"))
        inputs = [i.name for i in graph.graph.input]
        expected = ["input_ids", "attention_mask", "sentence_ids"]
        if name == "opensearch":
            expected.insert(2, "token_type_ids")
        assert inputs == expected
        assert [o.name for o in graph.graph.output] == ["rerank_score", "sentence_probs"]
        for i in graph.graph.input:
            dims = i.type.tensor_type.shape.dim
            assert i.type.tensor_type.elem_type == onnx.TensorProto.INT64
            assert dims[0].dim_param and dims[1].dim_param  # dynamic batch and sequence
        probs = graph.graph.output[1].type.tensor_type
        assert probs.elem_type == onnx.TensorProto.FLOAT
        assert probs.shape.dim[0].dim_param and probs.shape.dim[1].dim_param  # dynamic sentences


def test_external_data_export_matches(checkpoints, exported, tmp_path):
    out = tmp_path / "ext"
    m = export_model(checkpoints["xprovence"], out, external_data="always", log=lambda s: None)
    assert m["external_data"] == "model.onnx.data" and (out / "model.onnx.data").is_file()
    assert (out / "model.onnx").stat().st_size < 100_000
    a = Pruner.load(out).prune("q?", ["One sentence. Two sentences."])
    b = Pruner.load(exported["xprovence"]).prune("q?", ["One sentence. Two sentences."])
    np.testing.assert_allclose(
        [s.probability for s in a[0].sentences], [s.probability for s in b[0].sentences], atol=1e-6
    )


def test_export_fails_loudly_on_mismatch_and_leaves_nothing(checkpoints, tmp_path):
    out = tmp_path / "bad"
    with pytest.raises(ExportError, match="disagrees with PyTorch"):
        export_model(checkpoints["provence"], out, tolerance=-1.0, log=lambda s: None)
    assert not out.exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ExportError, match="not empty"):
        export_model(checkpoints["provence"], tmp_path / "full", log=lambda s: None)


def test_family_override_and_max_length(checkpoints, tmp_path):
    m = export_model(
        checkpoints["opensearch"], tmp_path / "o", family="opensearch", max_length=128, log=lambda s: None
    )
    assert m["max_length"] == 128 and m["buckets"] == [32, 64, 96, 128]
    with pytest.raises(Exception, match="max_length 4096 is outside"):
        export_model(checkpoints["opensearch"], tmp_path / "o2", max_length=4096, log=lambda s: None)


def test_the_export_steps_run_alone(checkpoints, exported, tmp_path):
    """export_model's steps one at a time: the options' checks, load, trace and the fp32
    graph, its parity with PyTorch, and the defaults the manifest records."""
    from export.onnx import DEFAULT_OPSET, ExportOptions, load, manifest_defaults, save_fp32, trace
    from export.parity import PARITY_TOLERANCE, Parity

    with pytest.raises(ExportError, match="precision must be one of"):
        ExportOptions(precision="fp8").check(tmp_path / "new")
    with pytest.raises(ExportError, match="external_data must be"):
        ExportOptions(external_data="sometimes").check(tmp_path / "new")
    source = load(checkpoints["opensearch"], ExportOptions(max_length=128), log=lambda m: None)
    assert source.family.name == "opensearch" and source.model.spec.max_length == 128 and not source.external
    raw, fp32 = tmp_path / "raw" / "model.onnx", tmp_path / "fp32" / "model.onnx"
    raw.parent.mkdir()
    fp32.parent.mkdir()
    trace(source, raw, DEFAULT_OPSET, log=lambda m: None)
    save_fp32(raw, fp32, source)
    graph = onnx.load(str(fp32))
    assert [i.name for i in graph.graph.input] == [
        "input_ids",
        "attention_mask",
        "token_type_ids",
        "sentence_ids",
    ]
    assert {p.key: p.value for p in graph.metadata_props}["family"] == "opensearch"
    parity = Parity.against(source.model, source.encoder, True, lambda m: None)
    parity.check(fp32, "fp32", PARITY_TOLERANCE)
    with pytest.raises(ExportError, match="the fp32 graph disagrees with PyTorch"):
        parity.check(fp32, "fp32", -1.0)
    assert [r["step"] for r in parity.reports] == ["fp32", "fp32"]
    Parity.against(source.model, source.encoder, False, lambda m: None).check(
        fp32, "fp32", -1.0
    )  # not verifying
    recorded = json.loads((exported["opensearch"] / "manifest.json").read_text())["defaults"]
    assert manifest_defaults(source.family) == recorded


def test_cli_end_to_end(tmp_path, capsys):
    ck = tmp_path / "ck"
    assert main(["test-checkpoint", "--family", "opensearch", "--out", str(ck)]) == 0
    assert main(["export", "--model", str(ck), "--out", str(tmp_path / "onnx")]) == 0
    doc = tmp_path / "doc.txt"
    doc.write_text("The stadium was built in 1923. It holds 80,000 people.\n\nParis is in France.")
    capsys.readouterr()
    assert (
        main(
            [
                "run",
                "--model",
                str(tmp_path / "onnx"),
                "--question",
                "When was it built?",
                "--context-file",
                str(doc),
                "--json",
                "--threshold",
                "0.3",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert len(out) == 1 and len(out[0]["sentences"]) == 3 and out[0]["threshold"] == 0.3
    assert (
        main(
            [
                "run",
                "--model",
                str(tmp_path / "onnx"),
                "--question",
                "q",
                "--context",
                "Alpha one. Beta two.",
                "--highlight",
                "--pre",
                "<<",
                "--post",
                ">>",
                "--threshold",
                "0",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "passage 0" in out and "<<Alpha one.>> <<Beta two.>>" in out
    assert (
        main(
            [
                "run",
                "--model",
                str(tmp_path / "onnx"),
                "--question",
                "q",
                "--context",
                "Alpha one. Beta two.",
                "--highlight",
                "--pre",
                "<<",
                "--post",
                ">>",
                "--threshold",
                "1",
                "--alpha",
                "-1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Alpha one. Beta two." in out and "<<" not in out
    # errors are one clear line and exit status 2, not a traceback
    assert main(["run", "--model", str(tmp_path / "missing"), "--question", "q", "--context", "x"]) == 2
    assert "no such model folder" in capsys.readouterr().err
    assert main(["run", "--model", str(tmp_path / "onnx"), "--question", "", "--context", "x"]) == 2
    assert "question is empty" in capsys.readouterr().err
    assert main(["run", "--model", str(tmp_path / "onnx"), "--question", "q"]) == 2


def test_console_script_is_installed():
    from pathlib import Path

    prune = Path(sys.executable).parent / "prune"  # what `pip install` put on PATH
    proc = subprocess.run([str(prune), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "export" in proc.stdout and "run" in proc.stdout


def test_client_path_does_not_import_torch_or_transformers(exported):
    code = (
        "import sys\n"
        "from engine.pruner import Pruner\n"
        f"p = Pruner.load({str(exported['provence'])!r})\n"
        "r = p.prune('q?', ['One. Two.'])\n"
        "assert len(r[0].sentences) == 2\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
