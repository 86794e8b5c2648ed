"""`prune`: one command line with subcommands.

    prune export  --model CHECKPOINT --out build/provence
    prune run     --model build/provence --question "..." --context-file doc.txt
    prune index   --db rag.db --data docs.jsonl
    prune ask     --db rag.db --question "..."
    prune test-checkpoint --family all --out build/test-checkpoints
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from engine.errors import PruneError
from engine.families import FAMILIES
from engine.inputs import OPTION_NAMES, WINDOWS, CallOptions, option_choices, option_help, option_type
from engine.settings import SETTINGS, help_text, setting


def _setting(p, name: str, extra: str = "", **kwargs) -> None:
    """A flag from engine.settings: its default is the PRUNE_* variable when set, else the
    setting's default; its help says what it does, its variable and its default, once."""
    s = SETTINGS[name]
    if s.type is not str:
        kwargs.setdefault("type", s.type)
    if s.choices:
        kwargs.setdefault("choices", s.choices)
    p.add_argument(s.flag, default=setting(name), help=help_text(name, extra), **kwargs)


def _add_batching(p: argparse.ArgumentParser) -> None:
    _setting(p, "max_batch_tokens")
    _setting(p, "max_batch_size")
    _setting(p, "threads")


def _add_windows(p: argparse.ArgumentParser) -> None:
    p.add_argument("--windows", choices=list(WINDOWS),
                   help="how a long passage is cut: as the family's own code (reference: OpenSearch's 510-token "
                        "windows with stride 128 and a decision per window; OpenProvence's fragments of half "
                        "the window averaged without weights) or sentence-aligned blocks with one decision per "
                        "passage and token-weighted pieces (default: the family's own: " +
                        ", ".join(f"{f.name} {f.windows}" for f in FAMILIES.values()) + ")")


def _add_call_options(p: argparse.ArgumentParser) -> None:
    """One flag per option of a call (engine.inputs.CallOptions), with its own meaning;
    unset: the model's default."""
    for name in OPTION_NAMES:
        flag, kind, choices = "--" + name.replace("_", "-"), option_type(name), option_choices(name)
        if kind is bool:
            p.add_argument(flag, action="store_true", help=option_help(name))
        else:
            p.add_argument(flag, type=kind, choices=choices, help=option_help(name) + " (default: the model's)")


def _call_options(args) -> "CallOptions":
    """The CallOptions of `prune run`'s flags (checked: a bad value is an error before any
    model loads)."""
    return CallOptions.of(**{name: getattr(args, name) for name in OPTION_NAMES
                             if getattr(args, name) not in (None, False)})


def _batching(args):
    from engine.batching import BatchingConfig
    return BatchingConfig(max_batch_tokens=args.max_batch_tokens, max_batch_size=args.max_batch_size)


def _add_embedding_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("embedding family (sentence-embedding encoders)")
    g.add_argument("--embedding-mode", choices=["isolated", "passage", "full"],
                   help="what a sentence's tokens attend to (default isolated: each sentence alone)")
    g.add_argument("--similarity-scale", type=float, help="p = sigmoid(scale * (cos - shift)); default 8")
    g.add_argument("--similarity-shift", type=float, help="cosine that maps to p = 0.5; default 0.5")
    g.add_argument("--embedding-rerank", choices=["max", "mean"],
                   help="passage score: best sentence cosine (max) or cosine with the passage mean")


def _embedding_options(args) -> dict:
    return {k: v for k, v in {"mode": getattr(args, "embedding_mode", None),
                              "scale": getattr(args, "similarity_scale", None),
                              "shift": getattr(args, "similarity_shift", None),
                              "rerank": getattr(args, "embedding_rerank", None)}.items() if v is not None}


def cmd_export(args) -> int:
    if args.model == "default":
        from engine.default_model import default_checkpoint
        args.model = default_checkpoint()
    try:
        from export.embedder import export_encoder
        from export.onnx import export_model
    except ImportError as exc:
        raise PruneError(f"prune export needs PyTorch, transformers and onnx (missing here: {exc.name}): "
                         "pip install 'prune-engine[export]'") from exc
    if args.encoder:
        export_encoder(args.model, args.out, overwrite=args.overwrite, opset=args.opset, log=args.log)
        return 0
    export_model(args.model, args.out, family=args.family, tokenizer=args.tokenizer,
                 max_length=args.max_length, opset=args.opset, external_data=args.external_data,
                 verify=not args.no_verify, overwrite=args.overwrite, options=_embedding_options(args),
                 precision=args.precision, optimize=not args.no_optimize,
                 int8_weight_type=args.int8_weight_type, int8_per_channel=args.int8_per_channel,
                 tensorrt_graph=args.tensorrt,
                 log=args.log)
    if args.tensorrt:
        from export.tensorrt import export_tensorrt
        export_tensorrt(Path(args.out), precision="fp16" if args.precision == "fp32" else args.precision,
                        max_batch_size=args.max_batch_size,
                        log=args.log)
    return 0


def _read_contexts(args) -> list[str]:
    contexts = list(args.context or [])
    for f in args.context_file or []:
        path = Path(f)
        if str(f) == "-":
            contexts.append(sys.stdin.read())
            continue
        if not path.is_file():
            raise PruneError(f"--context-file {f}: no such file")
        contexts.append(path.read_text(encoding="utf-8"))
    for f in args.passages_file or []:
        contexts.extend(_read_passages_file(f))
    if not contexts:
        raise PruneError("give at least one --context, --context-file or --passages-file")
    return contexts


