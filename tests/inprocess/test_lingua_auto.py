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

    out = tmp_path / "auto"
    assert (
        main(["export", "--model", str(lingua_checkpoints["xlm-roberta"]), "--out", str(out), "--quiet"]) == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    auto = manifest["auto"]
    assert set(auto["candidates"]) == {"fp32", "int8"}
    assert auto["picked"] == manifest["precision"] and auto["candidates"][auto["picked"]]["passed"]
    assert all(c["seconds"] > 0 and c["speedup"] > 0 for c in auto["candidates"].values())
    int8 = auto["candidates"]["int8"]
    assert int8["words"] > 1000 and "word agreement" in int8["reason"]
    assert set(auto["not_tried"]) == {"fp16", "ov-int8", "ov-bf16", "ov-int8-bf16"}
    assert auto["machine"]["cpus"] and "cpu_kind" in auto["machine"] and auto["gate_documents"] > 0
    ours = Compressor.load(out, threads=THREADS).compress(TEXT, rate=0.4, force_tokens=["\n", "?"])
    theirs = Compressor.load(lingua_exports["xlm-roberta", auto["picked"]], threads=THREADS)
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
        for precision, seconds in (("fp32", 2.0), ("int8", 1.0)):
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
