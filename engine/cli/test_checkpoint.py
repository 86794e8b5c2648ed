"""`prune test-checkpoint`: tiny random-weight checkpoints with the real layouts."""

from __future__ import annotations

from pathlib import Path

from engine.cli.flags import input_file, output_folder
from engine.errors import PruneError


def add(new) -> None:
    """`prune test-checkpoint`'s flags."""
    t = new("test-checkpoint", help="write tiny random-weight checkpoints with the real layouts")
    t.add_argument(
        "--family", default="all", help="a family name, or all; llmlingua2: an LLMLingua-2 token classifier"
    )
    t.add_argument("--out", required=True, help="output folder (one subfolder per family with --family all)")
    t.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    t.add_argument(
        "--backbone",
        choices=["modernbert"],
        help="with --family open_provence: a ModernBERT backbone instead of XLM-RoBERTa",
    )
    t.add_argument(
        "--layout",
        choices=["xlm-roberta", "bert"],
        help="with --family llmlingua2: XLM-R with SentencePiece (the default) or mBERT with WordPiece",
    )
    t.add_argument(
        "--size",
        choices=["tiny", "large"],
        default="tiny",
        help="with --family llmlingua2: large is microsoft/llmlingua-2-xlm-roberta-large-meetingbank's layout "
        "(24 layers, hidden 1024, vocabulary 250,002; 2.2 GB of random weights) for prune bench; name its "
        "folder after the published model (llmlingua needs xlm-roberta-large in the path)",
    )
    t.add_argument(
        "--corpus",
        help="with --size large: a JSONL of contexts (a prune or RAG file) the tokenizer is trained on "
        "(default: the tiny checkpoints' few sentences, which cut words into far more pieces)",
    )
    t.set_defaults(func=run)


def run(args) -> int:
    """Run `prune test-checkpoint`; the exit status."""
    from engine.pipeline.families import FAMILIES
    from export.checkpoints import make_test_checkpoint

    names = list(FAMILIES) if args.family == "all" else [args.family]
    output_folder(args.out, "--out")
    if (args.layout or args.size != "tiny") and names != ["llmlingua2"]:
        raise PruneError("--layout and --size are for --family llmlingua2")
    if names == ["llmlingua2"]:
        return _lingua(args)
    if args.backbone and names != ["open_provence"]:
        raise PruneError("--backbone modernbert is for --family open_provence")
    for name in names:
        out = Path(args.out) / name if args.family == "all" else Path(args.out)
        make_test_checkpoint(name, out, seed=args.seed, backbone=args.backbone)
        print(f"wrote {out} (random weights: outputs are meaningless)")
    return 0


def _lingua(args) -> int:
    """An LLMLingua-2 checkpoint: the tests' tiny one, or the published XLM-R large layout."""
    from export.lingua_checkpoints import make_lingua_checkpoint

    if args.corpus and args.size != "large":
        raise PruneError("--corpus is for --size large")
    if args.size == "large" and args.layout == "bert":
        raise PruneError(
            "--size large is the XLM-R layout (microsoft/llmlingua-2-xlm-roberta-large-meetingbank)"
        )
    corpus = None
    if args.corpus:
        from engine.datafiles import load_contexts

        input_file(args.corpus, "--corpus")
        corpus = load_contexts(args.corpus)
    make_lingua_checkpoint(
        args.layout or "xlm-roberta", args.out, seed=args.seed, size=args.size, corpus=corpus
    )
    print(f"wrote {args.out} (LLMLingua-2 {args.size}, random weights: outputs are meaningless)")
    if args.size == "large" and "xlm-roberta-large" not in str(Path(args.out).resolve()):
        print("note: llmlingua's PromptCompressor reads its word rules from the folder's name: name it "
              "llmlingua-2-xlm-roberta-large-meetingbank-random for prune bench's reference")  # fmt: skip
    return 0