def _read_passages_file(name: str) -> list[str]:
    """The passages of a JSONL file: one a line, a JSON string or an object with `text`
    (what a retriever returns; `prune index --data` reads the same)."""
    from engine.tools.quality import _read_jsonl
    out = []
    try:
        for n, row in enumerate(_read_jsonl(name), 1):
            text = row.get("text") if isinstance(row, dict) else row
            if not isinstance(text, str):
                raise ValueError(f"{name}: record {n}: expected a JSON string or an object with a text string")
            out.append(text)
    except (FileNotFoundError, ValueError) as exc:
        raise PruneError(f"--passages-file: {exc}") from None
    if not out:
        raise PruneError(f"--passages-file {name}: no passages")
    return out


def _model_path(args) -> str:
    """--model, or the default model: exported (onnxruntime) or its checkpoint (torch)."""
    if args.model and args.model != "default":
        return args.model
    from engine.default_model import default_checkpoint, ensure_default_model
    return default_checkpoint() if args.backend == "torch" else str(ensure_default_model(args.log))


def cmd_run(args) -> int:
    from engine.pruner import Pruner
    # bad input is reported before any model loads
    options = _call_options(args)
    if args.input:
        if args.question or args.context or args.context_file or args.passages_file:
            raise PruneError("--input takes the questions and passages from the file: "
                             "drop --question/--context/--context-file/--passages-file")
        if args.input != "-" and not Path(args.input).is_file():
            raise PruneError(f"--input {args.input}: no such file")
    else:
        if args.question is None:
            raise PruneError("give --question (with --context/--context-file/--passages-file), or --input FILE.jsonl")
        contexts = _read_contexts(args)
        if not args.question.strip():
            raise PruneError("question is empty")
    t0 = time.perf_counter()
    if args.server:
        name = args.server_model or "default_text"
        args.log(f"connecting to model {name!r} on the Triton server at {args.server} ({args.protocol}; "
                 "waiting up to 10 s for it to be ready) ...")
        pruner = Pruner.connect(args.server, name, protocol=args.protocol, tokenizer=args.model,
                                batching=_batching(args), timeout=args.timeout)
        args.model = f"{args.protocol}://{args.server}/{name}"
    else:
        args.model = _model_path(args)
        pruner = Pruner.load(args.model, backend=args.backend, family=args.family, threads=args.threads,
                             batching=_batching(args), device=args.device, tensorrt=args.trt_provider,
                             log=args.log, dtype=args.dtype, attn=args.attn)
    t_load = time.perf_counter() - t0
    if args.input:
        return _run_file(pruner, args, options)
    t1 = time.perf_counter()
    results = pruner.prune(args.question, contexts, options)
    t_run = time.perf_counter() - t1
    if args.json:
        print(json.dumps([r.to_dict() for r in results], ensure_ascii=False, indent=2))
        return 0
    fam = pruner.family
    print(f"# model {args.model} ({fam.name}, {pruner.describe()}); loaded in {t_load:.2f} s, "
          f"pruned {len(results)} passage(s) in {t_run * 1000:.0f} ms")
    for r in results:
        score = "n/a" if r.reranking_score is None else f"{r.reranking_score:.4f}"
        kept = sum(s.kept for s in r.sentences)
        print(f"\n## passage {r.index}: reranking_score {score}, kept {kept}/{len(r.sentences)} sentences, "
              f"compression {r.compression_rate:.0%}, threshold {r.threshold}"
              + (f", lexical_weight {r.lexical_weight}" if r.lexical_weight else "") + f", blocks {r.blocks}"
              + (f" ({r.windows} windows)" if r.windows != "sentences" else ""))
        if args.highlight:
            print(r.highlight(args.pre, args.post))
        elif r.sentences and not kept and not args.verbose:
            print("  (nothing kept; -v lists its sentences)")
        else:
            for s in r.sentences:
                print(f"  [{'x' if s.kept else ' '}] {s.probability:.3f}  {s.text[:100]}")
            print("\npruned_context:\n" + r.pruned_context)
    return 0


def _pipeline(args):
    from engine.rag.pipeline import Pipeline
    return Pipeline(args.db, collection=args.collection, token=args.token or os.environ.get("MILVUS_TOKEN"),
                    log=args.log)


def _load_models(args, pipe, with_pruner: bool) -> None:
    from engine.rag.embedder import Embedder
    if getattr(args, "mode", "hybrid") != "bm25":
        pipe.embedder = Embedder.load(args.encoder, threads=args.threads, log=args.log)
    if with_pruner:
        from engine.pruner import Pruner
        if args.server:
            pipe.pruner = Pruner.connect(args.server, args.server_model or "default_text", protocol=args.protocol,
                                         timeout=args.timeout)
        else:
            args.backend = "onnxruntime"
            pipe.pruner = Pruner.load(_model_path(args), threads=args.threads, log=args.log)


