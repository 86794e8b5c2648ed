"""`prune export`: a checkpoint exported to ONNX (and its reduced precisions, TensorRT's inputs)."""

from __future__ import annotations

from pathlib import Path

from engine.cli.flags import add_embedding_options, embedding_options, input_file, output_folder
from engine.errors import PruneError
from engine.pipeline.families import FAMILIES
from engine.pipeline.lingua_words import is_lingua_checkpoint
from engine.settings import positive_int


def add(new) -> None:
    """`prune export`'s flags."""
    e = new("export", help="checkpoint -> ONNX graph + tokenizer + manifest, checked against PyTorch")
    e.add_argument(
        "--model", required=True, help="checkpoint folder, hub id, or 'default' (all-MiniLM-L6-v2)"
    )
    e.add_argument("--out", required=True, help="output folder")
    e.add_argument(
        "--family",
        help=f"override the detected family: {', '.join(FAMILIES)} (zilliz: open_provence); an LLMLingua-2 "
        "checkpoint (a two-label XLM-R or BERT token classifier) is detected as llmlingua2",
    )
    e.add_argument("--tokenizer", help="tokenizer folder or hub id, if the checkpoint has none")
    e.add_argument(
        "--max-length",
        type=positive_int,
        help="model window in tokens (default: 512, or the checkpoint's if shorter; at most what its "
        "position embeddings allow, e.g. 8192 for BGE-M3-based models)",
    )
    e.add_argument("--opset", type=positive_int, default=17, help="ONNX opset of the exported graph")
    e.add_argument(
        "--external-data",
        choices=["auto", "always", "never"],
        default="auto",
        help="store weights beside the graph (auto: when over 2 GB)",
    )
    e.add_argument("--no-verify", action="store_true", help="skip the parity check against PyTorch")
    e.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    e.add_argument(
        "--precision",
        choices=["fp32", "int8", "fp16", "ov-int8", "auto"],
        help="default auto (fp32 with --tensorrt); fp32: the reference, the family's own numbers; "
        "int8: dynamic quantization for CPUs; fp16: for GPUs (float32 I/O, softmax, pooling); "
        "ov-int8: static INT8 for OpenVINO (NNCF; an OpenVINO IR folder; pip install "
        "'prune-engine[openvino]'); auto: of the precisions worth trying on this CPU's kind "
        "(fp32, int8; ov-int8 with VNNI or AMX; ov-bf16 and ov-int8-bf16, OpenVINO's bf16 "
        "inference, with bf16), the fastest that passes the fidelity gate (printed, and recorded in "
        "the manifest, which loaders follow); an LLMLingua-2 checkpoint: fp32, int8, fp16 (the GPU's) or auto (of fp32 "
        "and int8, the faster that passes the word-label gate)",
    )
    e.add_argument(
        "--calibration",
        help="ov-int8 (and auto): a text file (one passage per paragraph) or JSONL "
        "with `text`, to calibrate on instead of the built-in generic text (never evaluation data)",
    )
    e.add_argument(
        "--gate-data",
        help="auto: JSONL the gate is measured on (prune fidelity --data's formats; "
        "default: built-in generic calls)",
    )
    e.add_argument("--no-optimize", action="store_true", help="skip ONNX Runtime's transformer optimizer")
    e.add_argument(
        "--int8-weight-type",
        choices=["QInt8", "QUInt8"],
        default="QInt8",
        help="weight type of the INT8 graph (default chosen by measured fidelity, docs/precisions.md)",
    )
    e.add_argument(
        "--int8-per-tensor",
        dest="int8_per_channel",
        action="store_false",
        help="one scale per weight tensor instead of per output channel",
    )
    e.add_argument(
        "--tensorrt",
        action="store_true",
        help="also build a TensorRT plan (needs TensorRT: NVIDIA's TensorRT or Triton container); "
        "writes build_tensorrt.sh either way",
    )
    e.add_argument(
        "--max-batch-size", type=positive_int, default=64, help="largest batch of the TensorRT profiles"
    )
    e.add_argument(
        "--encoder",
        action="store_true",
        help="export a sentence-embedding checkpoint's text encoder for retrieval (prune index "
        "--encoder) instead of a pruning model",
    )
    add_embedding_options(e)
    e.set_defaults(func=run)


def run(args) -> int:
    """Run `prune export`; the exit status."""
    if args.model == "default":
        from engine.models.default_model import default_checkpoint

        args.model = default_checkpoint()
    # bad input is reported before any work starts: flags that do not go together, then files
    if args.precision is None:
        args.precision = "fp32" if args.tensorrt or args.encoder else "auto"
    if args.gate_data and args.precision != "auto":
        raise PruneError("--gate-data is for --precision auto")
    if args.calibration and args.precision not in ("ov-int8", "auto"):
        raise PruneError("--calibration is for --precision ov-int8 or auto")
    _checkpoint(args.model, "--model")
    input_file(args.calibration, "--calibration")
    input_file(args.gate_data, "--gate-data")
    output_folder(args.out, "--out")
    if args.family == "llmlingua2" or (args.family is None and is_lingua_checkpoint(args.model)):
        return _lingua(args)
    try:
        from export.backbone import export_encoder
        from export.onnx import export_model
    except ImportError as exc:
        raise PruneError(
            f"prune export needs PyTorch, transformers and onnx (missing here: {exc.name}): "
            "pip install 'prune-engine[export]'"
        ) from exc
    if args.encoder:
        export_encoder(args.model, args.out, overwrite=args.overwrite, opset=args.opset, log=args.log)
        return 0
    if args.precision == "auto":
        return _auto(args)
    if args.precision == "ov-int8":
        return _openvino_int8(args)
    export_model(
        args.model,
        args.out,
        overwrite=args.overwrite,
        precision=args.precision,
        tensorrt_graph=args.tensorrt,
        log=args.log,
        **_export_args(args),
    )
    if args.tensorrt:
        from export.tensorrt import export_tensorrt

        export_tensorrt(
            Path(args.out),
            precision="fp16" if args.precision == "fp32" else args.precision,
            max_batch_size=args.max_batch_size,
            log=args.log,
        )
    return 0


