"""`prune run`: prune passages for a question, or a JSONL file of calls."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from engine.cli.flags import (
    add_batching,
    load_compressor,
    add_compressor,
    add_call_options,
    add_openvino,
    add_setting,
    add_tags,
    batching,
    call_options,
    compressor_named,
    input_file,
    model_path,
    output_file,
    tags,
)
from engine.errors import PruneError
from engine.pipeline.inputs import CallOptions
from engine.pipeline.encode import MULTILINGUAL, UNKNOWN_SHARE_WARNING, unknown_warning
from engine.settings import TORCH_ATTENTIONS, TORCH_DTYPES, positive_int


def add(new) -> None:
    """`prune run`'s flags."""
    r = new("run", help="prune passages for a question")
    r.add_argument(
        "--model",
        help="exported folder (onnxruntime) or checkpoint (--backend torch), or 'default' "
        "(all-MiniLM-L6-v2, exported on first use); default: 'default'",
    )
    add_openvino(r, ("onnxruntime", "openvino", "torch"))
    r.add_argument(
        "--server",
        help="a Triton server, host:port (gRPC 8001 or HTTP 8000) instead of in-process; "
        "several replicas (gRPC): host1:8001,host2:8001 or dns:///name:8001",
    )
    add_setting(r, "text_model", "; a core model's name makes this client tokenize")
    r.add_argument("--protocol", choices=["grpc", "http"], default="grpc", help="how to reach --server")
    add_setting(r, "timeout")
    r.add_argument("--family", help="family override for --backend torch")
    add_setting(r, "device", "; with --backend torch, torch on the GPU")
    r.add_argument(
        "--dtype",
        choices=TORCH_DTYPES,
        default=TORCH_DTYPES[0],
        help="--backend torch: the weights' and activations' type (float16/bfloat16 on a GPU)",
    )
    r.add_argument(
        "--attn",
        choices=TORCH_ATTENTIONS,
        default=TORCH_ATTENTIONS[0],
        help="--backend torch: attention implementation (sdpa: XLM-R and BERT backbones)",
    )
    r.add_argument(
        "--trt-provider",
        action="store_true",
        help="with --device cuda: ONNX Runtime's TensorRT provider first (fp16; engines cached in "
        "the model folder's trt-cache/), the CUDA provider where it is absent",
    )
    r.add_argument("--question", help="the question the passages are pruned for")
    r.add_argument("--context", action="append", help="a passage (repeatable)")
    r.add_argument(
        "--context-file", action="append", help="a file holding one passage; - for stdin (repeatable)"
    )
    r.add_argument(
        "--passages-file",
        action="append",
        help="a JSONL file of passages, one a line: a JSON string or an object with text (repeatable)",
    )
    add_call_options(r)
    r.add_argument("--json", action="store_true", help="print results as JSON")
    r.add_argument("--highlight", action="store_true", help="print passages with kept sentences tagged")
    r.add_argument(
        "--input",
        help="a JSONL file of queries (question, passages or context, optional id, "
        "threshold, title, alpha, top_k, windows, splitter, lexical_weight, passage_margin), - for stdin; "
        "one result line per input line",
    )
    r.add_argument("--output", help="where the JSONL results go with --input (default: stdout)")
    r.add_argument(
        "--group",
        type=positive_int,
        default=64,
        help="queries read, batched together and written at a time with --input (bounds memory)",
    )
    add_tags(r, " (--highlight)")
    add_batching(r)
    add_compressor(r)
    r.set_defaults(func=run)