def cmd_index(args) -> int:
    from engine.rag.pipeline import read_documents
    docs = read_documents(args.data)      # bad input is reported before any model loads
    with _pipeline(args) as pipe:
        _load_models(args, pipe, with_pruner=False)
        report = pipe.index(docs, chunk_tokens=args.chunk_tokens, overwrite=args.overwrite)
    print(f"indexed {report.documents} documents as {report.chunks} chunks into {report.db} "
          f"(collection {report.collection!r}) in {report.seconds:.1f} s "
          f"({report.embed_seconds:.1f} s embedding)")
    return 0


def cmd_ask(args) -> int:
    if not args.question or not args.question.strip():
        raise PruneError("--question is empty")
    with _pipeline(args) as pipe:
        pipe.about()                      # a missing database or collection fails before models load
        _load_models(args, pipe, with_pruner=True)
        answer = pipe.ask(args.question, k=args.k, candidates=args.candidates, mode=args.mode,
                          threshold=args.threshold, pre=args.pre, post=args.post, rerank=not args.no_rerank)
    if args.json:
        print(json.dumps(answer.to_dict(), ensure_ascii=False, indent=2))
        return 0
    t = answer.timings_ms
    print(f"# {len(answer.results)} of {answer.candidates} {answer.mode} candidates, "
          f"{'reranked and pruned' if answer.reranked else 'pruned (Milvus order)'} "
          f"(embed {t.get('embed', 0):.0f} ms, retrieve {t['retrieve']:.0f} ms, "
          f"rerank+prune {t['rerank_prune']:.0f} ms)")
    for i, r in enumerate(answer.results, 1):
        kept = sum(s.kept for s in r.result.sentences)
        print(f"\n## [{i}] {r.id}#{r.chunk}: reranking_score {r.reranking_score:.4f}, retrieval rank "
              f"{r.retrieval_rank}, kept {kept}/{len(r.result.sentences)} sentences")
        print(r.highlighted)
    print("\n# pruned context:\n" + answer.context())
    return 0


def cmd_eval(args) -> int:
    from engine.tools.quality import domain_table, evaluate, rag_table, rerank_table, table, write_report
    from engine.default_model import ensure_default_model
    from engine.pruner import Pruner
    models = {}
    for m in args.model or [None]:
        path = m or str(ensure_default_model(args.log))
        name = Path(path).name if m else "all-MiniLM-L6-v2 (default)"
        models[name] = Pruner.load(path, threads=args.threads, batching=_batching(args))
    if not args.data and not args.rag_data:
        raise PruneError("give --data (sentence labels) and/or --rag-data (reranking)")
    report = evaluate(models, args.data, args.rag_data, limit=args.limit, rag_limit=args.rag_limit,
                      progress=not (args.no_progress or args.quiet), log=args.log, windows=args.windows)
    rows = report.get("_rows")
    if rows:
        print(table(rows))
    if (report.get("pruning") or {}).get("by_domain"):
        print()
        print(domain_table(report["pruning"]["by_domain"]))
    if report.get("rag"):
        print()
        print(rag_table(report["rag"]["metrics"]))
    if report.get("reranking"):
        print()
        print(rerank_table(report["reranking"]["metrics"]))
    if args.out:
        paths = write_report(report, args.out, "Quality evaluation", shlex.join(["prune", *sys.argv[1:]]))
        print("\n" + "\n".join(f"wrote {p}" for p in paths.values()))
    return 0


def cmd_fidelity(args) -> int:
    from engine.tools.fidelity import format_report, load_docs, measure, save
    from engine.pruner import Pruner
    candidate = Pruner.load(args.model, threads=args.threads, batching=_batching(args))
    manifest = json.loads((Path(args.model) / "manifest.json").read_text())
    source = args.reference or manifest["source"]["checkpoint"]
    if not args.reference and not Path(source).exists() and (Path(source).is_absolute() or source.startswith(".")
                                                            or len(Path(source).parts) != 2):
        raise PruneError(f"the reference checkpoint {source!r} (the export's source, from its manifest) is not "
                         "there; pass --reference CHECKPOINT (the checkpoint the model was exported from)")
    reference = Pruner.load(source, backend="torch",
                            family=manifest["family"], threads=args.threads, batching=_batching(args),
                            options={k: v for k, v in manifest.get("options", {}).items()
                                     if k in ("mode", "scale", "shift", "rerank", "pooling")})
    docs = load_docs(args.data, args.limit)
    rep = measure(candidate, reference, docs, progress=not (args.no_progress or args.quiet),
                  log=args.log, windows=args.windows)
    rep.update(model=args.model, precision=manifest.get("precision"), data=args.data)
    print(format_report(f"{Path(args.model).name} ({manifest.get('precision')}, windows {rep['windows']})", rep))
    if args.out:
        save(rep, args.out)
        print(f"wrote {args.out}")
    return 0


def cmd_repository(args) -> int:
    from export.triton import RepositoryOptions, build_repository
    from engine.default_model import ensure_default_model
    is_default = args.model in (None, "default")
    model = str(ensure_default_model(args.log)) if is_default else args.model
    opts = RepositoryOptions(target=args.target, name=args.name or ("default" if is_default else None),
                             max_batch_size=args.max_batch_size, max_batch_tokens=args.max_batch_tokens,
                             max_queue_delay_us=args.max_queue_delay_us,
                             preferred_batch_sizes=args.preferred_batch_sizes, instances=args.instances,
                             intra_op_threads=args.intra_op_threads or 0, trt_accelerator=args.trt_accelerator,
                             text_model=not args.no_text_model, text_instances=args.text_instances,
                             text_max_passages=args.text_max_passages, text_max_chars=args.text_max_chars,
                             overwrite=args.overwrite, ort_arena=args.ort_arena,
                             join_requests=args.join_requests)
    build_repository(model, args.out, opts, log=args.log)
    return 0


