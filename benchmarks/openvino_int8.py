"""Which NNCF settings make a static INT8 OpenVINO export that passes the fidelity gate
(#37): each setting quantizes the default model's fp32 export on the built-in generic
calibration text, and is scored against the fp32 PyTorch reference on labelled documents.

    python -m benchmarks.openvino_int8 --data ../shared/data/squad-dev-prune.jsonl --limit 100 \\
        --out benchmarks/results/openvino-int8

The gate (docs/precisions.md, as for the dynamic INT8 export): at least 99% decision
agreement at the model's default threshold, and a reranking Spearman of at least 0.99.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from engine.tools.harness import Study, parser, stderr

POOL = r"/model/MatMul(_\d+)?$"               # the contract's pooling products
FFN_OUT = r".*layer\.\d+/output/dense/MatMul"  # each layer's FFN output projection


def settings():
    from export.openvino import QuantizationSettings as S
    return {
        "NNCF transformer defaults (mixed, SmoothQuant, fast bias correction)": S(ignored_patterns=()),
        "performance preset": S(preset="performance", ignored_patterns=()),
        "no SmoothQuant": S(smooth_quant_alpha=-1, ignored_patterns=()),
        "full bias correction": S(fast_bias_correction=False, ignored_patterns=()),
        "pooling float": S(ignored_patterns=(POOL,)),
        "pooling float, no SmoothQuant": S(ignored_patterns=(POOL,), smooth_quant_alpha=-1),
        "pooling and FFN output float (the default)": S(ignored_patterns=(POOL, FFN_OUT)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, repeats=1)
    ap.add_argument("--data", required=True, help="sentence-labelled JSONL (question, context, sentences)")
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--only", help="a regular expression: the settings whose names match")
    args = ap.parse_args(argv)
    import re

    from engine.runtime.default_model import default_checkpoint, ensure_default_model
    from engine.pruner import Pruner
    from engine.tools.fidelity import fidelity_report, load_docs, run_model
    from export.openvino import quantize
    study = Study("openvino-int8", "benchmarks.openvino_int8", argv)
    fp32 = ensure_default_model(stderr, precision="fp32")
    docs = load_docs(args.data, args.limit)
    stderr("reference (fp32 PyTorch) ...")
    ref = run_model(Pruner.load(default_checkpoint(), backend="torch", threads=args.threads), docs, False, "ref")
    rows = []
    with tempfile.TemporaryDirectory(prefix="prune-ov-int8-") as tmp:
        for k, (name, s) in enumerate(settings().items()):
            if args.only and not re.search(args.only, name):
                continue
            out = Path(tmp) / str(k)
            quantize(fp32, out, s, log=lambda m: None)
            p = Pruner.load(out, threads=args.threads)
            got = run_model(p, docs, False, name)
            thresholds = (0.1, 0.5, p.family.rules.threshold)
            rep = fidelity_report(ref[0], got[0], ref[1], got[1], ref[2], got[2], p.family.rules.keep_rule,
                                  thresholds=thresholds)
            default = rep["decision_agreement"][str(p.family.rules.threshold)]
            rep.update(setting=name, settings=s.__dict__,
                       passes=default >= 0.99 and rep["rerank_spearman"] >= 0.99)
            rows.append(rep)
            stderr(f"{name}: agreement at the default {default:.4f}, Spearman {rep['rerank_spearman']:.4f}")
    lines = study.header("Static INT8 for OpenVINO: NNCF settings against the fidelity gate",
                         f"The default model (all-MiniLM-L6-v2); {len(docs)} documents of {args.data} against "
                         "the fp32 PyTorch reference; calibration: the built-in generic text.")
    ths = list(rows[0]["decision_agreement"]) if rows else []
    lines += ["| setting | " + " | ".join(f"agree@{t}" for t in ths) + " | max abs dp | rerank Spearman | gate |",
              "|---|" + "---|" * (len(ths) + 3)]
    for r in rows:
        lines.append(f"| {r['setting']} | " + " | ".join(f"{100 * v:.2f}%" for v in r["decision_agreement"].values())
                     + f" | {r['max_abs_delta_prob']:.3f} | {r['rerank_spearman']:.4f} | "
                     + ("passes" if r["passes"] else "fails") + " |")
    study.write(args.out, {"documents": len(docs), "data": args.data, "rows": rows}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