def run(args) -> int:
    """Run `prune run`; the exit status."""
    from engine.pruner import Pruner

    # bad input is reported before any model loads
    options = call_options(args)
    args.pre, args.post = tags(args)
    if args.input:
        if args.question or args.context or args.context_file or args.passages_file:
            raise PruneError(
                "--input takes the questions and passages from the file: "
                "drop --question/--context/--context-file/--passages-file"
            )
        input_file(args.input, "--input")
        output_file(args.output, "--output")
    else:
        if args.question is None:
            raise PruneError(
                "give --question (with --context/--context-file/--passages-file), or --input FILE.jsonl"
            )
        contexts = _read_contexts(args)
        if not args.question.strip():
            raise PruneError("question is empty")
    t0 = time.perf_counter()
    if args.server:
        name = args.text_model or "default_text"
        args.log(
            f"connecting to model {name!r} on the Triton server at {args.server} ({args.protocol}; "
            "waiting up to 10 s for it to be ready) ..."
        )
        pruner = Pruner.connect(
            args.server,
            name,
            protocol=args.protocol,
            tokenizer=args.model,
            batching=batching(args),
            timeout=args.timeout,
        )
        args.model = f"{args.protocol}://{args.server}/{name}"
    else:
        args.model = model_path(args)
        pruner = Pruner.load(
            args.model,
            backend=args.backend,
            family=args.family,
            threads=args.threads,
            batching=batching(args),
            device=args.device,
            tensorrt=args.trt_provider,
            log=args.log,
            dtype=args.dtype,
            attn=args.attn,
            precision=args.inference_precision,
            compressor=load_compressor(args),
        )
    t_load = time.perf_counter() - t0
    compressor = compressor_named(args, pruner)
    if compressor and options.compress_rate is None and options.compress_target_token is None:
        args.log(
            f"{compressor} is loaded beside the pruner: --compress-rate or --compress-target-token"
            + (" (or an --input line's compress_rate, compress_target_token)" if args.input else "")
            + " runs it on what each call keeps; without them nothing is compressed"
        )
    if args.input:
        return _run_file(pruner, args, options)
    t1 = time.perf_counter()
    results = pruner.prune(args.question, contexts, options)
    t_run = time.perf_counter() - t1
    unknown = unknown_warning(results)
    if args.json:
        print(json.dumps([r.to_dict() for r in results], ensure_ascii=False, indent=2))
        if unknown:
            args.log(f"warning: {unknown}")
        return 0
    _print_results(
        args,
        pruner,
        results,
        unknown,
        f"loaded in {t_load:.2f} s, pruned {len(results)} passage(s) in {t_run * 1000:.0f} ms",
    )
    return 0


def _print_results(args, pruner, results, unknown: str | None, timings: str) -> None:
    """`prune run`'s text output: the model, the warning of text it largely does not know
    (engine.pipeline.encode), each passage's result."""
    fam = pruner.family
    print(f"# model {args.model} ({fam.name}, {pruner.describe()}); {timings}")
    if unknown:
        print(f"# warning: {unknown}")
    for r in results:
        score = "n/a" if r.reranking_score is None else f"{r.reranking_score:.4f}"
        kept = sum(s.kept for s in r.sentences)
        print(
            f"\n## passage {r.index}: reranking_score {score}, kept {kept}/{len(r.sentences)} sentences, "
            f"compression {r.compression_rate:.0%}, threshold {r.threshold}"
            + (f", lexical_weight {r.lexical_weight}" if r.lexical_weight else "")
            + f", blocks {r.blocks}"
            + (f" ({r.windows} windows)" if r.windows != "sentences" else "")
            + (f", {r.splitter} sentences" if r.splitter != "engine" else "")
            + (
                f", unknown_share {r.unknown_share}"
                if unknown and (r.unknown_share or 0) > UNKNOWN_SHARE_WARNING
                else ""
            )
        )
        if r.budget is not None and r.budget.cut:
            b = r.budget
            counted = "the model's tokenizer" if b.tokenizer == "model" else b.tokenizer
            print(
                f"  budget: {b.tokens} tokens ({counted}) for the call's pruned texts ({b.used} used, {b.kept} "
                f"by this passage): it cut {b.cut} sentence(s) the other rules kept here"
            )
        if args.highlight:
            print(r.highlight(args.pre, args.post))
        elif r.sentences and not kept and not args.verbose:
            why = (
                "the budget cut what the rules kept"
                if r.budget is not None and r.budget.cut
                else "nothing kept"
            )
            print(f"  ({why}; -v lists its sentences)")
        else:
            for s in r.sentences:
                print(f"  [{'x' if s.kept else ' '}] {s.probability:.3f}  {s.text[:100]}")
            print("\npruned_context:\n" + r.pruned_context)
        if r.compressed_context is not None and (r.compressed_context or r.pruned_context):
            print("\ncompressed_context:\n" + (r.compressed_context or "(nothing kept)"))


