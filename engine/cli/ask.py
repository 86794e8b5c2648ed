"""`prune ask`: retrieve, rerank, prune and highlight for a question."""

from __future__ import annotations

import json

from engine.cli.flags import add_db, add_setting, add_tags, load_models, pipeline, tags
from engine.errors import PruneError
from engine.pipeline.inputs import CallOptions


def add(new) -> None:
    """`prune ask`'s flags."""
    a = new("ask", help="retrieve (hybrid), rerank, prune and highlight for a question")
    add_db(a)
    a.add_argument("--question", required=True, help="the question")
    add_setting(a, "k", ", best reranking score first")
    add_setting(a, "candidates")
    a.add_argument(
        "--mode",
        choices=["hybrid", "dense", "bm25"],
        default="hybrid",
        help="retrieval: dense + BM25 fused by Milvus (RRF), or one of them",
    )
    a.add_argument("--model", help="the pruning model: exported folder or 'default'; default: 'default'")
    a.add_argument(
        "--server", help="a Triton server running the pruning model (host:port) instead of in-process"
    )
    add_setting(a, "text_model")
    a.add_argument("--protocol", choices=["grpc", "http"], default="grpc", help="how to reach --server")
    add_setting(a, "timeout")
    a.add_argument("--threshold", type=float, help="keep threshold (default: the model's)")
    a.add_argument(
        "--no-rerank",
        action="store_true",
        help="keep Milvus's order instead of the pruner's reranking score (only the k returned are pruned)",
    )
    a.add_argument(
        "--json", action="store_true", help="print one JSON object: results with sources, context, timings"
    )
    add_tags(a)
    a.set_defaults(func=run)


def run(args) -> int:
    """Run `prune ask`; the exit status."""
    if not args.question or not args.question.strip():
        raise PruneError("--question is empty")
    CallOptions.of(threshold=args.threshold)  # checked before any model loads
    args.pre, args.post = tags(args)
    with pipeline(args) as pipe:
        pipe.about()  # a missing database or collection fails before models load
        load_models(args, pipe, with_pruner=True)
        answer = pipe.ask(
            args.question,
            k=args.k,
            candidates=args.candidates,
            mode=args.mode,
            threshold=args.threshold,
            pre=args.pre,
            post=args.post,
            rerank=not args.no_rerank,
        )
    if args.json:
        print(json.dumps(answer.to_dict(), ensure_ascii=False, indent=2))
        return 0
    t = answer.timings_ms
    print(
        f"# {len(answer.results)} of {answer.candidates} {answer.mode} candidates, "
        f"{'reranked and pruned' if answer.reranked else 'pruned (Milvus order)'} "
        f"(embed {t.get('embed', 0):.0f} ms, retrieve {t['retrieve']:.0f} ms, "
        f"rerank+prune {t['rerank_prune']:.0f} ms)"
    )
    for i, r in enumerate(answer.results, 1):
        kept = sum(s.kept for s in r.result.sentences)
        print(
            f"\n## [{i}] {r.id}#{r.chunk}: reranking_score {r.reranking_score:.4f}, retrieval rank "
            f"{r.retrieval_rank}, kept {kept}/{len(r.result.sentences)} sentences"
        )
        print(r.highlighted)
    print("\n# pruned context:\n" + answer.context())
    return 0
