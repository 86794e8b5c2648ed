"""DeBERTa's position indices built once per graph against once per layer (#26,
export/deberta.py): the same Provence-width checkpoint exported both ways, node counts,
outputs compared bit for bit, and the time of the engine's RAG batches, interleaved.

    python -m benchmarks.deberta_indices --rag ../shared/data/squad-dev-rag.jsonl --layers 6 \\
        --out benchmarks/results/deberta-indices

The checkpoint: a random-weight Provence test checkpoint at the real model's width
(hidden 1024, 16 heads, FFN 4096) with `--layers` layers (the saving grows with depth: the
real Provence has 24). Time: the padded batches the engine builds for the first
`--queries` RAG calls, one ONNX Runtime session per graph, `--repeats` passes each in ABBA
order, medians.
"""
from __future__ import annotations

import collections
import contextlib
import json
import tempfile
from pathlib import Path

import numpy as np

from engine.tools.harness import Study, interleave, medians, parser, stderr

VARIANTS = ("per layer", "once per graph")


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, out="benchmarks/results/deberta-indices", repeats=5)
    ap.add_argument("--rag", required=True, help="RAG JSONL (question, passages)")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--queries", type=int, default=4)
    ap.add_argument("--precisions", nargs="+", default=["int8", "fp32"])
    args = ap.parse_args(argv)
    study = Study("deberta-indices", "benchmarks.deberta_indices", argv)

    import onnx
    import onnxruntime as ort
    from engine.pruner import Pruner
    from engine.core.text import split_sentences
    from engine.tools.quality import load_rag_data
    from export import deberta
    from export.checkpoints import make_test_checkpoint
    from export.onnx import export_model

    log = stderr
    sizes = {"hidden_size": 1024, "num_hidden_layers": args.layers, "num_attention_heads": 16,
             "intermediate_size": 4096}
    report = {"sizes": sizes, "results": {}}
    shared = deberta.shared_position_indices
    with tempfile.TemporaryDirectory(prefix="prune-deberta-") as tmp:
        work = Path(tmp)
        ck = make_test_checkpoint("provence", work / "checkpoint", sizes=sizes)
        folders = {}
        try:
            for variant in VARIANTS:
                deberta.shared_position_indices = (shared if variant == "once per graph"
                                                   else (lambda model, log=None: contextlib.nullcontext()))
                for precision in args.precisions:
                    log(f"exporting {precision}, indices {variant} ...")
                    folders[variant, precision] = work / f"{precision}-{variant.replace(' ', '-')}"
                    export_model(ck, folders[variant, precision], precision=precision, verify=False,
                                 log=lambda m: None)
        finally:
            deberta.shared_position_indices = shared
        rag = load_rag_data(args.rag, args.queries)
        pruner = Pruner.load(folders[VARIANTS[0], args.precisions[0]], threads=1)
        batches = [b for q in rag for b in pruner.batches(
            pruner.encode(q.question, q.passages, [split_sentences(p) for p in q.passages]))]
        opts = ort.SessionOptions()
        if args.threads:
            opts.intra_op_num_threads = args.threads
        for precision in args.precisions:
            sessions = {v: ort.InferenceSession(str(folders[v, precision] / "model.onnx"), opts,
                                                providers=["CPUExecutionProvider"]) for v in VARIANTS}
            names = [i.name for i in sessions[VARIANTS[0]].get_inputs()]
            feeds = [b.inputs(names) for b in batches]
            outs = {v: [s.run(None, f) for f in feeds] for v, s in sessions.items()}
            equal = all(np.array_equal(a, b) for x, y in zip(*outs.values()) for a, b in zip(x, y))
            def one_pass(session):
                def go():
                    for f in feeds:
                        session.run(None, f)
                return go
            times = interleave({v: one_pass(sessions[v]) for v in VARIANTS}, args.repeats, abba=True)
            med = medians(times)
            row = {"batches": len(feeds), "outputs_equal": equal}
            for v in VARIANTS:
                ops = collections.Counter(n.op_type for n in onnx.load(
                    str(folders[v, precision] / "model.onnx"), load_external_data=False).graph.node)
                row[v] = {"seconds": med[v], "runs": times[v],
                          "Expand": ops["Expand"], "GatherElements": ops["GatherElements"]}
            report["results"][precision] = row
            log(json.dumps({precision: row}))
    study.write(args.out, report, format_report(study, report))
    return 0


def format_report(study: Study, rep: dict) -> list[str]:
    s = rep["sizes"]
    lines = study.header("DeBERTa's position indices: once per graph against once per layer",
                         f"Provence-width test checkpoint (hidden {s['hidden_size']}, {s['num_attention_heads']} "
                         f"heads, FFN {s['intermediate_size']}, {s['num_hidden_layers']} layers); medians of "
                         "interleaved passes in ABBA order.")
    lines += ["| precision | indices | Expand / GatherElements nodes | seconds over the batches | change | outputs |",
             "|---|---|---|---|---|---|"]
    for precision, r in rep["results"].items():
        base = r[VARIANTS[0]]["seconds"]
        for v in VARIANTS:
            x = r[v]
            change = "-" if v == VARIANTS[0] else f"{100 * (x['seconds'] / base - 1):+.1f}%"
            same = "-" if v == VARIANTS[0] else ("equal bit for bit" if r["outputs_equal"] else "DIFFER")
            lines.append(f"| {precision} | {v} | {x['Expand']} / {x['GatherElements']} | {x['seconds']:.2f} "
                         f"({r['batches']} batches) | {change} | {same} |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
