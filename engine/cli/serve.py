"""`prune serve`: a supervised tritonserver on a model repository, with the HTTP API in front."""

from __future__ import annotations

import sys
from pathlib import Path

from engine.cli.api import add_encoder, api_app, check_model_service, check_port_table, service_note
from engine.cli.flags import add_setting, api_imports, non_negative_int, port_number, positive_float
from engine.errors import PruneError


def add(new) -> None:
    """`prune serve`'s flags."""
    s = new("serve", help="start a local tritonserver on a model repository, with the HTTP API in front")
    s.add_argument("--model-repository", required=True, help="the folder `prune repository` wrote")
    add_setting(s, "host")
    add_setting(s, "triton_host")
    add_setting(s, "http_port", type=port_number)
    add_setting(s, "grpc_port", type=port_number)
    add_setting(s, "metrics_port", type=port_number)
    add_setting(s, "triton_http")
    s.add_argument(
        "--ready-timeout",
        type=positive_float,
        default=120.0,
        help="seconds to wait for readiness (default 120)",
    )
    add_setting(s, "admin_key")
    s.add_argument(
        "--no-restart",
        action="store_true",
        help="exit when the server dies or a model's stub dies, instead of restarting it",
    )
    add_setting(s, "max_restarts", type=non_negative_int)
    s.add_argument(
        "--open-admin-apis",
        action="store_true",
        help="leave those APIs open to every client (not recommended beyond loopback)",
    )
    api = s.add_argument_group("the HTTP API (prune api's, in front of the served text model)")
    add_setting(api, "api_port", type=port_number)
    for name in (
        "text_model",
        "api_key",
        "workers",
        "max_concurrent",
        "request_timeout",
        "max_body_bytes",
        "model_service_port",
    ):
        add_setting(
            api,
            name,
            **(
                {"type": positive_float}
                if name == "request_timeout"
                else {"type": port_number}
                if name == "model_service_port"
                else {}
            ),
        )
    add_encoder(api)
    s.set_defaults(func=run)


def run(args) -> int:
    """Run `prune serve`; the exit status."""
    import signal as _signal
    from engine.triton.server import TritonServer

    def on_signal(signum, frame):
        raise _Stop(_signal.Signals(signum).name)

    text_model = _api_text_model(args)
    api_on = text_model is not None
    triton_host = args.triton_host or ("127.0.0.1" if api_on else args.host)
    check_ports(args, triton_host, api_on)
    server = TritonServer(
        args.model_repository,
        host=triton_host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        forward_logs=not args.quiet,
        admin_key=args.admin_key,
        restrict_admin=not args.open_admin_apis,
        http=args.triton_http == "on",
    )
    # SIGTERM (systemd, Kubernetes, docker stop) and SIGHUP stop the server exactly as Ctrl-C does.
    previous = {s: _signal.signal(s, on_signal) for s in (_signal.SIGTERM, _signal.SIGHUP)}
    why = None
    api = pruner = None
    try:
        server.start(timeout=args.ready_timeout)
        http = f"HTTP {server.http_url}" if server.http else "HTTP off"
        print(
            f"tritonserver ready: gRPC {server.grpc_url}  {http}  metrics {server.metrics_url}"
            "  (Ctrl-C stops)",
            flush=True,
        )
        if text_model:
            pruner, api = _start_api(args, server, text_model)
        stopped = server.supervise(
            ready_timeout=args.ready_timeout,
            restart=not args.no_restart,
            max_restarts=args.max_restarts,
            alive=lambda: api is None or api.alive(),
            log=args.log,
        )
        print(f"prune serve: {stopped}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        why = "SIGINT"
    except _Stop as stop:
        why = str(stop)
    finally:
        for s, h in previous.items():
            _signal.signal(s, h)
        if api:  # the API drains first: its requests in flight still reach Triton
            api.stop()
        if pruner:
            pruner.close()
        clean = server.stop()
    if why is None:  # the server failed and was not (or no longer) restarted
        return 1
    args.log(
        f"prune serve: {why}: "
        + ("the HTTP API and " if api else "")
        + "tritonserver "
        + ("drained and stopped" if clean else "did not stop in time and was killed")
    )
    return 0 if clean else 1


def _api_text_model(args) -> str | None:
    """The text model the HTTP API will serve (None: no API, said why), after the checks made
    before anything starts."""
    if not Path(args.model_repository).is_dir():  # before any note about it
        raise PruneError(
            f"--model-repository {args.model_repository}: no such folder (prune repository "
            "--out FOLDER writes one)"
        )
    check_model_service(args)
    text_model = _text_model(args) if args.api_port else None
    if args.api_port and text_model is None:
        args.log(
            f"prune serve: {args.model_repository} has no text model (prune repository writes one unless "
            "--no-text-model): no HTTP API"
        )
    if text_model:
        try:
            api_imports()
        except PruneError as exc:
            args.log(f"prune serve: {exc}: no HTTP API (--api-port 0 says so without this note)")
            text_model = None
    if args.model_service_port is not None and text_model is None:
        args.log(
            "prune serve: Milvus's model service runs beside the HTTP API, which is off: no model service"
        )
    return text_model


def _start_api(args, server, text_model: str):
    """(the pruner, the HTTP API's thread) in front of `text_model`, started."""
    from engine.http.api_thread import ApiThread
    from engine.pruner import Pruner

    if _serves_a_compressor(args, text_model):
        from engine.compressor import Compressor

        pruner = Compressor.connect(server.grpc_url, text_model, timeout=args.request_timeout)
        routes = "/v1/compress"
    else:
        pruner = Pruner.connect(server.grpc_url, text_model, timeout=args.request_timeout)
        routes = "TEI /rerank, Cohere /v1/rerank /v2/rerank, /v1/prune"
    api = ApiThread(
        api_app(args, pruner, text_model, remote=True),
        args.host,
        args.api_port,
        log_level="warning" if args.quiet else "info",
        graceful_s=args.request_timeout,
    ).start()
    print(
        f"HTTP API ready: {api.url} ({text_model}; {routes}, /health, /openapi.json)"
        + service_note(args)
        + ("" if args.api_key else "; no API key"),
        flush=True,
    )
    return pruner, api


def _serves_a_compressor(args, text_model: str) -> bool:
    """Whether `text_model` is an LLMLingua-2 compressor's (export/triton_compressor.py marks its config)."""
    config = Path(args.model_repository) / text_model / "config.pbtxt"
    return 'key: "prune_compressor"' in config.read_text(encoding="utf-8")


def check_ports(args, triton_host: str, api_on: bool) -> None:
    """A PruneError (one line) before tritonserver starts when a port `prune serve` would
    bind is named twice or is in use (tritonserver's own ports, the HTTP API's and the model
    service's)."""
    ports = [
        ("--http-port", triton_host, args.http_port if args.triton_http == "on" else None),
        ("--grpc-port", triton_host, args.grpc_port),
        ("--metrics-port", triton_host, args.metrics_port),
    ]
    if api_on:
        ports += [
            ("--api-port", args.host, args.api_port),
            ("--model-service-port", args.host, args.model_service_port),
        ]
    check_port_table(ports)


class _Stop(Exception):
    """A termination signal reached `prune serve`."""


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
        raise PruneError(
            f"{args.model_repository} holds {len(names)} text models ({', '.join(names)}): "
            "name the one the HTTP API serves with --text-model, or --api-port 0"
        )
    return names[0] if names else None
