"""`prune bench`: the speed of every path side by side on a RAG workload."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from engine.cli.flags import add_setting, input_file, output_folder
from engine.errors import PruneError
from engine.pipeline.lingua_words import is_lingua_checkpoint
from engine.settings import positive_int


def add(new) -> None:
    """`prune bench`'s flags."""
    b = new("bench", help="speed of every path side by side on the RAG workload")
    b.add_argument("--data", required=True, help="RAG JSONL (question, passages)")
    b.add_argument(
        "--model",
        help="exported fp32 folder (default: the default model; with an LLMLingua-2 --checkpoint, its "
        "fp32 export, made in the run's folder)",
    )
    b.add_argument(
        "--int8", help="exported int8 folder (default: the default model's, exported on first use)"
    )
    b.add_argument(
        "--fp16",
        help="exported fp16 folder (default with --device cuda: the default model's, "
        "exported on first use); without --model, the only export measured (no fp32 paths); with an "
        "LLMLingua-2 --checkpoint and --device cuda, its fp16 export (else made in the run's folder)",
    )
    b.add_argument(
        "--openvino",
        action="store_true",
        help="also OpenVINO: fp32, bf16 inference (where the CPU has "
        "it) and static INT8 (--ov-int8, else quantized here from --model with NNCF); [openvino] extra",
    )
    b.add_argument("--ov-int8", help="an `prune export --precision ov-int8` folder for --openvino")
    b.add_argument(
        "--serving",
        action="store_true",
        help="also serving under concurrency: prune api on the export the device serves (INT8 on a CPU "
        "where given, else fp32; fp16 with --device cuda) at each --concurrencies, concurrent calls "
        "merged against unmerged (--merge-calls on / off); with --int8 on a CPU these run anyway",
    )
    b.add_argument(
        "--peer-python",
        metavar="PYTHON",
        help="also sentence-transformers' ONNX and OpenVINO backends, "
        "each with its own int8 export, run by this interpreter of an environment with "
        "sentence-transformers[onnx,openvino] and datasets (their optimum pins transformers<4.58: "
        "docs/installing.md)",
    )
    add_setting(
        b,
        "device",
        "; prune bench on cuda: PyTorch fp32/fp16 and ONNX Runtime's CUDA provider (fp32, fp16); with an "
        "LLMLingua-2 --checkpoint: the reference on cuda against the fp32 export on the CUDA provider and "
        "the fp16 export on the GPU graph",
    )
    b.add_argument(
        "--checkpoint",
        help="the checkpoint, for the PyTorch reference paths (unbatched, batched, and "
        "torch.compile on the engine's batches: fp16 with --device cuda); an LLMLingua-2 checkpoint "
        "runs the compressor's benchmark instead: the engine against llmlingua's PromptCompressor on "
        "prompts made of --data's contexts (docs/performance.md)",
    )
    _add_compressor(b)
    b.add_argument(
        "--compile-backend",
        metavar="NAME",
        help="torch.compile's backend for the torch.compile path "
        "(default inductor; on the CPU that path runs only when this is given, as inductor compiles C++ "
        "for every batch shape there; aot_eager traces the model without generating code)",
    )
    b.add_argument(
        "--budget-s",
        type=_seconds,
        metavar="SECONDS",
        help="stop measuring after this many seconds: "
        "bench.json and bench.md then hold the repeats that ended, and say which paths were not "
        "measured (SIGTERM, e.g. from `timeout`, stops it the same way)",
    )
    _add_workload(b)
    _add_served(b)
    b.set_defaults(func=run)


def _add_compressor(b) -> None:
    """The LLMLingua-2 benchmark's own flags (an LLMLingua-2 --checkpoint)."""
    b.add_argument(
        "--auto-export",
        metavar="FOLDER",
        help="with an LLMLingua-2 --checkpoint: its `prune export --precision auto` folder (default: made "
        "in the run's folder from the fp32 export)",
    )
    b.add_argument(
        "--prompt-tokens",
        type=_concurrencies,
        metavar="N,N",
        help="with an LLMLingua-2 --checkpoint: the prompts' sizes in tiktoken tokens (default 2000,10000)",
    )
    b.add_argument(
        "--rate", type=float, help="with an LLMLingua-2 --checkpoint: compress_prompt's rate (default 0.33)"
    )


def _add_workload(b) -> None:
    """The workload and the run: queries, repeats, threads, which paths, where the report goes."""
    b.add_argument("--queries", type=positive_int, default=30, help="queries per path and repeat")
    b.add_argument(
        "--repeats", type=positive_int, default=3, help="interleaved repeats (medians are reported)"
    )
    add_setting(b, "threads")


