"""The engine's LlamaIndex postprocessor against LlamaIndex's own sentence pruner,
`SentenceEmbeddingOptimizer`, with the same model weights (all-MiniLM-L6-v2: the default
model, and the retrieval encoder exported from the same checkpoint as the optimizer's
embedding model), on sentence-labelled data:

    python -m benchmarks.compare_optimizer --data ../shared/data/squad-dev-prune.jsonl \\
        --out benchmarks/results/optimizer-comparison

Both run as a LlamaIndex user runs them: `postprocess_nodes` on one TextNode per document
with the question as the query. A gold sentence counts as kept when at least half of its
characters are in what the pruner kept (the optimizer returns joined text: its sentences
are found back in the document). Sentence P/R/F1 are micro over all sentences; tokens kept
is the share of the documents' tokens (the MiniLM tokenizer) left; errors are documents
on which the pruner raised (the optimizer raises "Optimizer returned zero sentences")."""
from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from engine.tools.harness import Study, parser


def _kept_spans(context: str, pieces: list[str]) -> list[tuple[int, int]]:
    """Where each kept piece of text is in the document (searched left to right)."""
    spans, pos = [], 0
    for piece in pieces:
        piece = piece.strip()
        if not piece:
            continue
        at = context.find(piece, pos)
        if at < 0:
            at = context.find(piece)
        if at >= 0:
            spans.append((at, at + len(piece)))
            pos = at + len(piece)
    return spans


def _gold_kept(gold: list[tuple[int, int]], kept: list[tuple[int, int]]) -> np.ndarray:
    out = []
    for s, e in gold:
        covered = sum(max(0, min(e, ke) - max(s, ks)) for ks, ke in kept)
        out.append(covered * 2 >= (e - s))
    return np.array(out, dtype=bool)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, repeats=1)
    p.add_argument("--data", required=True, help="JSONL with question, context, sentences, labels")
    p.add_argument("--limit", type=int, help="first N documents")
    args = p.parse_args(argv)
    study = Study("comparison", "benchmarks.compare_optimizer", argv)
    from llama_index.core.postprocessor import SentenceEmbeddingOptimizer
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from engine.runtime.default_model import ensure_default_model
    from engine.integrations.llamaindex import EngineEmbedding, PrunePostprocessor
    from engine.pruner import Pruner
    from engine.rag.embedder import Embedder, ensure_default_encoder
    from engine.tools.quality import load_prune_data, sentence_metrics
    samples = load_prune_data(args.data, args.limit)
    encoder = Embedder.load(ensure_default_encoder(), threads=args.threads)
    embed = EngineEmbedding(encoder)
    pruner = Pruner.load(ensure_default_model(precision="fp32"), threads=args.threads)
    systems: dict[str, Any] = {
        "engine: PrunePostprocessor (default model, its defaults: lexical_weight 0.5)":
            PrunePostprocessor(pruner=pruner, keep_empty=True),
        "engine: PrunePostprocessor (default model, lexical_weight 0: the model alone)":
            PrunePostprocessor(pruner=pruner, keep_empty=True, lexical_weight=0.0),
        "SentenceEmbeddingOptimizer(threshold_cutoff=0.7)": SentenceEmbeddingOptimizer(embed_model=embed,
                                                                                       threshold_cutoff=0.7),
        "SentenceEmbeddingOptimizer(percentile_cutoff=0.5)": SentenceEmbeddingOptimizer(embed_model=embed,
                                                                                        percentile_cutoff=0.5),
        "SentenceEmbeddingOptimizer(percentile_cutoff=0.5, context_before=0, context_after=0)":
            SentenceEmbeddingOptimizer(embed_model=embed, percentile_cutoff=0.5, context_before=0, context_after=0),
    }
    rows = []
    for name, post in systems.items():
        preds, labels, errors, kept_tokens, tokens = [], [], 0, 0, 0
        t0 = time.perf_counter()
        for i, s in enumerate(samples):
            n_tokens = encoder.token_counts([s.context])[0]
            tokens += n_tokens
            labels.append(s.labels)
            node = NodeWithScore(node=TextNode(text=s.context))
            try:
                out = post.postprocess_nodes([node], query_bundle=QueryBundle(s.question))
            except ValueError:
                errors += 1
                preds.append(np.zeros(len(s.spans), dtype=bool))   # nothing came back for this document
                continue
            if name.startswith("engine"):
                meta = out[0].node.metadata["pruning"]
                spans = [(x["start"], x["end"]) for x in meta["sentences"] if x["kept"]]
                text = out[0].node.get_content()
            else:
                text = out[0].node.get_content()
                spans = _kept_spans(s.context, post._tokenizer_fn(text))
            preds.append(_gold_kept(s.spans, spans))
            kept_tokens += encoder.token_counts([text])[0] if text.strip() else 0
            print(f"\r{name[:40]}: {i + 1}/{len(samples)}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        m = sentence_metrics(preds, labels)["micro"]
        rows.append({"system": name, "precision": m["precision"], "recall": m["recall"], "f1": m["f1"],
                     "tokens_kept": kept_tokens / tokens, "errors": errors, "documents": len(samples),
                     "seconds": time.perf_counter() - t0})
    lines = study.header("The engine against LlamaIndex's SentenceEmbeddingOptimizer",
                         f"{len(samples)} documents; sentence precision/recall against the labels.")
    lines += ["| system | sentence P | sentence R | sentence F1 | tokens kept | errors |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['system']} | {100 * r['precision']:.1f} | {100 * r['recall']:.1f} | {100 * r['f1']:.1f} | "
                     f"{100 * r['tokens_kept']:.1f}% | {r['errors']} of {r['documents']} |")
    study.write(args.out, {"rows": rows}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
