"""`prune export --precision auto` on an LLMLingua-2 checkpoint (export/lingua_auto.py): fp32 and its
INT8 graph, INT8 behind the word-label gate, the faster that passes written with its figures in the
manifest's `auto`. No timing is asserted: where the choice must not depend on this machine, the
timing is replaced by fixed figures."""

from __future__ import annotations

import json

import pytest

from tests.utils import THREADS

pytestmark = pytest.mark.inprocess

TEXT = (
    "The council met on Tuesday to talk about the old bridge.\nMost members wanted a new one, "
    "but the budget was small. Why not repair it? The engineer said that repairs would cost 2.5 "
    "million and last ten years! In the end they asked for a second report."
)


def test_prune_export_picks_a_precision_that_passes_and_records_it(
    lingua_checkpoints, lingua_exports, tmp_path
):
    """Without --precision an LLMLingua-2 export is auto, as a pruning model's: the manifest records
    both candidates' gate and time, what was not tried and why, and the machine; the export keeps
    the words that precision's own export keeps."""
    from engine.cli import main
    from engine.compressor import Compressor
    from export.lingua_auto import ov_bf16_missing

    out = tmp_path / "auto"
    assert (
        main(["export", "--model", str(lingua_checkpoints["xlm-roberta"]), "--out", str(out), "--quiet"]) == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    auto = manifest["auto"]
    ov = ov_bf16_missing() is None  # OpenVINO installed, and this CPU computes bf16
    assert set(auto["candidates"]) == {"fp32", "int8"} | ({"ov-bf16"} if ov else set())
    assert auto["picked"] == manifest["precision"] and auto["candidates"][auto["picked"]]["passed"]
    assert all(c["seconds"] > 0 and c["speedup"] > 0 for c in auto["candidates"].values())
    int8 = auto["candidates"]["int8"]
    assert int8["words"] > 1000 and "word agreement" in int8["reason"]
    assert set(auto["not_tried"]) == {"fp16", "ov-int8", "ov-int8-bf16"} | (set() if ov else {"ov-bf16"})
    assert auto["machine"]["cpus"] and "cpu_kind" in auto["machine"] and auto["gate_documents"] > 0
    ours = Compressor.load(out, threads=THREADS).compress(TEXT, rate=0.4, force_tokens=["\n", "?"])
    graph = "fp32" if auto["picked"] == "ov-bf16" else auto["picked"]  # ov-bf16: the fp32 graph, in bf16
    theirs = Compressor.load(lingua_exports["xlm-roberta", graph], threads=THREADS)
    if graph != auto["picked"]:
        return  # bf16's words are the gate's to judge (above), not equal by construction
    assert (
        ours.compressed_prompt == theirs.compress(TEXT, rate=0.4, force_tokens=["\n", "?"]).compressed_prompt
    )


def test_a_precision_failing_the_gate_is_not_chosen(
    lingua_checkpoints, lingua_exports, tmp_path, monkeypatch
):
    """INT8 timed the faster (fixed figures): picked while it passes the gate, not once it fails it."""
    from engine import fidelity_check
    from engine.compressor import Compressor
    from export import auto as pruning_auto
    from export.lingua_auto import choose_lingua_precision

    def int8_faster(passes, repeats, candidates):
        for precision, seconds in (("fp32", 2.0), ("int8", 1.0), ("ov-bf16", 1.5)):
            if precision in candidates:
                candidates[precision].update(seconds=seconds, speedup=2.0 / seconds, spread=0.0)

    monkeypatch.setattr(pruning_auto, "timed", int8_faster)
    checkpoint, fp32 = lingua_checkpoints["bert"], lingua_exports["bert", "fp32"]
    args = dict(export_args={}, fp32=fp32, threads=THREADS, log=lambda m: None)
    manifest = choose_lingua_precision(checkpoint, tmp_path / "passes", **args)
    assert (manifest["auto"]["picked"], manifest["precision"]) == ("int8", "int8")
    assert manifest["gate"]["passed"] and manifest["quantization"]["quantized_nodes"] > 0
    assert Compressor.load(tmp_path / "passes", threads=THREADS).compress(TEXT, rate=0.5).compressed_prompt

    monkeypatch.setitem(fidelity_check.GATE, "agreement", 1.01)  # a gate nothing passes
    manifest = choose_lingua_precision(checkpoint, tmp_path / "fails", **args)
    assert (manifest["auto"]["picked"], manifest["precision"]) == ("fp32", "fp32")
    assert not manifest["auto"]["candidates"]["int8"]["passed"] and "gate" not in manifest
    assert "(>= 101%: no)" in manifest["auto"]["candidates"]["int8"]["reason"]


def test_openvino_bf16_is_picked_when_it_passes_and_is_faster(
    lingua_checkpoints, lingua_exports, tmp_path, monkeypatch
):
    """ov-bf16 (OpenVINO's bf16 inference of the fp32 graph) timed the fastest (fixed figures) and
    passing the gate: the export is the fp32 graph whose manifest prefers OpenVINO bf16, which
    Compressor.load runs there, with the word labels the gate measured; where OpenVINO cannot
    run it, the same graph on ONNX Runtime, with a warning saying why."""
    from engine.compressor import Compressor
    from engine.fidelity_check import lingua_gate
    from engine.models import loading
    from export import auto as pruning_auto
    from export.lingua_auto import choose_lingua_precision, ov_bf16_missing
    from export.lingua_onnx import GATE_RATES, TEXTS

    if (why := ov_bf16_missing()) is not None:
        pytest.skip(f"ov-bf16 is not a candidate here: {why}")

    def bf16_fastest(passes, repeats, candidates):
        for precision, seconds in (("fp32", 2.0), ("int8", 1.5), ("ov-bf16", 1.0)):
            candidates[precision].update(seconds=seconds, speedup=2.0 / seconds, spread=0.0)

    monkeypatch.setattr(pruning_auto, "timed", bf16_fastest)
    checkpoint, fp32 = lingua_checkpoints["xlm-roberta"], lingua_exports["xlm-roberta", "fp32"]
    out = tmp_path / "bf16"
    args = dict(export_args={}, fp32=fp32, threads=THREADS, log=lambda m: None)
    manifest = choose_lingua_precision(checkpoint, out, **args)
    auto = manifest["auto"]
    assert (auto["picked"], manifest["precision"]) == ("ov-bf16", "fp32")
    assert manifest["runtime"] == {"backend": "openvino", "precision": "bf16"}
    assert manifest["gate"]["passed"] and not any(p.is_symlink() for p in out.iterdir())
    bf16 = Compressor.load(out, threads=THREADS)
    assert "openvino CPU, bf16 inference" in bf16.describe()
    reference = Compressor.load(fp32, threads=THREADS)
    again = lingua_gate(reference, bf16, TEXTS, GATE_RATES)
    assert again["agreement"] == auto["candidates"]["ov-bf16"]["agreement"]

    monkeypatch.setattr(loading, "runtime_missing", lambda runtime: "OpenVINO is not installed (a test)")
    with pytest.warns(RuntimeWarning, match="prefers openvino.*OpenVINO is not installed"):
        fallback = Compressor.load(out, threads=THREADS)
    assert "onnxruntime" in fallback.describe()
    result = fallback.compress(TEXT, rate=0.5)
    assert result.compressed_prompt == reference.compress(TEXT, rate=0.5).compressed_prompt
