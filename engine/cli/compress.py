"""`prune compress`: LLMLingua-2 on a text or a file, the words llmlingua 0.2.2 keeps."""

from __future__ import annotations

import json
import sys

from engine.cli.flags import add_setting, input_file, output_file, positive_float
from engine.errors import PruneError


def _escaped(text: str) -> str:
    """A force token as typed in a shell: "\\n" and "\\t" are a newline and a tab."""
    return text.replace("\\n", "\n").replace("\\t", "\t")


def add(new) -> None:
    """`prune compress`'s flags (compress_prompt's argument names, dashed)."""
    c = new(
        "compress",
        help="compress a prompt with an LLMLingua-2 checkpoint (the words llmlingua keeps)",
        description="Compress a prompt with an LLMLingua-2 token classifier, keeping the words "
        "llmlingua 0.2.2's PromptCompressor(use_llmlingua2=True).compress_prompt keeps.",
    )
    c.add_argument(
        "--model",
        help="an LLMLingua-2 checkpoint folder (config.json, safetensors) or its export (prune export)",
    )
    c.add_argument(
        "--server",
        help="instead of --model: a Triton server, host:port (gRPC 8001 or HTTP 8000), serving the "
        "compressor's text model (prune repository on its export; --text-model names it)",
    )
    c.add_argument("--protocol", choices=["grpc", "http"], default="grpc", help="how to reach --server")
    add_setting(c, "text_model", "; with --server, the compressor's (`<name>_text`)")
    add_setting(c, "timeout")
    text = c.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", help="the prompt")
    text.add_argument("--file", help="a file holding the prompt ('-': stdin)")
    text.add_argument(
        "--input",
        help="a JSONL file ('-': stdin), one call a line with POST /v1/compress's fields (context, rate, "
        "force_tokens, ..., and id); one result line per input line, an error line for a line that fails",
    )
    c.add_argument("--output", help="where the JSONL results go with --input (default: stdout)")
    c.add_argument("--rate", type=positive_float, default=0.5, help="the share of tokens to keep, in (0, 1]")
    c.add_argument(
        "--target-token", type=int, default=-1, help="tokens to keep (tiktoken's count); overrides --rate"
    )
    c.add_argument(
        "--force-tokens", nargs="+", default=[], type=_escaped, help='tokens always kept ("\\n" is a newline)'
    )
    c.add_argument("--force-reserve-digit", action="store_true", help="keep every word with a digit")
    c.add_argument(
        "--drop-consecutive", action="store_true", help="drop a force token repeating the last kept"
    )
    c.add_argument("--token-to-word", choices=["mean", "first"], default="mean", help="a word's probability")
    c.add_argument(
        "--json", action="store_true", help="print the whole result (llmlingua's fields, kept_spans)"
    )
    add_setting(c, "threads")
    add_setting(
        c,
        "device",
        "; cuda runs an export (fp16 is the GPU's precision) on ONNX Runtime's CUDA provider, a checkpoint "
        "runs in PyTorch on the CPU (the folder decides which)",
    )
    c.set_defaults(func=run)


def run(args) -> int:
    """Run `prune compress`; the exit status."""
    from engine.pipeline.lingua_decide import CompressOptions

    if (args.model is None) == (args.server is None):
        raise PruneError(
            "give --model (a checkpoint or its export) or --server (a Triton server), one of them"
        )
    input_file(args.file, "--file")
    if args.output and not args.input:
        raise PruneError("--output is for --input (a JSONL file of calls)")
    if args.input:
        return _batch(args)
    if args.file is None:
        prompt = args.text
    elif args.file == "-":
        prompt = sys.stdin.read()
    else:
        with open(args.file, encoding="utf-8") as f:
            prompt = f.read()
    if not prompt.strip():
        raise PruneError("the prompt is empty")
    arguments = _arguments(args)
    CompressOptions(**arguments)  # checked before the model loads
    compressor = _open(args)
    result = compressor.compress(prompt, **arguments)
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
        return 0
    print(result.compressed_prompt)
    args.log(
        f"{result.origin_tokens} tokens -> {result.compressed_tokens} (ratio {result.ratio}, rate {result.rate}; "
        "tiktoken gpt-3.5-turbo)"
    )
    return 0


def _open(args):
    """The compressor: --model's, in this process, or --server's text model."""
    from engine.compressor import Compressor

    if args.server is None:
        return Compressor.load(args.model, threads=args.threads, device=args.device)
    if not args.text_model:
        raise PruneError("with --server, --text-model names the compressor's text model (`<name>_text`)")
    args.log(
        f"connecting to model {args.text_model!r} on the Triton server at {args.server} ({args.protocol}; "
        "waiting up to 10 s for it to be ready) ..."
    )
    return Compressor.connect(args.server, args.text_model, protocol=args.protocol, timeout=args.timeout)


def _arguments(args) -> dict:
    """compress's keyword arguments from the flags."""
    return dict(
        rate=args.rate,
        target_token=args.target_token,
        force_tokens=args.force_tokens,
        force_reserve_digit=args.force_reserve_digit,
        drop_consecutive=args.drop_consecutive,
        token_to_word=args.token_to_word,
    )


def _batch(args) -> int:
    """`prune compress --input FILE.jsonl [--output OUT.jsonl]`: the flags are each line's defaults."""
    from engine.batchfile import compress_file
    from engine.pipeline.lingua_decide import CompressOptions

    input_file(args.input, "--input")
    output_file(args.output, "--output")
    defaults = _arguments(args)
    CompressOptions(**defaults)  # checked before the model loads
    compressor = _open(args)
    source = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    sink = sys.stdout if args.output in (None, "-") else open(args.output, "w", encoding="utf-8")
    try:
        counts = compress_file(compressor, source, sink, defaults=defaults, progress=not args.quiet)
    finally:
        if source is not sys.stdin:
            source.close()
        if sink is not sys.stdout:
            sink.close()
    return 3 if counts["errors"] else 0  # as prune run --input: some lines failed
