"""`prune mcp`: the pruner (and an LLMLingua-2 compressor) as MCP tools for agents, over stdio or
streamable HTTP (engine.http.mcp_server)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from engine.cli.api import check_port_table
from engine.cli.flags import (
    add_batching,
    add_openvino,
    add_setting,
    batching,
    load_compressor,
    model_path,
    port_number,
    positive_float,
)
from engine.errors import PruneError
from engine.settings import default_workers

TRANSPORTS = ("stdio", "streamable-http")


def add(new) -> None:
    """`prune mcp`'s flags."""
    m = new(
        "mcp",
        help="an MCP server for agents: the tools prune_context (and compress_text with --compressor)",
        description="A Model Context Protocol server: prune_context (the pruner) and, with --compressor, "
        "compress_text (LLMLingua-2), the models in this process. Over stdio (an agent starts it as "
        "its subprocess) or streamable HTTP at http://HOST:PORT/mcp. docs/integrations.md has a client's config.",
    )
    m.add_argument(
        "--model",
        help="the pruner: an exported folder, or 'default' (all-MiniLM-L6-v2, exported on first use); "
        "default: 'default'. An LLMLingua-2 checkpoint or export here serves compress_text alone",
    )
    m.add_argument(
        "--compressor",
        metavar="DIR",
        help="an LLMLingua-2 checkpoint or export: the compress_text tool beside prune_context",
    )
    m.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="stdio",
        help="stdio: MCP on stdin/stdout, for an agent that starts this command; streamable-http: an HTTP "
        "server at http://HOST:PORT/mcp",
    )
    add_setting(m, "host", "; prune mcp: with --transport streamable-http")
    add_setting(m, "port", "; prune mcp: with --transport streamable-http", type=port_number)
    add_setting(m, "api_key", "; prune mcp: its streamable-http requests (401 without it)")
    add_setting(
        m, "request_timeout", "; prune mcp: a tool call's, past it an error result", type=positive_float
    )
    add_setting(m, "max_body_bytes", "; prune mcp: a streamable-http request's")
    add_openvino(m, ("onnxruntime", "openvino"))
    add_setting(m, "device")
    add_batching(m)
    m.set_defaults(func=run)


def mcp_imports():
    """The MCP server's module, or a PruneError saying which extra installs the SDK."""
    try:
        from engine.http import mcp_server
    except ImportError as exc:
        raise PruneError(
            f"prune mcp needs the MCP SDK (missing here: {exc.name}): pip install 'prune-engine[mcp]'"
        ) from exc
    return mcp_server


def run(args) -> int:
    """Run `prune mcp`; the exit status."""
    mcp_server = mcp_imports()
    http = args.transport == "streamable-http"
    if http:
        check_port_table([("--port", args.host, args.port)])
    # on stdio, stdout is the protocol's: whatever a library prints while the models load goes to stderr
    with contextlib.redirect_stdout(sys.stderr) if not http else contextlib.nullcontext():
        pruner, compressor, label = load(args)
    server = mcp_server.create_server(
        pruner,
        compressor,
        workers=default_workers(False, args.device),
        timeout=args.request_timeout,
        log_level="ERROR" if args.quiet else "DEBUG" if args.verbose else "WARNING",
    )
    tools = ", ".join(
        t for t, on in ((mcp_server.PRUNE_TOOL, pruner), (mcp_server.COMPRESS_TOOL, compressor)) if on
    )
    where = (
        f"http://{args.host}:{args.port}/mcp"
        if http
        else "stdio (an MCP client writes to stdin; Ctrl-C ends)"
    )
    args.log(
        f"prune mcp: {label}; tools {tools}; on {where}"
        + ("; no API key" if http and not args.api_key else "")
    )
    try:
        if http:
            import uvicorn

            app = mcp_server.http_app(server, args.host, args.max_body_bytes, args.api_key)
            uvicorn.run(app, host=args.host, port=args.port, log_level="warning" if args.quiet else "info")
        else:
            import anyio

            anyio.run(server.run_stdio_async)
    except KeyboardInterrupt:
        pass
    finally:
        for model in (pruner, compressor):
            if model is not None:
                model.close()
    return 0


def load(args):
    """(pruner or None, compressor or None, what the start line calls them) of --model and --compressor."""
    from engine.compressor import Compressor
    from engine.models.loading import ModelKind, model_kind

    def lingua(folder: str) -> Compressor:
        return load_compressor(args, folder)

    if args.model and model_kind(args.model) is ModelKind.COMPRESSOR:
        if args.compressor:
            raise PruneError(
                "--model is an LLMLingua-2 compressor already: drop --compressor, or give a pruner"
            )
        compressor = lingua(args.model)
        return None, compressor, f"{Path(args.model).name} ({compressor.describe()})"
    from engine.pruner import Pruner

    model = model_path(args)
    pruner = Pruner.load(
        model,
        args.backend,
        threads=args.threads,
        batching=batching(args),
        precision=args.inference_precision,
        device=args.device,
        log=args.log,
    )
    label = f"{Path(model).name if args.model and args.model != 'default' else 'default'} "
    label += f"({pruner.family.name}, {pruner.describe()})"
    if not args.compressor:
        return pruner, None, label
    compressor = lingua(args.compressor)
    return pruner, compressor, f"{label} and {Path(args.compressor).name} ({compressor.describe()})"
