"""`prune api`: the HTTP API in front of an in-process model or a Triton text model."""

from __future__ import annotations

from pathlib import Path

from engine.errors import PruneError
from engine.settings import default_workers

from engine.cli.flags import (
    add_batching,
    load_compressor,
    add_compressor,
    add_openvino,
    add_setting,
    api_imports,
    batching,
    compressor_named,
    model_path,
    port_number,
    positive_float,
)


def add(new) -> None:
    """`prune api`'s flags."""
    h = new("api", help="the HTTP API: TEI and Cohere rerank, /v1/prune (in-process or a Triton text model)")
    h.add_argument(
        "--model",
        help="exported folder, or 'default' (all-MiniLM-L6-v2, exported on first use); default: 'default'; "
        "an LLMLingua-2 checkpoint or its export serves POST /v1/compress instead of the pruning routes",
    )
    h.add_argument(
        "--server",
        help="a Triton server's gRPC address, host:port (several replicas: comma-separated "
        "or dns:///name:port), instead of an in-process model",
    )
    add_setting(h, "text_model")
    add_setting(h, "host")
    add_setting(h, "port", type=port_number)
    add_setting(h, "api_key")
    add_setting(h, "workers")
    add_setting(h, "merge_calls")
    add_setting(h, "max_concurrent")
    add_setting(h, "request_timeout", type=positive_float)
    add_setting(h, "max_body_bytes")
    add_setting(h, "model_service_port", type=port_number)
    add_encoder(h)
    add_openvino(h, ("onnxruntime", "openvino"))
    add_setting(
        h,
        "device",
        "; with --model default on cuda, the default model's fp16 GPU graph, exported on first use",
    )
    add_batching(h)
    add_compressor(h, "; the API also answers POST /v1/compress with it, so one address serves both jobs")
    h.set_defaults(func=run)


def run(args) -> int:
    """Run `prune api`; the exit status."""
    uvicorn, _, _ = api_imports()
    from engine.compressor import Compressor
    from engine.models.loading import ModelKind, model_kind
    from engine.pruner import Pruner

    check_ports(args)
    check_compressor_flag(args)
    if args.server:
        name = args.text_model or "default_text"
        args.log(f"connecting to the text model {name!r} on {args.server} (gRPC) ...")
        pruner = Pruner.connect(args.server, name, timeout=args.request_timeout)
        label = f"{name}@{args.server}"
    elif args.model and model_kind(args.model) is ModelKind.COMPRESSOR:
        if getattr(args, "model_service_port", None) is not None:
            raise PruneError(
                "--model-service-port serves a pruning model; an LLMLingua-2 compressor serves HTTP only"
            )
        pruner = Compressor.load(
            args.model,
            args.backend,
            threads=args.threads,
            precision=args.inference_precision,
            device=args.device,
            log=args.log,
            merge_calls=args.merge_calls,
        )
        label = Path(args.model).name
    else:
        model = model_path(args)
        pruner = Pruner.load(
            model,
            args.backend,
            threads=args.threads,
            batching=batching(args),
            precision=args.inference_precision,
            device=args.device,
            log=args.log,
            merge_calls=args.merge_calls,
            compressor=load_compressor(args),
        )
        label = Path(model).name if args.model and args.model != "default" else "default"
    app = api_app(
        args,
        pruner,
        label,
        remote=bool(args.server),
        default_encoder=not args.server and model_is_default(args),
    )
    kind = "llmlingua2, POST /v1/compress" if isinstance(pruner, Compressor) else pruner.family.name
    compressor = compressor_named(args, pruner)
    args.log(
        f"prune api: {label} ({kind}, {pruner.describe()}) on http://{args.host}:{args.port}"
        + (
            f"; {compressor} for compress_rate / compress_target_token and POST /v1/compress"
            if compressor
            else ""
        )
        + service_note(args)
        + ("" if args.api_key else "; no API key")
    )
    try:
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level="warning" if args.quiet else "info",
            timeout_graceful_shutdown=int(args.request_timeout),
        )
    finally:
        pruner.close()
    return 0