def _add_served(b) -> None:
    """The served paths: Triton, the HTTP API, an existing deployment."""
    b.add_argument(
        "--triton",
        action="store_true",
        help="also serve the model with tritonserver and "
        "measure gRPC/HTTP at concurrency 1/4/16 and perf_analyzer",
    )
    b.add_argument(
        "--paths",
        help="only the paths whose names or ids match this regular expression "
        "(e.g. 'c16' for a focused comparison with more repeats; ids are the names in lower "
        "case with '-' for the rest: triton-text-grpc-c16-int8)",
    )
    b.add_argument(
        "--concurrencies",
        default="1,4,16",
        type=_concurrencies,
        help="client concurrencies of the concurrent paths and perf_analyzer (default 1,4,16)",
    )
    b.add_argument(
        "--text-instances",
        type=positive_int,
        default=4,
        help="instances of the served text model (default 4)",
    )
    b.add_argument("--no-perf-analyzer", action="store_true", help="skip perf_analyzer (with --triton)")
    b.add_argument(
        "--perf-analyzer-window",
        type=positive_int,
        default=8000,
        metavar="MS",
        help="perf_analyzer's measurement window (it takes 3 to 6 until they agree; default 8000 ms)",
    )
    b.add_argument(
        "--perf-analyzer",
        metavar="PATH",
        help="Triton's perf_analyzer binary (default: beside this "
        "Python, then on PATH; docs/installing.md says how to install it apart)",
    )
    b.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="with --triton: start this many servers and also measure one client over all of them",
    )
    b.add_argument(
        "--server",
        help="measure an existing Triton deployment: host:port (gRPC), its text model "
        "(--text-model) at concurrency 1/4/16; alone, only its paths run",
    )
    add_setting(b, "text_model")
    b.add_argument(
        "--api",
        help="measure an existing HTTP API (prune api, prune serve): its URL, TEI's /rerank "
        "at concurrency 1/4/16; alone, only its paths run",
    )
    b.add_argument(
        "--out", default="build/bench", help="folder for the bench-DATE results (default build/bench)"
    )
    b.add_argument(
        "--list",
        action="store_true",
        help="list the paths these flags make possible (id, group, name) and exit, measuring nothing",
    )