def _run_file(pruner, args, options: CallOptions) -> int:
    from engine.tools.batchfile import run_file
    source = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    sink = sys.stdout if args.output in (None, "-") else open(args.output, "w", encoding="utf-8")
    try:
        stats = run_file(pruner, source, sink, group=args.group, progress=not args.quiet, options=options)
    finally:
        if source is not sys.stdin:
            source.close()
        if sink is not sys.stdout:
            sink.close()
    return 0 if stats["errors"] == 0 else 3


class _Stop(Exception):
    """A termination signal reached `prune serve`."""


def _api_imports():
    try:
        import uvicorn
        from engine.http.app import ApiConfig, create_app
    except ImportError as exc:
        raise PruneError(f"the HTTP API needs FastAPI and uvicorn (missing here: {exc.name}): "
                         "pip install 'prune-engine[api]'") from exc
    return uvicorn, ApiConfig, create_app


def _api_app(args, pruner, label: str, remote: bool):
    _, ApiConfig, create_app = _api_imports()
    workers = args.workers or (16 if remote else 1)
    config = ApiConfig(api_key=args.api_key, workers=workers, max_concurrent=args.max_concurrent,
                       request_timeout=args.request_timeout, max_body_bytes=args.max_body_bytes, model_name=label)
    return create_app(pruner, config)


def cmd_api(args) -> int:
    uvicorn, _, _ = _api_imports()
    from engine.pruner import Pruner
    if args.server:
        name = args.text_model or "default_text"
        args.log(f"connecting to the text model {name!r} on {args.server} (gRPC) ...")
        pruner = Pruner.connect(args.server, name, timeout=args.request_timeout)
        label = f"{name}@{args.server}"
    else:
        model = _model_path(args)
        pruner = Pruner.load(model, threads=args.threads, batching=_batching(args))
        label = Path(model).name if args.model and args.model != "default" else "default"
    app = _api_app(args, pruner, label, remote=bool(args.server))
    args.log(f"prune api: {label} ({pruner.family.name}, {pruner.describe()}) on http://{args.host}:{args.port}"
             + ("" if args.api_key else "; no API key"))
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning" if args.quiet else "info",
                    timeout_graceful_shutdown=int(args.request_timeout))
    finally:
        pruner.close()
    return 0


def _text_model(args) -> str | None:
    """The text model the API of `prune serve` fronts: --text-model, or the repository's
    only `<name>_text` model; None (no API) when the repository has none and the API was
    not asked for by name."""
    if args.text_model:
        if not (Path(args.model_repository) / args.text_model / "config.pbtxt").is_file():
            raise PruneError(f"{args.model_repository}: no model {args.text_model!r} (--text-model)")
        return args.text_model
    names = sorted(p.parent.name for p in Path(args.model_repository).glob("*_text/config.pbtxt"))
    if len(names) > 1:
        raise PruneError(f"{args.model_repository} holds {len(names)} text models ({', '.join(names)}): "
                         "name the one the HTTP API serves with --text-model, or --api-port 0")
    return names[0] if names else None


