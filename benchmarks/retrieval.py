"""Retrieve -> rerank -> prune, measured end to end on Milvus Lite.

    python -m benchmarks.retrieval --rag ../shared/data/squad-dev-rag.jsonl \
        --prune-data ../shared/data/squad-dev-prune.jsonl --out benchmarks/results/retrieval

squad-dev-rag (500 questions, each with up to 20 paragraphs of its article, `gold` the one
holding the answer): every question's paragraphs go into one collection (duplicates once);
then per question
  - recall@k: the gold paragraph among the first k retrieved (dense, BM25, hybrid);
  - MRR@10 of the gold paragraph in hybrid order, and after reranking the hybrid candidates
    by the pruner's reranking score;
  - pruning of the k returned chunks: the share of their tokens removed, and how often the
    gold paragraph is returned with at least one sentence kept;
  - latency per stage (question embedding, Milvus retrieval, rerank+prune).
squad-dev-rag has no answer strings, so answer survival is measured on squad-dev-prune
(300 questions with their answers; its documents are indexed as a second collection): the
share of questions whose answer string is in the k returned chunks before pruning, and
in the pruned context after it.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

from engine.bench.harness import Study, parser

KS = (1, 5, 10, 20)


def _progress(label: str, i: int, n: int, t0: float) -> None:
    if i % 50 == 0 or i == n:
        print(f"  {label}: {i}/{n} ({time.perf_counter() - t0:.0f} s)", flush=True)


def run_rag(pipe, rows, k: int, candidates: int) -> dict:
    ids: dict[str, str] = {}
    for q in rows:
        for i, p in enumerate(q["passages"]):
            ids.setdefault(p, f"{q['id']}-{i}")
    docs = [{"id": i, "text": t} for t, i in ids.items()]
    print(f"indexing {len(docs)} distinct paragraphs of {len(rows)} questions ...", flush=True)
    report = pipe.index(docs, overwrite=True)
    count = pipe.embedder.token_counts
    recall = {m: {kk: 0 for kk in KS} for m in ("dense", "bm25", "hybrid")}
    mrr_hybrid = mrr_rerank = 0.0
    tokens_in = tokens_out = gold_kept = 0
    stages: dict[str, list[float]] = {"embed": [], "retrieve": [], "rerank_prune": [], "total": []}
    t0 = time.perf_counter()
    for n, q in enumerate(rows, 1):
        gold = ids[q["passages"][q["gold"]]]
        for mode in ("dense", "bm25"):
            got = [h["entity"]["doc_id"] for h in pipe.search(q["question"], mode=mode, limit=max(KS))]
            for kk in KS:
                recall[mode][kk] += gold in got[:kk]
        answer = pipe.ask(q["question"], k=candidates, candidates=candidates)
        hybrid = sorted(answer.results, key=lambda r: r.retrieval_rank)
        got = [r.id for r in hybrid]
        for kk in KS:
            recall["hybrid"][kk] += gold in got[:kk]
        rank = next((i for i, d in enumerate(got[:10], 1) if d == gold), None)
        mrr_hybrid += 1 / rank if rank else 0
        reranked = [r.id for r in answer.results]
        rank = next((i for i, d in enumerate(reranked[:10], 1) if d == gold), None)
        mrr_rerank += 1 / rank if rank else 0
        for r in answer.results[:k]:
            tokens_in += count([r.text])[0]
            tokens_out += count([r.pruned_context])[0] if r.pruned_context else 0
        gold_kept += any(r.id == gold and r.pruned_context for r in answer.results[:k])
        for s in stages:
            stages[s].append(answer.timings_ms[s])
        _progress("squad-dev-rag", n, len(rows), t0)
    n = len(rows)
    return {
        "questions": n,
        "paragraphs": len(docs),
        "chunks": report.chunks,
        "index_seconds": round(report.seconds, 1),
        "embed_seconds": round(report.embed_seconds, 1),
        "recall": {m: {str(kk): v / n for kk, v in r.items()} for m, r in recall.items()},
        "mrr10_hybrid": mrr_hybrid / n,
        "mrr10_reranked": mrr_rerank / n,
        "tokens_removed": 1 - tokens_out / max(tokens_in, 1),
        "gold_returned_and_kept": gold_kept / n,
        "latency_ms": {
            s: {"p50": statistics.median(v), "p90": float(np.percentile(v, 90))} for s, v in stages.items()
        },
    }


def run_answers(pipe, rows, k: int, candidates: int) -> dict:
    docs, seen = [], {}
    for r in rows:
        if r["context"] not in seen:
            seen[r["context"]] = f"doc-{len(seen)}"
            docs.append({"id": seen[r["context"]], "text": r["context"]})
    print(f"indexing {len(docs)} squad-dev-prune documents ...", flush=True)
    report = pipe.index(docs, overwrite=True)
    before = after = 0
    t0 = time.perf_counter()
    for n, r in enumerate(rows, 1):
        answer = pipe.ask(r["question"], k=k, candidates=candidates)
        full = "\n".join(x.text for x in answer.results)
        pruned = answer.context()
        before += any(a in full for a in r["answers"])
        after += any(a in pruned for a in r["answers"])
        _progress("squad-dev-prune", n, len(rows), t0)
    return {
        "questions": len(rows),
        "documents": len(docs),
        "chunks": report.chunks,
        "answer_in_topk": before / len(rows),
        "answer_in_pruned": after / len(rows),
    }


def write(study: Study, out: Path, result: dict) -> None:
    rag, s = result["rag"], result["settings"]
    lines = study.header("Retrieval pipeline on Milvus Lite")
    lines += [
        f"squad-dev-rag: {rag['questions']} questions, {rag['paragraphs']} paragraphs in one collection "
        f"({rag['chunks']} chunks of at most {s['chunk_tokens']} tokens; indexed in {rag['index_seconds']} s, "
        f"{rag['embed_seconds']} s of it embedding). Encoder and pruner: {s['encoder']}, {s['pruner']}.",
        "",
        "| retrieval | " + " | ".join(f"recall@{k}" for k in KS) + " |",
        "|---|" + "---|" * len(KS),
    ]
    for m in ("dense", "bm25", "hybrid"):
        lines.append(f"| {m} | " + " | ".join(f"{rag['recall'][m][str(k)]:.3f}" for k in KS) + " |")
    lat = rag["latency_ms"]
    ans = result.get("answers")
    lines += [
        "",
        f"MRR@10 of the gold paragraph: hybrid order {rag['mrr10_hybrid']:.3f}, reranked by the "
        f"pruner {rag['mrr10_reranked']:.3f} ({s['candidates']} candidates).",
        "",
        f"Pruning the top {s['k']} chunks: {rag['tokens_removed']:.1%} of their tokens removed; "
        f"the gold paragraph returned with a kept sentence for {rag['gold_returned_and_kept']:.1%} of questions.",
    ]
    if ans:
        lines += [
            "",
            f"Answer survival (squad-dev-prune, {ans['questions']} questions, {ans['documents']} documents): "
            f"the answer string is in the top {s['k']} chunks for {ans['answer_in_topk']:.1%} of questions, "
            f"and still in the pruned context for {ans['answer_in_pruned']:.1%}.",
        ]
    lines += [
        "",
        f"Latency per question (k={s['k']}, {s['candidates']} candidates, ms):",
        "",
        "| stage | p50 | p90 |",
        "|---|---|---|",
    ]
    lines += [f"| {st} | {v['p50']:.1f} | {v['p90']:.1f} |" for st, v in lat.items()]
    study.write(out, result, lines)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for m in ("dense", "bm25", "hybrid"):
        a.plot(KS, [rag["recall"][m][str(k)] for k in KS], marker="o", label=m)
    a.set_xlabel("k"), a.set_ylabel("recall@k of the gold paragraph"), a.set_xscale("log"), a.legend()
    a.set_xticks(KS, [str(k) for k in KS])
    a.set_title("retrieval (squad-dev-rag)")
    stages = [st for st in lat if st != "total"]
    b.bar(stages, [lat[st]["p50"] for st in stages])
    (
        b.set_ylabel("p50 ms per question"),
        b.set_title(f"latency by stage (k={s['k']}, {s['candidates']} candidates)"),
    )
    fig.tight_layout()
    fig.savefig(out / "retrieval.png", dpi=110)


def main(argv=None) -> int:
    ap = parser(__doc__, out="benchmarks/results/retrieval", repeats=1)
    ap.add_argument("--rag", required=True, help="squad-dev-rag.jsonl")
    ap.add_argument("--prune-data", help="squad-dev-prune.jsonl (answer survival)")
    ap.add_argument("--db", help="Milvus Lite file (default: OUT/bench.db, removed afterwards)")
    ap.add_argument("--limit", type=int, help="first N questions only")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument(
        "--model",
        default="default",
        help="the pruning model: 'default', 'default-int8' "
        "(the default model's INT8 export) or an exported folder",
    )
    args = ap.parse_args(argv)
    study = Study("retrieval", "benchmarks.retrieval", argv)
    from engine.rag.embedder import Embedder
    from engine.rag.retrieval import Pipeline
    from engine.rag.documents import CHUNK_TOKENS
    from engine.pruner import Pruner

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db = Path(args.db) if args.db else out / "bench.db"
    rows = [json.loads(line) for line in open(args.rag)][: args.limit]
    if args.model == "default-int8":
        from engine.models.default_model import ensure_default_model

        model, label = (
            ensure_default_model(precision="int8"),
            "default INT8 (all-MiniLM-L6-v2, embedding family)",
        )
    else:
        model = args.model
        label = (
            "default (all-MiniLM-L6-v2, embedding family)"
            if args.model == "default"
            else Path(args.model).name
        )
    pipe = Pipeline(
        db,
        Pruner.load(model, threads=args.threads),
        Embedder.load("default", threads=args.threads),
        log=lambda m: None,
    )
    result = {
        "settings": {
            "k": args.k,
            "candidates": args.candidates,
            "chunk_tokens": CHUNK_TOKENS,
            "encoder": pipe.embedder.name,
            "pruner": label,
            "fusion": "RRF k=60",
        }
    }
    try:
        result["rag"] = run_rag(pipe, rows, args.k, args.candidates)
        if args.prune_data:
            prows = [json.loads(line) for line in open(args.prune_data)][: args.limit]
            result["answers"] = run_answers(pipe, prows, args.k, args.candidates)
    finally:
        pipe.close()
        if not args.db:
            import shutil

            for p in (db, db.with_name(f".{db.name}.lock")):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    write(study, out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
