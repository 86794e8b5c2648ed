"""`prune fidelity`: an exported precision against the fp32 PyTorch reference."""

from __future__ import annotations

from pathlib import Path

from engine.cli.flags import add_batching, add_openvino, add_windows, batching, input_file, output_file
from engine.errors import PruneError
from engine.settings import positive_int
from engine.pipeline.spec import Manifest


def add(new) -> None:
    """`prune fidelity`'s flags."""
    f = new("fidelity", help="compare an exported precision with the fp32 PyTorch reference")
    f.add_argument("--model", required=True, help="exported folder (any precision)")
    f.add_argument("--reference", help="the checkpoint (default: the manifest's source)")
    f.add_argument(
        "--data", required=True, help="JSONL: sentence-labelled (context, sentences) or RAG (passages)"
    )
    f.add_argument("--limit", type=positive_int, help="first N documents")
    f.add_argument("--out", help="write the report as JSON here")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_windows(f)
    add_openvino(f, ("onnxruntime", "openvino"))
    add_batching(f)
    f.set_defaults(func=run)


def run(args) -> int:
    """Run `prune fidelity`; the exit status."""
    from engine.fidelity_check import format_report, gate, load_docs, measure, save
    from engine.pruner import Pruner

    input_file(args.data, "--data")  # bad input is reported before any model loads
    output_file(args.out, "--out", make_folders=True)
    docs = load_docs(args.data, args.limit)
    candidate = Pruner.load(
        args.model,
        args.backend,
        threads=args.threads,
        batching=batching(args),
        precision=args.inference_precision,
    )
    manifest = Manifest.read(args.model)
    source = args.reference or (manifest.source.checkpoint if manifest.source else "")
    if (
        not args.reference
        and not Path(source).exists()
        and (Path(source).is_absolute() or source.startswith(".") or len(Path(source).parts) != 2)
    ):
        raise PruneError(
            f"the reference checkpoint {source!r} (the export's source, from its manifest) is not "
            "there; pass --reference CHECKPOINT (the checkpoint the model was exported from)"
        )
    reference = Pruner.load(
        source,
        backend="torch",
        family=manifest.family,
        threads=args.threads,
        batching=batching(args),
        module_options={
            k: v for k, v in manifest.options.items() if k in ("mode", "scale", "shift", "rerank", "pooling")
        },
    )
    rep = measure(
        candidate,
        reference,
        docs,
        progress=not (args.no_progress or args.quiet),
        log=args.log,
        windows=args.windows,
    )
    rep.update(model=args.model, precision=manifest.precision, data=args.data, runtime=candidate.describe())
    rep["gate"] = gate(rep, candidate.family.rules.threshold)
    print(format_report(f"{Path(args.model).name} ({candidate.describe()}, windows {rep['windows']})", rep))
    print(f"gate: {'passed' if rep['gate']['passed'] else 'FAILED'}: {rep['gate']['reason']}")
    if args.out:
        save(rep, args.out)
        print(f"wrote {args.out}")
    return 0