def cmd_serve(args) -> int:
    import signal as _signal
    from engine.triton.server import TritonServer

    def on_signal(signum, frame):
        raise _Stop(_signal.Signals(signum).name)

    text_model = _text_model(args) if args.api_port else None
    if args.api_port and text_model is None:
        args.log(f"prune serve: {args.model_repository} has no text model (prune repository writes one unless "
                 "--no-text-model): no HTTP API")
    if text_model:
        try:
            _api_imports()
        except PruneError as exc:
            args.log(f"prune serve: {exc}: no HTTP API (--api-port 0 says so without this note)")
            text_model = None
    api_on = text_model is not None
    triton_host = args.triton_host or ("127.0.0.1" if api_on else args.host)
    server = TritonServer(args.model_repository, host=triton_host, http_port=args.http_port,
                          grpc_port=args.grpc_port, metrics_port=args.metrics_port, forward_logs=not args.quiet,
                          admin_key=args.admin_key, restrict_admin=not args.open_admin_apis,
                          http=args.triton_http == "on")
    # SIGTERM (systemd, Kubernetes, docker stop) and SIGHUP stop the server exactly as Ctrl-C does.
    previous = {s: _signal.signal(s, on_signal) for s in (_signal.SIGTERM, _signal.SIGHUP)}
    why = None
    restarts: list[float] = []
    api = pruner = None
    try:
        server.start(timeout=args.ready_timeout)
        stubs = len(server.stub_pids())
        http = f"HTTP {server.http_url}" if server.http else "HTTP off"
        print(f"tritonserver ready: gRPC {server.grpc_url}  {http}  metrics {server.metrics_url}"
              "  (Ctrl-C stops)", flush=True)
        if text_model:
            from engine.http.server import ApiThread
            from engine.pruner import Pruner
            pruner = Pruner.connect(server.grpc_url, text_model, timeout=args.request_timeout)
            api = ApiThread(_api_app(args, pruner, text_model, remote=True), args.host, args.api_port,
                            log_level="warning" if args.quiet else "info", graceful_s=args.request_timeout).start()
            print(f"HTTP API ready: {api.url} ({text_model}; TEI /rerank, Cohere /v1/rerank /v2/rerank, "
                  "/v1/prune, /health, /docs)" + ("" if args.api_key else "; no API key"), flush=True)
        while True:
            time.sleep(0.5)
            if api and not api.alive():
                print("prune serve: the HTTP API stopped", file=sys.stderr, flush=True)
                break
            problem = server.health_problem(stubs)
            if problem is None:
                continue
            # Supervision: a server that died (one malformed request can abort tritonserver
            # 2.51) or lost a stub (its model fails every request while "ready") is restarted.
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < 60] + [now]
            if args.no_restart or len(restarts) > args.max_restarts:
                print(f"prune serve: {problem}" + ("" if args.no_restart else
                      f"; more than {args.max_restarts} restarts in a minute: giving up"), file=sys.stderr, flush=True)
                break
            args.log(f"prune serve: {problem}: restarting tritonserver")
            server.stop(timeout=5)
            server.start(timeout=args.ready_timeout)
            stubs = len(server.stub_pids())
            args.log(f"prune serve: tritonserver ready again (restart {len(restarts)} in the last minute)")
    except KeyboardInterrupt:
        why = "SIGINT"
    except _Stop as stop:
        why = str(stop)
    finally:
        for s, h in previous.items():
            _signal.signal(s, h)
        if api:             # the API drains first: its requests in flight still reach Triton
            api.stop()
        if pruner:
            pruner.close()
        clean = server.stop()
    if why is None:   # the server failed and was not (or no longer) restarted
        return 1
    args.log(f"prune serve: {why}: " + ("the HTTP API and " if api else "") + "tritonserver "
             + ("drained and stopped" if clean else "did not stop in time and was killed"))
    return 0 if clean else 1


def cmd_bench(args) -> int:
    from engine.tools.bench import bench, markdown, plot
    from engine.default_model import default_checkpoint, ensure_default_model
    log = args.log
    if args.device == "cuda":   # the CUDA provider is checked before any export or measurement
        from engine.backends.onnxruntime import require_cuda
        require_cuda()
    models = {"fp32": Path(args.model) if args.model else ensure_default_model(log)}
    if args.device == "cpu" and (args.int8 or not args.model):
        models["int8"] = Path(args.int8) if args.int8 else ensure_default_model(log, precision="int8")
    if args.fp16 or (args.device == "cuda" and not args.model):
        models["fp16"] = Path(args.fp16) if args.fp16 else ensure_default_model(log, precision="fp16")
    checkpoint = args.checkpoint or (None if args.model else default_checkpoint())
    out_dir = Path(args.out) / time.strftime("bench-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    report = bench(models, checkpoint, Path(args.data), args.queries, args.repeats, args.threads,
                   args.triton, log=log, out_dir=out_dir, only=args.paths, text_instances=args.text_instances,
                   perf=not args.no_perf_analyzer, replicas=args.replicas, device=args.device)
    command = shlex.join(["prune", *sys.argv[1:]])
    report["command"] = command
    (out_dir / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report, command)
    (out_dir / "bench.md").write_text(text)
    plot(report, out_dir / "bench.png")
    print(text)
    print(f"wrote {out_dir}/bench.json, bench.md, bench.png")
    return 0


