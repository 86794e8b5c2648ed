"""INT8 variants of the default model against its dynamic INT8 export and fp32 (#26):
static (QDQ) INT8, and dynamic INT8 with per-tensor weights or uint8 weights; speed on the
RAG workload, fidelity to fp32 on sentence-labelled data, and whether a passage's answer
depends on the passages batched with it.

    python -m benchmarks.static_int8 --rag ../shared/data/squad-dev-rag.jsonl \\
        --prune-data ../shared/data/squad-dev-prune.jsonl --out benchmarks/results/static-int8

The static graph: ONNX Runtime's quantize_static on the fp32 export (shape-inferred first
with quant_pre_process), QDQ format, int8 per-channel weights and uint8 activations on the
encoder's weight MatMuls (the same nodes the dynamic INT8 export quantizes), MinMax
calibration on the engine's own padded batches of generic text (examples/documents.jsonl
with four generic questions: never the evaluation data). Default model unless --model.
Speed: the same 30 RAG calls per variant, interleaved, medians of 3 repeats. Fidelity: the
kept decisions at the model's defaults, max |dp|, the pruned text, Spearman of the
reranking score, on the first 150 labelled documents. Batch dependence: each of the first
6 passages of 3 calls pruned alone against within its call (model scores, lexical_weight 0).
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from engine.tools.harness import Study, interleave, medians, parser

QUESTIONS = ["What is this about?", "When did it happen?", "Who made it?", "How does it work?"]
ROOT = Path(__file__).resolve().parents[1]


def static_quantize(fp32_dir: Path, out: Path, calibration: list[str]) -> dict:
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from engine.pruner import Pruner
    from engine.core.text import split_sentences
    from export.optimize import weight_matmuls
    out.mkdir(parents=True, exist_ok=True)
    for f in fp32_dir.iterdir():
        if f.is_file() and f.name != "model.onnx":
            shutil.copy2(f, out / f.name)
    pre = out / "pre.onnx"
    quant_pre_process(str(fp32_dir / "model.onnx"), str(pre), skip_optimization=True)
    pruner = Pruner.load(fp32_dir, threads=1)
    names = {i.name for i in onnx.load(str(pre), load_external_data=False).graph.input}
    feeds = [{n: np.asarray(getattr(b, n), dtype=np.int64) for n in names}
             for q in QUESTIONS
             for b in pruner.batches(pruner.encode(q, calibration, [split_sentences(d) for d in calibration]))]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    nodes, _ = weight_matmuls(onnx.load(str(pre)))
    t = time.time()
    quantize_static(str(pre), str(out / "model.onnx"), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8, op_types_to_quantize=["MatMul"],
                    nodes_to_quantize=nodes, calibrate_method=CalibrationMethod.MinMax,
                    extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    pre.unlink()
    return {"calibration_batches": len(feeds), "quantized_matmuls": len(nodes), "seconds": time.time() - t}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, repeats=3)
    ap.add_argument("--rag", required=True, help="RAG JSONL (speed, batch dependence)")
    ap.add_argument("--prune-data", required=True, help="sentence-labelled JSONL (fidelity)")
    ap.add_argument("--calibration", default=str(ROOT / "examples" / "documents.jsonl"),
                    help="JSONL with `text` (default: the repository's examples/documents.jsonl)")
    args = ap.parse_args(argv)
    study = Study("static-int8", "benchmarks.static_int8", argv)
    from scipy.stats import spearmanr

    from engine.runtime.default_model import ensure_default_model
    from engine.pruner import Pruner
    from engine.tools.quality import load_prune_data, load_rag_data
    out = Path(args.out)
    fp32_dir, int8_dir = ensure_default_model(precision="fp32"), ensure_default_model(precision="int8")
    calibration = [json.loads(line)["text"] for line in open(args.calibration, encoding="utf-8") if line.strip()]
    quant = static_quantize(fp32_dir, out / "model-static", calibration)
    print(f"static INT8: {quant}", file=sys.stderr)
    from export.optimize import quantize_int8
    paths = {"fp32": fp32_dir, "int8 dynamic (the export's: int8 weights, per channel)": int8_dir,
             "int8 static QDQ": out / "model-static"}
    for weight_type, per_channel, label in (("QInt8", False, "int8 dynamic, per-tensor weights"),
                                            ("QUInt8", True, "int8 dynamic, uint8 weights per channel")):
        folder = out / f"model-{weight_type}-{per_channel}"
        shutil.copytree(fp32_dir, folder, dirs_exist_ok=True)
        quantize_int8(fp32_dir / "model.onnx", folder / "model.onnx", weight_type=weight_type, per_channel=per_channel)
        paths[label] = folder
    pruners = {k: Pruner.load(v, threads=args.threads) for k, v in paths.items()}
    rag = load_rag_data(args.rag, 30)
    for p in pruners.values():
        for s in rag[:2]:
            p.prune(s.question, s.passages)
    def one_pass(p):
        def go():
            for s in rag:
                p.prune(s.question, s.passages)
        return go
    times = interleave({k: one_pass(p) for k, p in pruners.items()}, args.repeats)
    med = medians(times)
    docs = load_prune_data(args.prune_data, 150)
    res = {k: [p.prune(d.question, [d.context], sentences=[d.spans])[0] for d in docs] for k, p in pruners.items()}
    rows = []
    for k in pruners:
        pairs = [(a, b) for ra, rb in zip(res["fp32"], res[k]) for a, b in zip(ra.sentences, rb.sentences)]
        dep = 0.0
        for s in rag[:3]:
            together = pruners[k].prune(s.question, s.passages, lexical_weight=0)
            for i, psg in enumerate(s.passages[:6]):
                alone = pruners[k].prune(s.question, [psg], lexical_weight=0)[0]
                dep = max(dep, max(abs(a.probability - b.probability)
                                   for a, b in zip(alone.sentences, together[i].sentences)))
        rows.append({"variant": k, "seconds": med[k], "speedup_vs_fp32": med["fp32"] / med[k],
                     "decision_agreement": float(np.mean([a.kept == b.kept for a, b in pairs])),
                     "max_abs_dprob": float(max(abs(a.probability - b.probability) for a, b in pairs)),
                     "pruned_text_changed": float(np.mean([a.pruned_context != b.pruned_context
                                                           for a, b in zip(res["fp32"], res[k])])),
                     "rerank_spearman": float(spearmanr([r.reranking_score for r in res["fp32"]],
                                                        [r.reranking_score for r in res[k]]).correlation),
                     "alone_vs_in_call_max_dprob": dep})
    lines = study.header("Static INT8 (QDQ) against the export's dynamic INT8",
                         f"The default model; 30 RAG calls x {args.repeats} interleaved repeats; fidelity on "
                         f"{len(docs)} labelled documents at the model's defaults.")
    lines += ["| variant | seconds | vs fp32 | decision agreement | max abs dp | pruned text changed | rerank Spearman "
              "| alone vs in its call, max abs dp |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['seconds']:.2f} | {r['speedup_vs_fp32']:.2f}x | {100 * r['decision_agreement']:.2f}% "
              f"| {r['max_abs_dprob']:.4f} | {100 * r['pruned_text_changed']:.1f}% | {r['rerank_spearman']:.4f} "
              f"| {r['alone_vs_in_call_max_dprob']:.1e} |" for r in rows]
    study.write(out, {"static": quant, "rows": rows, "seconds": times}, lines)
    for folder in out.glob("model-*"):
        shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
