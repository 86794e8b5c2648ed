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

import argparse
import collections
import contextlib
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

VARIANTS = ("per layer", "once per graph")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rag", required=True, help="RAG JSONL (question, passages)")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--queries", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--precisions", nargs="+", default=["int8", "fp32"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import onnx
    import onnxruntime as ort
    from engine.pruner import Pruner
    from engine.text import split_sentences
    from engine.tools.quality import load_rag_data
    from export import deberta
    from export.checkpoints import make_test_checkpoint
    from export.onnx import export_model

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    sizes = {"hidden_size": 1024, "num_hidden_layers": args.layers, "num_attention_heads": 16,
             "intermediate_size": 4096}
    report = {"command": shlex.join(["python", "-m", "benchmarks.deberta_indices",
                                     *(argv if argv is not None else sys.argv[1:])]),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
                         f"onnxruntime {ort.__version__}",
              "sizes": sizes, "results": {}}
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
            times: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for rep in range(args.repeats):
                for v in (VARIANTS if rep % 2 == 0 else VARIANTS[::-1]):
                    t = time.perf_counter()
                    for f in feeds:
                        sessions[v].run(None, f)
                    times[v].append(time.perf_counter() - t)
            row = {"batches": len(feeds), "outputs_equal": equal}
            for v in VARIANTS:
                ops = collections.Counter(n.op_type for n in onnx.load(
                    str(folders[v, precision] / "model.onnx"), load_external_data=False).graph.node)
                row[v] = {"seconds": statistics.median(times[v]), "runs": times[v],
                          "Expand": ops["Expand"], "GatherElements": ops["GatherElements"]}
            report["results"][precision] = row
            log(json.dumps({precision: row}))
    text = format_report(report)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "deberta-indices.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "deberta-indices.md").write_text(text + "\n")
        print(f"wrote {args.out}")
    return 0


def format_report(rep: dict) -> str:
    s = rep["sizes"]
    lines = [f"`{rep['command']}`", "",
             f"{rep['machine']}; Provence-width test checkpoint (hidden {s['hidden_size']}, {s['num_attention_heads']} "
             f"heads, FFN {s['intermediate_size']}, {s['num_hidden_layers']} layers); medians, interleaved.", "",
             "| precision | indices | Expand / GatherElements nodes | seconds over the batches | change | outputs |",
             "|---|---|---|---|---|---|"]
    for precision, r in rep["results"].items():
        base = r[VARIANTS[0]]["seconds"]
        for v in VARIANTS:
            x = r[v]
            change = "-" if v == VARIANTS[0] else f"{100 * (x['seconds'] / base - 1):+.1f}%"
            same = "-" if v == VARIANTS[0] else ("equal bit for bit" if r["outputs_equal"] else "DIFFER")
            lines.append(f"| {precision} | {v} | {x['Expand']} / {x['GatherElements']} | {x['seconds']:.2f} "
                         f"({r['batches']} batches) | {change} | {same} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