def _concurrencies(text: str) -> tuple[int, ...]:
    import argparse

    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def _seconds(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def run(args) -> int:
    """Run `prune bench`; the exit status."""
    from engine.bench.registry import registry, select
    from engine.bench.runner import bench
    from engine.bench.runs import Stop
    from engine.bench.session import BenchOptions
    from engine.bench.report import markdown, plot
    from engine.models.default_model import default_checkpoint, default_model_dir, ensure_default_model

    log = args.log
    # bad input is reported before any model is exported or loaded
    input_file(args.data, "--data")
    if args.checkpoint and not Path(args.checkpoint).is_dir():
        raise PruneError(f"--checkpoint {args.checkpoint}: no such folder")
    if args.checkpoint and is_lingua_checkpoint(args.checkpoint):
        return _compressor(args)
    given = [f for f, v in (("--auto-export", args.auto_export), ("--prompt-tokens", args.prompt_tokens),
                            ("--rate", args.rate)) if v is not None]  # fmt: skip
    if given:
        raise PruneError(f"{', '.join(given)}: for an LLMLingua-2 --checkpoint")
    for flag in ("peer_python", "perf_analyzer"):
        input_file(getattr(args, flag), "--" + flag.replace("_", "-"))
    if not args.list:
        output_folder(args.out, "--out")
        from engine.datafiles import load_rag_data

        load_rag_data(args.data, args.queries)  # the queries bench reads, checked
    if (
        args.device == "cuda" and not args.list
    ):  # the CUDA provider is checked before any export or measurement
        from engine.backends.onnxruntime import require_cuda

        require_cuda()

    def default(precision: str) -> Path:
        """The default model at `precision`: exported on first use, but not to be listed."""
        return default_model_dir(precision) if args.list else ensure_default_model(log, precision=precision)

    own = bool(args.model or args.fp16)  # the user's exports: no default model joins them
    models = {"fp32": Path(args.model)} if args.model else {} if args.fp16 else {"fp32": default("fp32")}
    if args.device == "cpu" and not own:  # what Pruner.load("default") gives a user here
        from engine.settings import setting

        models["default"] = default(setting("default_precision"))
    if args.device == "cpu" and (args.int8 or not own):
        models["int8"] = Path(args.int8) if args.int8 else default("int8")
    if args.fp16 or (args.device == "cuda" and not own):
        models["fp16"] = Path(args.fp16) if args.fp16 else default("fp16")
    if args.ov_int8:
        models["ov-int8"] = Path(args.ov_int8)
    checkpoint = args.checkpoint or (None if own else default_checkpoint())
    options = BenchOptions(
        models=models,
        data=Path(args.data),
        checkpoint=checkpoint,
        queries=args.queries,
        repeats=args.repeats,
        threads=args.threads,
        triton=args.triton,
        only=args.paths,
        concurrencies=args.concurrencies,
        text_instances=args.text_instances,
        perf=not args.no_perf_analyzer,
        perf_analyzer=args.perf_analyzer,
        perf_window_ms=args.perf_analyzer_window,
        replicas=args.replicas,
        device=args.device,
        server_url=args.server,
        text_model=args.text_model or "default_text",
        api_url=args.api,
        openvino=args.openvino or bool(args.ov_int8),
        serving=args.serving,
        peer_python=args.peer_python,
        budget_s=args.budget_s,
        compile_backend=args.compile_backend,
    )
    if args.list:  # nothing is exported, started or measured
        from engine.pipeline.spec import Manifest

        family = Manifest.read(models[options.base]).family if own else "embedding"  # the default model's
        for p in select(registry(options, family), args.paths):
            print(f"{p.id:48} {p.group:11} {p.name}")
        return 0
    out_dir = Path(args.out) / time.strftime("bench-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    with Stop(options.budget_s).on_signals() as stop:  # stopped early, it still writes what it measured
        report = bench(options, log=log, out_dir=out_dir, stop=stop)
        command = shlex.join(["prune", *sys.argv[1:]])
        report["command"] = command
        (out_dir / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
        text = markdown(report, command)
        (out_dir / "bench.md").write_text(text)
        plot(report, out_dir / "bench.png")
    print(text)
    print(
        f"wrote {out_dir}/bench.json, bench.md"
        + (", bench.png" if report["paths"] else "")
        + (f" (stopped early: {report['stopped']})" if report.get("stopped") else "")
    )
    return 0


#: prune bench's flags that measure a pruning model, not the compressor
_PRUNING_ONLY = ("int8", "openvino", "ov_int8", "peer_python", "compile_backend", "budget_s", "triton",
                 "server", "api")  # fmt: skip


def _compressor(args) -> int:
    """prune bench on an LLMLingua-2 checkpoint: the engine's Compressor against llmlingua's
    PromptCompressor (engine/bench/lingua.py); bench.json and bench.md in the run's folder."""
    from engine.bench.lingua import LinguaBenchOptions, bench_lingua, lingua_registry
    from engine.bench.registry import select

    given = ["--" + f.replace("_", "-") for f in _PRUNING_ONLY if getattr(args, f)]
    if given:
        raise PruneError(f"{', '.join(given)}: not for an LLMLingua-2 --checkpoint")
    if args.fp16 and args.device != "cuda":
        raise PruneError(
            "--fp16: with an LLMLingua-2 --checkpoint, for --device cuda (the GPU graph's export)"
        )
    if args.auto_export and args.device == "cuda":
        raise PruneError("--auto-export: the CPU's choice, not measured with --device cuda")
    if args.list:
        for p in select(lingua_registry(args.device), args.paths):
            print(f"{p.id:48} {p.group:11} {p.name}")
        return 0
    output_folder(args.out, "--out")
    if args.device == "cuda":  # the CUDA provider is checked before any export or measurement
        from engine.backends.onnxruntime import require_cuda

        require_cuda()
    for flag, folder in (("--model", args.model), ("--auto-export", args.auto_export), ("--fp16", args.fp16)):
        if folder and not (Path(folder) / "manifest.json").is_file():
            raise PruneError(f"{flag} {folder}: not an export (no manifest.json)")
    out_dir = Path(args.out) / time.strftime("bench-%Y%m%d-%H%M%S")
    try:
        options = LinguaBenchOptions(
            checkpoint=Path(args.checkpoint),
            data=Path(args.data),
            tokens=args.prompt_tokens or (2000, 10000),
            rate=0.33 if args.rate is None else args.rate,
            repeats=args.repeats,
            threads=args.threads,
            fp32=Path(args.model) if args.model else None,
            auto=Path(args.auto_export) if args.auto_export else None,
            exports=out_dir / "exports",
            only=args.paths,
            device=args.device,
            fp16=Path(args.fp16) if args.fp16 else None,
        )
    except ValueError as exc:
        raise PruneError(str(exc)) from None
    from engine.bench.harness import Study
    from engine.bench.lingua_report import markdown

    study = Study("bench", "engine.cli", command=shlex.join(["prune", *args.argv]))
    report = bench_lingua(options, log=args.log)
    lines = markdown(report, study.header("LLMLingua-2: the engine against llmlingua's PromptCompressor"))
    study.write(out_dir, report, lines)
    made = out_dir / "exports"
    print(
        f"wrote {out_dir}/bench.json, bench.md"
        + (f"; the exports made here: {made}" if made.is_dir() else "")
    )
    return 0
