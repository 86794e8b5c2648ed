"""`prune eval`: sentence-level P/R/F1, per domain, on RAG calls, and reranking MRR, with baselines."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from engine.cli.flags import add_batching, add_windows, batching, input_file, output_folder
from engine.errors import PruneError
from engine.settings import positive_int


def add(new) -> None:
    """`prune eval`'s flags."""
    v = new("eval", help="sentence-level P/R/F1 (grid search) and reranking MRR, with baselines")
    v.add_argument(
        "--model", action="append", help="exported model folder (repeatable; default: the default model)"
    )
    v.add_argument("--data", help="JSONL with question, context, sentences, labels")
    v.add_argument(
        "--rag-data",
        help="JSONL with question, passages, gold (an index or a list of them): what "
        "each model keeps of a RAG call's passages at its defaults, and reranking MRR",
    )
    v.add_argument("--limit", type=positive_int, help="first N documents of --data")
    v.add_argument("--rag-limit", type=positive_int, help="first N queries of --rag-data")
    v.add_argument("--out", help="folder for eval.json, eval.md and pr_curve.png")
    v.add_argument("--no-progress", action="store_true", help="no progress bar")
    v.add_argument(
        "--budgets",
        type=positive_int,
        nargs="+",
        metavar="TOKENS",
        help="also each model at these budget_tokens (e.g. 100 200 400 800): sentence F1 and answer "
        "passages kept beside the defaults' (the model's tokenizer counts)",
    )
    add_windows(v)
    add_batching(v)
    v.set_defaults(func=run)


def run(args) -> int:
    """Run `prune eval`; the exit status."""
    from engine.evaluate.quality import evaluate
    from engine.evaluate.quality_report import (
        domain_table,
        rag_domain_table,
        rag_table,
        rerank_table,
        table,
        write_report,
    )
    from engine.models.default_model import ensure_default_model
    from engine.pruner import Pruner

    # bad input is reported before any model loads (the default one is exported on first use)
    if not args.data and not args.rag_data:
        raise PruneError("give --data (sentence labels) and/or --rag-data (reranking)")
    input_file(args.data, "--data")
    input_file(args.rag_data, "--rag-data")
    output_folder(args.out, "--out")
    from engine.datafiles import load_prune_data, load_rag_data

    if args.data:
        load_prune_data(args.data, args.limit)  # read again by evaluate(): a bad record is named now
    if args.rag_data:
        load_rag_data(args.rag_data, args.rag_limit)
    models = {}
    for m in args.model or [None]:
        path = m or str(ensure_default_model(args.log))
        name = Path(path).name if m else "all-MiniLM-L6-v2 (default)"
        models[name] = Pruner.load(path, threads=args.threads, batching=batching(args))
    report = evaluate(
        models,
        args.data,
        args.rag_data,
        limit=args.limit,
        rag_limit=args.rag_limit,
        progress=not (args.no_progress or args.quiet),
        log=args.log,
        windows=args.windows,
    )
    rows = report.get("_rows")
    if rows:
        print(table(rows))
    if (report.get("pruning") or {}).get("by_domain"):
        print()
        print(domain_table(report["pruning"]["by_domain"]))
    if report.get("rag"):
        print()
        print(rag_table(report["rag"]["metrics"]))
        print()
        print(rag_domain_table(report["rag"]["by_domain"]))
    if report.get("reranking"):
        print()
        print(rerank_table(report["reranking"]["metrics"]))
    if args.budgets:
        report["budgets"] = budgets(args, models)
    if args.out:
        paths = write_report(report, args.out, "Quality evaluation", shlex.join(["prune", *sys.argv[1:]]))
        print("\n" + "\n".join(f"wrote {p}" for p in paths.values()))
    return 0


def budgets(args, models) -> dict:
    """--budgets: each model at each budget on --data and --rag-data (engine.evaluate.quality_budget),
    printed as tables; the report's `budgets`."""
    from engine.datafiles import load_prune_data, load_rag_data
    from engine.evaluate.quality_budget import budget_table, prune_budget_rows, rag_budget_rows

    progress, out = not (args.no_progress or args.quiet), {}
    if args.data:
        samples = load_prune_data(args.data, args.limit)
        out["pruning"] = [
            row
            for name, p in models.items()
            for row in prune_budget_rows(name, p, samples, args.budgets, progress, args.windows)
        ]
        print("\n" + budget_table(out["pruning"], rag=False))
    if args.rag_data:
        rag = load_rag_data(args.rag_data, args.rag_limit)
        out["rag"] = [
            row
            for name, p in models.items()
            for row in rag_budget_rows(name, p, rag, args.budgets, progress, args.windows)
        ]
        print("\n" + budget_table(out["rag"], rag=True))
    return out
