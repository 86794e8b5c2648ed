"""`prune test-checkpoint`: tiny random-weight checkpoints with the real layouts."""

from __future__ import annotations

from pathlib import Path

from engine.cli.flags import output_folder
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
    t.set_defaults(func=run)


def run(args) -> int:
    """Run `prune test-checkpoint`; the exit status."""
    from engine.pipeline.families import FAMILIES
    from export.checkpoints import make_test_checkpoint

    names = list(FAMILIES) if args.family == "all" else [args.family]
    output_folder(args.out, "--out")
    if args.layout and names != ["llmlingua2"]:
        raise PruneError("--layout is for --family llmlingua2")
    if names == ["llmlingua2"]:
        from export.lingua_checkpoints import make_lingua_checkpoint

        make_lingua_checkpoint(args.layout or "xlm-roberta", args.out, seed=args.seed)
        print(f"wrote {args.out} (LLMLingua-2, random weights: outputs are meaningless)")
        return 0
    if args.backbone and names != ["open_provence"]:
        raise PruneError("--backbone modernbert is for --family open_provence")
    for name in names:
        out = Path(args.out) / name if args.family == "all" else Path(args.out)
        make_test_checkpoint(name, out, seed=args.seed, backbone=args.backbone)
        print(f"wrote {out} (random weights: outputs are meaningless)")
    return 0