def _lingua(args) -> int:
    """An LLMLingua-2 checkpoint: its token classifier exported for `Compressor.load` (fp32, INT8
    behind the word-decision gate, or auto: the faster of the two that passes, timed here;
    export/lingua_onnx.py, export/lingua_auto.py)."""
    unsupported = [
        flag
        for flag, given in (
            (f"--precision {args.precision}", args.precision not in ("fp32", "int8", "fp16", "auto")),
            ("--tensorrt", args.tensorrt),
            ("--encoder", args.encoder),
            ("--calibration", args.calibration),
            ("--gate-data", args.gate_data),
            ("--tokenizer", args.tokenizer),
            ("--max-length", args.max_length),
        )
        if given
    ]
    if unsupported:
        raise PruneError(
            f"{args.model} is an LLMLingua-2 checkpoint: its export is fp32, int8, fp16 or auto, and takes none of "
            f"{', '.join(unsupported)}"
        )
    from export.onnx import export_model

    export_args = dict(
        opset=args.opset,
        external_data=args.external_data,
        verify=not args.no_verify,
        optimize=not args.no_optimize,
        int8_weight_type=args.int8_weight_type,
        int8_per_channel=args.int8_per_channel,
    )
    if args.precision == "auto":
        from export.lingua_auto import choose_lingua_precision

        choose_lingua_precision(
            args.model, args.out, export_args=export_args, overwrite=args.overwrite, log=args.log
        )
        return 0
    export_model(
        args.model,
        args.out,
        family="llmlingua2",
        overwrite=args.overwrite,
        precision=args.precision,
        log=args.log,
        **export_args,
    )
    return 0


def _export_args(args) -> dict:
    """export_model's arguments from the flags, as every export path passes them."""
    return dict(
        family=args.family,
        tokenizer=args.tokenizer,
        max_length=args.max_length,
        opset=args.opset,
        external_data=args.external_data,
        verify=not args.no_verify,
        options=embedding_options(args),
        optimize=not args.no_optimize,
        int8_weight_type=args.int8_weight_type,
        int8_per_channel=args.int8_per_channel,
    )


def _checkpoint(name: str, flag: str) -> None:
    """A PruneError unless `name` is an existing path or looks like a hub id ('org/name'),
    as the exporter's loader takes them (engine.pytorch.modeling.resolve_checkpoint)."""
    if not Path(name).exists() and (name.count("/") != 1 or name.startswith((".", "/"))):
        raise PruneError(f"{flag} {name}: no such folder (and not a hub id like 'org/name')")


def _calibration(args) -> list[str] | None:
    """--calibration's passages (None: the built-in generic text)."""
    if not args.calibration:
        return None
    if args.calibration.endswith(".jsonl"):
        from engine.datafiles import read_jsonl

        texts = []
        for n, row in enumerate(read_jsonl(args.calibration), 1):
            if not (isinstance(row, dict) and isinstance(row.get("text"), str)):
                raise PruneError(
                    f"--calibration {args.calibration}: record {n} is not an object with a text string"
                )
            texts.append(row["text"])
    else:
        raw = Path(args.calibration).read_text(encoding="utf-8")
        texts = [t.strip() for t in raw.split("\n\n") if t.strip()]
    if not texts:
        raise PruneError(f"--calibration {args.calibration}: no text in it")
    return texts


def _auto(args) -> int:
    """Every precision this CPU runs, gated and timed; the fastest that passes (export/auto.py)."""
    from export.auto import choose_precision

    if args.tensorrt:
        raise PruneError("--tensorrt builds from an fp32/fp16 ONNX export, not from --precision auto")
    choose_precision(
        args.model,
        args.out,
        export_args=_export_args(args),
        calibration=_calibration(args),
        gate_data=args.gate_data,
        overwrite=args.overwrite,
        progress=not args.quiet,
        log=args.log,
    )
    return 0


def _openvino_int8(args) -> int:
    """The fp32 export (checked against PyTorch) in a scratch folder, then NNCF's static INT8."""
    import tempfile

    from export.onnx import export_model
    from export.ov_int8 import quantize

    if args.tensorrt:
        raise PruneError("--tensorrt builds from an ONNX export, not from ov-int8")
    texts = _calibration(args)
    with tempfile.TemporaryDirectory(prefix="prune-ov-int8-") as tmp:
        export_model(args.model, Path(tmp) / "fp32", precision="fp32", log=args.log, **_export_args(args))
        quantize(
            Path(tmp) / "fp32",
            args.out,
            texts=texts,
            overwrite=args.overwrite,
            progress=not args.quiet,
            log=args.log,
        )
    return 0
