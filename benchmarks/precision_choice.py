"""Measure the INT8 settings (QInt8/QUInt8 x per-tensor/per-channel) and FP16 of one
checkpoint against its fp32 PyTorch reference on a corpus, and time each on this CPU.

    python -m benchmarks.precision_choice --model CHECKPOINT --data ../shared/data/squad-dev-prune.jsonl \\
        --limit 100 --out benchmarks/results/precision-choice

The reference runs once; every variant is exported, scored on the same documents and
timed side by side (median of repeats over the same documents).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from engine.tools.harness import checkpoint_of, Study, interleave, medians, parser, stderr
from engine.tools.fidelity import fidelity_report, format_report, load_docs, run_model
from engine.pruner import Pruner
from export.onnx import export_model

INT8_VARIANTS = [
    ("int8 QInt8 per-tensor", dict(precision="int8", int8_weight_type="QInt8", int8_per_channel=False)),
    ("int8 QInt8 per-channel", dict(precision="int8", int8_weight_type="QInt8", int8_per_channel=True)),
    ("int8 QUInt8 per-tensor", dict(precision="int8", int8_weight_type="QUInt8", int8_per_channel=False)),
    ("int8 QUInt8 per-channel", dict(precision="int8", int8_weight_type="QUInt8", int8_per_channel=True)),
]
VARIANTS = [("fp32 (optimized)", dict(precision="fp32")), *INT8_VARIANTS,
            ("fp16 (CPU provider)", dict(precision="fp16"))]


def main(argv=None) -> int:
    ap = parser(__doc__, repeats=3, checkpoint=True, data="sentence-labelled JSONL (question, context, sentences)")
    ap.add_argument("--limit", type=int, default=100)
    args = ap.parse_args(argv)
    study = Study("precision-choice", "benchmarks.precision_choice", argv)
    args.model = checkpoint_of(args.model)
    docs = load_docs(args.data, args.limit)
    log = stderr
    with tempfile.TemporaryDirectory() as tmp:
        log("reference (fp32 PyTorch) ...")
        ref_pruner = Pruner.load(args.model, backend="torch", threads=args.threads)
        ref = run_model(ref_pruner, docs, False, "reference")
        rows, pruners = [], {}
        for name, kw in VARIANTS:
            folder = Path(tmp) / name.split()[0].replace("(", "") / name.replace(" ", "_").replace("(", "").replace(")", "")
            export_model(args.model, folder, log=lambda m: None, **kw)
            pruners[name] = pruner = Pruner.load(folder, threads=args.threads)
            got = run_model(pruner, docs, False, name)
            rep = fidelity_report(ref[0], got[0], ref[1], got[1], ref[2], got[2], pruner.family.rules.keep_rule,
                                  thresholds=(0.1, 0.3, 0.5, pruner.family.rules.threshold))
            rep.update(variant=name)
            rows.append(rep)
            log(format_report(name, rep))
        times = interleave({name: (lambda p=p, name=name: run_model(p, docs, False, name) and None)
                            for name, p in pruners.items()}, args.repeats)
    med = medians(times)
    for r in rows:
        r.update(seconds_median=med[r["variant"]], seconds=times[r["variant"]],
                 speedup_vs_fp32_onnx=med[rows[0]["variant"]] / med[r["variant"]])
    lines = study.header(f"Precision choice: {args.model}",
                         f"{len(docs)} documents of {args.data}; reference: fp32 PyTorch; times: medians of "
                         f"{args.repeats} interleaved rounds.")
    lines += ["| variant | agree@0.1 | agree@0.3 | agree@0.5 | agree@default | max abs dp | mean abs dp | "
              "rerank max err | Spearman | pruned text changed | time (median) | speed vs fp32 ONNX |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a = list(r["decision_agreement"].values())
        lines.append(f"| {r['variant']} | " + " | ".join(f"{100 * x:.2f}%" for x in a) +
                     f" | {r['max_abs_delta_prob']:.2e} | {r['mean_abs_delta_prob']:.2e} | "
                     f"{r['rerank_max_abs_error']:.2e} | {r['rerank_spearman']:.5f} | "
                     f"{100 * r['pruned_text_changed_share']:.1f}% | {r['seconds_median']:.2f} s | "
                     f"{r['speedup_vs_fp32_onnx']:.2f}x |")
    study.write(args.out, {"model": args.model, "data": args.data, "documents": len(docs), "repeats": args.repeats,
                           "rows": rows}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