def check_compressor_flag(args) -> None:
    """A PruneError (one line) before anything loads when --compressor cannot sit beside the model:
    a Triton text model (--server), a --model that is itself a compressor, or a folder that is not
    an LLMLingua-2 checkpoint or export."""
    from engine.models.loading import ModelKind, model_kind

    def is_compressor(folder: str) -> bool:
        return model_kind(folder) is ModelKind.COMPRESSOR

    if not getattr(args, "compressor", None):
        return
    if args.server:
        raise PruneError(
            "--compressor loads beside an in-process pruner (--model); with --server, serve the compressor "
            "from its own `prune api --model LLMLINGUA2_DIR`"
        )
    if args.model and is_compressor(args.model):
        raise PruneError(f"--model {args.model} is itself an LLMLingua-2 compressor: drop --compressor")
    if not is_compressor(args.compressor):
        raise PruneError(
            f"--compressor {args.compressor}: not an LLMLingua-2 checkpoint or export (its config.json or "
            "manifest.json says which a folder is)"
        )


def add_encoder(p) -> None:
    """--encoder: the retrieval encoder the model service's Embedding calls use."""
    p.add_argument(
        "--encoder",
        help="exported encoder folder (prune export --encoder) that Milvus's Embedding calls "
        "use (--model-service-port); default: the default model's encoder when --model "
        "is default, else none (Embedding answers UNIMPLEMENTED)",
    )


def check_ports(args) -> None:
    """A PruneError (one line) before anything loads when a port of `prune api` cannot be
    bound: --port taken, --model-service-port taken or unservable, or both the same."""
    check_model_service(args)
    check_port_table(
        [
            ("--port", args.host, args.port),
            ("--model-service-port", args.host, getattr(args, "model_service_port", None)),
        ]
    )


def check_port_table(ports: list[tuple[str, str, int | None]]) -> None:
    """A PruneError (one line) when a port of `ports` ((flag, host, port); 0 or None: none,
    or one the system picks) is named twice or cannot be bound now: `prune api` and `prune
    serve` check theirs with it before anything loads."""
    seen: dict[int, str] = {}
    for flag, host, port in ports:
        if not port:
            continue
        if port in seen:
            raise PruneError(f"{seen[port]} and {flag} are both {port}: each server needs a port of its own")
        seen[port] = flag
        if not port_is_free(host, port):
            raise PruneError(f"{flag} {port}: {host}:{port} is in use; choose another port")


def port_is_free(host: str, port: int) -> bool:
    """Whether host:port can be bound now (as a server binds: SO_REUSEADDR)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def check_model_service(args) -> None:
    """A PruneError (one line) before anything loads when --model-service-port is given and
    cannot be served: grpcio-tools missing (its port is check_port_table's)."""
    if getattr(args, "model_service_port", None) is None:
        return
    from engine.http.milvus import proto_modules

    proto_modules()


def model_is_default(args) -> bool:
    """Whether --model names the default model."""
    return not args.model or args.model == "default"


def api_app(args, pruner, label: str, remote: bool, default_encoder: bool = False):
    """The ASGI app of `prune api` for `pruner`, with the API's settings from `args` (and
    Milvus's model service when --model-service-port is given)."""
    _, ApiConfig, create_app = api_imports()
    workers = args.workers or default_workers(remote, getattr(args, "device", "cpu"))
    port = getattr(args, "model_service_port", None)
    service = None
    embedder = None
    if port is not None:
        from engine.http.milvus import address

        service = address(args.host, port)
        encoder = getattr(args, "encoder", None) or ("default" if default_encoder else None)
        if encoder:
            from engine.rag.embedder import Embedder

            embedder = Embedder.load(encoder, threads=getattr(args, "threads", None), log=args.log)
    config = ApiConfig(
        api_key=args.api_key,
        workers=workers,
        max_concurrent=args.max_concurrent,
        request_timeout=args.request_timeout,
        max_body_bytes=args.max_body_bytes,
        model_name=label,
        compressor_name=Path(args.compressor).name if getattr(args, "compressor", None) else "llmlingua2",
        model_service=service,
    )
    return create_app(pruner, config, embedder, log=args.log)


def service_note(args) -> str:
    """What the start line says of the model service."""
    port = getattr(args, "model_service_port", None)
    if port == 0:
        return f", Milvus's model service on {args.host} (gRPC; the port the system picks follows)"
    return "" if port is None else f", Milvus's model service on {args.host}:{port} (gRPC)"