def _read_contexts(args) -> list[str]:
    contexts = list(args.context or [])
    for f in args.context_file or []:
        path = Path(f)
        if str(f) == "-":
            contexts.append(sys.stdin.read())
            continue
        input_file(f, "--context-file")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise PruneError(
                f"--context-file {f}: not UTF-8 text ({exc.reason} at byte {exc.start})"
            ) from None
        records = _passage_lines(text)
        if records:
            raise PruneError(
                f"--context-file {f}: holds {records} JSON lines of passages (--passages-file's format), "
                "but --context-file takes a whole file as one passage of plain text: "
                f"use --passages-file {f}"
            )
        contexts.append(text)
    for f in args.passages_file or []:
        input_file(f, "--passages-file")
        contexts.extend(_read_passages_file(f))
    if not contexts:
        raise PruneError("give at least one --context, --context-file or --passages-file")
    return contexts


def _read_passages_file(name: str) -> list[str]:
    """The passages of a JSONL file: one a line, a JSON string or an object with `text`
    (what a retriever returns; `prune index --data` reads the same)."""
    from engine.datafiles import read_jsonl

    out = []
    try:
        for n, row in enumerate(read_jsonl(name), 1):
            text = row.get("text") if isinstance(row, dict) else row
            if not isinstance(text, str):
                raise ValueError(
                    f"{name}: record {n}: expected a JSON string or an object with a text string"
                )
            out.append(text)
    except (FileNotFoundError, ValueError) as exc:
        plain = "not valid JSON" in str(exc) and not out and _first_line(name)[:1] not in ("{", '"', "[")
        raise PruneError(
            f"--passages-file {exc}"
            + (
                "; --passages-file reads JSON lines (a JSON string or an object with text, one passage a "
                f"line): a plain-text file holding one passage is --context-file {name}"
                if plain
                else ""
            )
        ) from None
    if not out:
        raise PruneError(f"--passages-file {name}: no passages")
    return out


def _first_line(name: str) -> str:
    """The first non-blank line of a text file, stripped ("" when it has none or is unreadable)."""
    try:
        with open(name, encoding="utf-8", errors="replace") as fh:
            return next((line.strip() for line in fh if line.strip()), "")
    except OSError:
        return ""


def _passage_lines(text: str) -> int:
    """How many passages `text` holds as --passages-file reads them, when it is such a file
    (every non-blank line a JSON string or an object with a text string, a file of two lines at
    least, or of one that is an object with text); 0 for anything else, plain text or one JSON
    document (a tool's answer, say, which is a passage as it stands)."""
    lines = [line for line in text.splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            return 0
    passages = all(
        isinstance(r, str) or (isinstance(r, dict) and isinstance(r.get("text"), str)) for r in records
    )
    if not passages or not records or (len(records) == 1 and not isinstance(records[0], dict)):
        return 0
    return len(records)


def _run_file(pruner, args, options: CallOptions) -> int:
    from engine.batchfile import run_file

    source = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    sink = sys.stdout if args.output in (None, "-") else open(args.output, "w", encoding="utf-8")
    try:
        stats = run_file(pruner, source, sink, group=args.group, progress=not args.quiet, options=options)
    finally:
        if source is not sys.stdin:
            source.close()
        if sink is not sys.stdout:
            sink.close()
    if stats["unknown"]:
        args.log(
            f"warning: {stats['unknown']} of {stats['passages']} passages are largely unknown to this model's "
            f"vocabulary (their results' unknown_share is over {UNKNOWN_SHARE_WARNING}); its scores mean "
            f"little there. For such text use a multilingual model: {MULTILINGUAL}"
        )
    return 0 if stats["errors"] == 0 else 3