def cmd_test_checkpoint(args) -> int:
    from engine.families import FAMILIES
    from export.checkpoints import make_test_checkpoint
    names = list(FAMILIES) if args.family == "all" else [args.family]
    if args.backbone and names != ["open_provence"]:
        raise PruneError("--backbone modernbert is for --family open_provence")
    for name in names:
        out = Path(args.out) / name if args.family == "all" else Path(args.out)
        make_test_checkpoint(name, out, seed=args.seed, backbone=args.backbone)
        print(f"wrote {out} (random weights: outputs are meaningless)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    import engine
    p = argparse.ArgumentParser(prog="prune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"prune-engine {engine.__version__}")
    # also before the subcommand (`prune -q run ...`); own names, or the subcommand's defaults win
    top = p.add_mutually_exclusive_group()
    top.add_argument("-q", "--quiet", dest="top_quiet", action="store_true", help="as the subcommands' --quiet")
    top.add_argument("-v", "--verbose", dest="top_verbose", action="store_true", help="as the subcommands' --verbose")
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    loud = common.add_argument_group("output").add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true",
                      help="nothing on stderr but errors: no progress, notes or server logs")
    loud.add_argument("-v", "--verbose", action="store_true",
                      help="more on stderr: Python logging at DEBUG and a traceback with every error")
    _add = sub.add_parser

    def add_parser(name, **kwargs):   # every subcommand's help shows the defaults, once
        return _add(name, formatter_class=_HelpFormatter, parents=[common], **kwargs)
    sub.add_parser = add_parser  # type: ignore[method-assign]

    e = sub.add_parser("export", help="checkpoint -> ONNX graph + tokenizer + manifest, checked against PyTorch")
    e.add_argument("--model", required=True, help="checkpoint folder, hub id, or 'default' (all-MiniLM-L6-v2)")
    e.add_argument("--out", required=True, help="output folder")
    e.add_argument("--family", help=f"override the detected family: {', '.join(FAMILIES)} (zilliz: open_provence)")
    e.add_argument("--tokenizer", help="tokenizer folder or hub id, if the checkpoint has none")
    e.add_argument("--max-length", type=int, help="model window in tokens (default: 512, or the checkpoint's if "
                   "shorter; at most what its position embeddings allow, e.g. 8192 for BGE-M3-based models)")
    e.add_argument("--opset", type=int, default=17, help="ONNX opset of the exported graph")
    e.add_argument("--external-data", choices=["auto", "always", "never"], default="auto",
                   help="store weights beside the graph (auto: when over 2 GB)")
    e.add_argument("--no-verify", action="store_true", help="skip the parity check against PyTorch")
    e.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    e.add_argument("--precision", choices=["fp32", "int8", "fp16"], default="fp32",
                   help="int8: dynamic quantization for CPUs; fp16: for GPUs (float32 I/O, softmax, pooling)")
    e.add_argument("--no-optimize", action="store_true", help="skip ONNX Runtime's transformer optimizer")
    e.add_argument("--int8-weight-type", choices=["QInt8", "QUInt8"], default="QInt8",
                   help="weight type of the INT8 graph (default chosen by measured fidelity, docs/precisions.md)")
    e.add_argument("--int8-per-tensor", dest="int8_per_channel", action="store_false",
                   help="one scale per weight tensor instead of per output channel")
    e.add_argument("--tensorrt", action="store_true",
                   help="also build a TensorRT plan (needs TensorRT: NVIDIA's TensorRT or Triton container); "
                        "writes build_tensorrt.sh either way")
    e.add_argument("--max-batch-size", type=int, default=64, help="largest batch of the TensorRT profiles")
    e.add_argument("--encoder", action="store_true",
                   help="export a sentence-embedding checkpoint's text encoder for retrieval (prune index "
                        "--encoder) instead of a pruning model")
    _add_embedding_options(e)
    e.set_defaults(func=cmd_export)

    r = sub.add_parser("run", help="prune passages for a question")
    r.add_argument("--model", help="exported folder (onnxruntime) or checkpoint (--backend torch), or 'default' "
                                    "(all-MiniLM-L6-v2, exported on first use); default: 'default'")
    r.add_argument("--backend", choices=["onnxruntime", "torch"], default="onnxruntime",
                   help="onnxruntime: an exported folder; torch: a checkpoint (the fp32 reference)")
    r.add_argument("--server", help="a Triton server, host:port (gRPC 8001 or HTTP 8000) instead of in-process; "
                   "several replicas (gRPC): host1:8001,host2:8001 or dns:///name:8001")
    r.add_argument("--server-model", help="the model's name in the server's repository (default: 'default_text', "
                   "the default model's text model; a core model name makes this client tokenize)")
    r.add_argument("--protocol", choices=["grpc", "http"], default="grpc", help="how to reach --server")
    _setting(r, "timeout")
    r.add_argument("--family", help="family override for --backend torch")
    r.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: ONNX Runtime's CUDA provider with IO binding (pip install 'prune-engine[gpu]'), "
                        "or torch on the GPU")
    r.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32",
                   help="--backend torch: the weights' and activations' type (float16/bfloat16 on a GPU)")
    r.add_argument("--attn", choices=["eager", "sdpa"], default="eager",
                   help="--backend torch: attention implementation (sdpa: XLM-R and BERT backbones)")
    r.add_argument("--trt-provider", action="store_true",
                   help="with --device cuda: ONNX Runtime's TensorRT provider first (fp16; engines cached in "
                        "the model folder's trt-cache/), the CUDA provider where it is absent")
    r.add_argument("--question", help="the question the passages are pruned for")
    r.add_argument("--context", action="append", help="a passage (repeatable)")
    r.add_argument("--context-file", action="append", help="a file holding one passage; - for stdin (repeatable)")
    r.add_argument("--passages-file", action="append",
                   help="a JSONL file of passages, one a line: a JSON string or an object with text (repeatable)")
    _add_call_options(r)
    r.add_argument("--json", action="store_true", help="print results as JSON")
    r.add_argument("--highlight", action="store_true", help="print passages with kept sentences tagged")
    r.add_argument("--input", help="a JSONL file of queries (question, passages or context, optional id, "
                   "threshold, title, alpha, top_k, windows, lexical_weight, passage_margin), - for stdin; one result line per input line")
    r.add_argument("--output", help="where the JSONL results go with --input (default: stdout)")
    r.add_argument("--group", type=int, default=64,
                   help="queries read, batched together and written at a time with --input (bounds memory)")
    r.add_argument("--pre", default="<em>", help="tag before a kept sentence (--highlight)")
    r.add_argument("--post", default="</em>", help="tag after a kept sentence (--highlight)")
    _add_batching(r)
    r.set_defaults(func=cmd_run)

    v = sub.add_parser("eval", help="sentence-level P/R/F1 (grid search) and reranking MRR, with baselines")
    v.add_argument("--model", action="append", help="exported model folder (repeatable; default: the default model)")
    v.add_argument("--data", help="JSONL with question, context, sentences, labels")
    v.add_argument("--rag-data", help="JSONL with question, passages, gold (an index or a list of them): what "
                   "each model keeps of a RAG call's passages at its defaults, and reranking MRR")
    v.add_argument("--limit", type=int, help="first N documents of --data")
    v.add_argument("--rag-limit", type=int, help="first N queries of --rag-data")
    v.add_argument("--out", help="folder for eval.json, eval.md and pr_curve.png")
    v.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_windows(v)
    _add_batching(v)
    v.set_defaults(func=cmd_eval)

    f = sub.add_parser("fidelity", help="compare an exported precision with the fp32 PyTorch reference")
    f.add_argument("--model", required=True, help="exported folder (any precision)")
    f.add_argument("--reference", help="the checkpoint (default: the manifest's source)")
    f.add_argument("--data", required=True, help="JSONL: sentence-labelled (context, sentences) or RAG (passages)")
    f.add_argument("--limit", type=int, help="first N documents")
    f.add_argument("--out", help="write the report as JSON here")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_windows(f)
    _add_batching(f)
    f.set_defaults(func=cmd_fidelity)

    g = sub.add_parser("repository", help="exported model -> Triton model repository")
    g.add_argument("--model", help="exported model folder (default: the default model)")
    g.add_argument("--out", required=True, help="the model repository folder")
    g.add_argument("--target", choices=["cpu", "gpu-onnx", "gpu-tensorrt"], default="cpu",
                   help="cpu: python backend running ONNX Runtime; gpu-onnx / gpu-tensorrt: NVIDIA's container")
    g.add_argument("--name", help="model name in the repository (default: the folder's name)")
    _setting(g, "max_batch_size", "; here the largest batch the core model accepts")
    _setting(g, "max_batch_tokens", "; here the budget the preferred batch sizes are derived from")
    g.add_argument("--max-queue-delay-us", type=int, default=2000,
                   help="how long the dynamic batcher waits to fill a batch")
    g.add_argument("--preferred-batch-sizes", type=int, nargs="+",
                   help="dynamic batcher's preferred sizes (default: derived from --max-batch-tokens)")
    g.add_argument("--instances", type=int, default=1, help="model instances")
    g.add_argument("--intra-op-threads", type=int, help="ONNX Runtime threads per instance (cpu target)")
    _setting(g, "ort_arena", "; cpu target")
    _setting(g, "join_requests")
    g.add_argument("--trt-accelerator", action="store_true",
                   help="gpu-onnx: ONNX Runtime's TensorRT execution accelerator, fp16")
    g.add_argument("--overwrite", action="store_true", help="replace models of the same name in --out")
    t = g.add_argument_group("text model <name>_text (text in, pruned text out; python backend on CPU)")
    t.add_argument("--no-text-model", action="store_true", help="write only the core model")
    t.add_argument("--text-instances", type=int, default=4,
                   help="text-model instances: text requests served at once (default 4)")
    _setting(t, "text_max_passages")
    _setting(t, "text_max_chars")
    g.set_defaults(func=cmd_repository)

    h = sub.add_parser("api", help="the HTTP API: TEI and Cohere rerank, /v1/prune (in-process or a Triton text model)")
    h.add_argument("--model", help="exported folder, or 'default' (all-MiniLM-L6-v2, exported on first use); "
                                   "default: 'default'")
    h.add_argument("--server", help="a Triton server's gRPC address, host:port (several replicas: comma-separated "
                                    "or dns:///name:port), instead of an in-process model")
    _setting(h, "text_model")
    _setting(h, "host")
    _setting(h, "port")
    _setting(h, "api_key")
    _setting(h, "workers")
    _setting(h, "max_concurrent")
    _setting(h, "request_timeout")
    _setting(h, "max_body_bytes")
    _add_batching(h)
    h.set_defaults(func=cmd_api, backend="onnxruntime")

    s = sub.add_parser("serve", help="start a local tritonserver on a model repository, with the HTTP API in front")
    s.add_argument("--model-repository", required=True, help="the folder `prune repository` wrote")
    _setting(s, "host")
    _setting(s, "triton_host")
    _setting(s, "http_port")
    _setting(s, "grpc_port")
    _setting(s, "metrics_port")
    _setting(s, "triton_http")
    s.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to wait for readiness (default 120)")
    _setting(s, "admin_key")
    s.add_argument("--no-restart", action="store_true",
                   help="exit when the server dies or a model's stub dies, instead of restarting it")
    _setting(s, "max_restarts")
    s.add_argument("--open-admin-apis", action="store_true",
                   help="leave those APIs open to every client (not recommended beyond loopback)")
    api = s.add_argument_group("the HTTP API (prune api's, in front of the served text model)")
    _setting(api, "api_port")
    for name in ("text_model", "api_key", "workers", "max_concurrent", "request_timeout", "max_body_bytes"):
        _setting(api, name)
    s.set_defaults(func=cmd_serve)

    b = sub.add_parser("bench", help="speed of every path side by side on the RAG workload")
    b.add_argument("--data", required=True, help="RAG JSONL (question, passages)")
    b.add_argument("--model", help="exported fp32 folder (default: the default model)")
    b.add_argument("--int8", help="exported int8 folder (default: the default model's, exported on first use)")
    b.add_argument("--fp16", help="exported fp16 folder (default with --device cuda: the default model's, "
                   "exported on first use)")
    b.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: PyTorch fp32/fp16 and ONNX Runtime's CUDA provider (fp32, fp16) on the GPU "
                        "(pip install 'prune-engine[gpu]')")
    b.add_argument("--checkpoint", help="the checkpoint, for the PyTorch reference paths")
    b.add_argument("--queries", type=int, default=30, help="queries per path and repeat")
    b.add_argument("--repeats", type=int, default=3, help="interleaved repeats (medians are reported)")
    b.add_argument("--threads", type=int, help="intra-op threads (default: all cores)")
    b.add_argument("--triton", action="store_true", help="also serve the model with tritonserver and "
                   "measure gRPC/HTTP at concurrency 1/4/16 and perf_analyzer")
    b.add_argument("--paths", help="only the paths whose names match this regular expression "
                   "(e.g. 'c16' for a focused comparison with more repeats)")
    b.add_argument("--text-instances", type=int, default=4, help="instances of the served text model (default 4)")
    b.add_argument("--no-perf-analyzer", action="store_true", help="skip perf_analyzer (with --triton)")
    b.add_argument("--replicas", type=int, default=1,
                   help="with --triton: start this many servers and also measure one client over all of them")
    b.add_argument("--out", default="benchmarks/results", help="folder for the bench-DATE results")
    b.set_defaults(func=cmd_bench)


    def add_db(x):
        x.add_argument("--db", required=True, help="a Milvus Lite file (created by prune index), or a Milvus "
                       "server's URI (http://host:19530)")
        x.add_argument("--collection", default="passages", help="the collection's name")
        x.add_argument("--token", help="a Milvus server's token, user:password (env MILVUS_TOKEN)")
        x.add_argument("--encoder", default="default", help="exported encoder folder (prune export --encoder), "
                       "or 'default' (all-MiniLM-L6-v2's, exported on first use)")
        x.add_argument("--threads", type=int, help="intra-op threads of ONNX Runtime")

    ix = sub.add_parser("index", help="chunk, embed and store documents in Milvus (dense + BM25) for prune ask")
    add_db(ix)
    ix.add_argument("--data", required=True, help="JSONL documents: id and text, other fields kept as metadata")
    _setting(ix, "chunk_tokens", "; a longer sentence is cut")
    ix.add_argument("--overwrite", action="store_true", help="rebuild an existing collection")
    ix.set_defaults(func=cmd_index)

    a = sub.add_parser("ask", help="retrieve (hybrid), rerank, prune and highlight for a question")
    add_db(a)
    a.add_argument("--question", required=True, help="the question")
    _setting(a, "k", ", best reranking score first")
    _setting(a, "candidates")
    a.add_argument("--mode", choices=["hybrid", "dense", "bm25"], default="hybrid",
                   help="retrieval: dense + BM25 fused by Milvus (RRF), or one of them")
    a.add_argument("--model", help="the pruning model: exported folder or 'default'; default: 'default'")
    a.add_argument("--server", help="a Triton server running the pruning model (host:port) instead of in-process")
    a.add_argument("--server-model", help="the model's name on --server (default: 'default_text')")
    a.add_argument("--protocol", choices=["grpc", "http"], default="grpc", help="how to reach --server")
    _setting(a, "timeout")
    a.add_argument("--threshold", type=float, help="keep threshold (default: the model's)")
    a.add_argument("--no-rerank", action="store_true", help="keep Milvus's order instead of the pruner's "
                   "reranking score (only the k returned are pruned)")
    a.add_argument("--json", action="store_true", help="print one JSON object: results with sources, context, timings")
    a.add_argument("--pre", default="<em>", help="tag before a kept sentence")
    a.add_argument("--post", default="</em>", help="tag after a kept sentence")
    a.set_defaults(func=cmd_ask)

    t = sub.add_parser("test-checkpoint", help="write tiny random-weight checkpoints with the real layouts")
    t.add_argument("--family", default="all", help="a family name, or all")
    t.add_argument("--out", required=True, help="output folder (one subfolder per family with --family all)")
    t.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    t.add_argument("--backbone", choices=["modernbert"],
                   help="with --family open_provence: a ModernBERT backbone instead of XLM-RoBERTa")
    t.set_defaults(func=cmd_test_checkpoint)
    return p


def _logger(args):
    if args.quiet:
        return lambda m: None
    return lambda m: print(m, file=sys.stderr, flush=True)


class _HelpFormatter(argparse.HelpFormatter):
    """Adds "(default: X)" to a flag's help only where the help does not say its default
    already and there is one worth saying (not None, not a switch's True/False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or isinstance(default, bool) or default is argparse.SUPPRESS
                or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
    except PruneError as exc:   # a PRUNE_* variable that does not parse
        print(f"prune: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    args.quiet = args.quiet or args.top_quiet
    args.verbose = args.verbose or args.top_verbose
    if args.quiet and args.verbose:
        print(f"prune {args.command}: error: --quiet and --verbose exclude each other", file=sys.stderr)
        return 2
    args.log = _logger(args)
    if args.verbose:
        import logging
        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return args.func(args)
    except BrokenPipeError:
        # the reader went away (`prune run --json | head`): end quietly, as Unix tools do
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except (PruneError, ValueError) as exc:   # ValueError: invalid batching settings and the like
        if args.verbose:
            import traceback
            traceback.print_exc()
        print(f"prune {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
