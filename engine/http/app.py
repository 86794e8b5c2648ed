"""The HTTP API: TEI's and Cohere's rerank protocols, the engine's own prune endpoint,
OpenSearch's highlighter and LLMLingua-2's /v1/compress, in front of the model served, typed by
the jobs it offers (engine.http.served.Served): any pruner (`engine.protocol.PrunerProtocol`: the
in-process `Pruner` or a Triton text model through its client), any compressor
(`engine.protocol.CompressorProtocol`), or a pruner with a compressor beside it.

    app = create_app(Pruner.load("default"), ApiConfig(api_key="..."))
    uvicorn.run(app, host="127.0.0.1", port=8080)

Why FastAPI on Starlette and uvicorn: request and response models (pydantic) give each
wrong field a 422 naming it and an OpenAPI schema for free, and it is what TEI-style
Python services (Infinity) are written in. The model runs in a bounded thread pool, never
on the event loop; one model serves every request.

Hardening (docs/http-api.md): loopback by default (the CLI), an optional Bearer API key
compared in constant time, the body size checked before it is read and a slow body cut
off, the engine's input limits, at most `max_concurrent` requests in flight (429 with
Retry-After past it), a deadline per request (504), and JSON errors, never a traceback.

The parts, each importable and testable alone: `ApiState` (on `app.state.api`: the model served,
the config, the worker pool, health, metrics, the requests in flight), every route's handler on
`router` (module-level functions that take the state as a dependency, each POST route registered
with its job), the body types (each route family's types module: models.py, opensearch_api.py,
compress_api.py), the exception handlers (engine.http.error_handlers), the API key, refusal and
metrics middleware (`guard`), the body limit (`_BodyLimit`, outermost); `create_app` only wires
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Annotated, Any

from engine.http.served import Job, Served
from engine.http.state import ApiConfig, ApiState
from engine.pipeline.inputs import CallOptions, check_tags
from engine.protocol import CompressorProtocol, PrunerProtocol

try:
    from fastapi import APIRouter, Depends, FastAPI, Request
    from fastapi.responses import PlainTextResponse, Response

    from engine.http import compress_api as compress
    from engine.http import opensearch_api as opensearch
    from engine.http.error_handlers import EXCEPTION_HANDLERS, error_response
    from engine.http.models import (
        POST_ERRORS,
        ApiError,
        CohereApiVersion,
        CohereBilledUnits,
        CohereDocumentOut,
        CohereMeta,
        CohereRerankRequest,
        CohereRerankResponse,
        CohereResult,
        CompressorBeside,
        ErrorBody,
        HealthResponse,
        InfoResponse,
        PrunedPassage,
        PruneRequest,
        PruneResponse,
        TeiRank,
        TeiRerankRequest,
        info_rules,
        sentences_out,
    )
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("the HTTP API needs FastAPI and uvicorn: pip install 'prune-engine[api]'") from exc

__all__ = ["ApiConfig", "ApiState", "create_app", "PruneRequest", "ApiError"]


#: The highlighting page (engine/http/page, package data): its paths, files and types.
PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/page/page.js": ("page.js", "text/javascript; charset=utf-8"),
    "/page/page.css": ("page.css", "text/css; charset=utf-8"),
}
#: Its headers: only its own script and style run, it talks only to this server, no page
#: may frame it, and nothing is sniffed or cached.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


#: the paths served without the API key (the page asks for the key itself)
OPEN_PATHS = ("/health", "/metrics", *PAGE_FILES)


class _BodyLimit:
    """Pure ASGI middleware: a declared Content-Length over the limit is refused before
    anything is read; the body is then read here, chunk by chunk, and refused as soon as it
    grows past the limit (413) or a chunk takes longer than `timeout` to arrive (408);
    the app gets it whole."""

    def __init__(self, app, limit: int, timeout: float):
        self.app, self.limit, self.timeout = app, limit, timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                return await error_response(ApiError.UNREADABLE, "Content-Length is not a number")(
                    scope, receive, send
                )
            if size > self.limit:
                refused = error_response(
                    ApiError.TOO_LARGE, f"the body is {size} bytes; the limit is {self.limit}"
                )
                return await refused(scope, receive, send)
        body, more = bytearray(), True
        while more:
            try:
                message = await asyncio.wait_for(receive(), self.timeout)
            except asyncio.TimeoutError:
                late = error_response(
                    ApiError.BODY_TIMEOUT,
                    f"the body did not arrive within {self.timeout:g} s of its last part",
                )
                return await late(scope, receive, send)
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                refused = error_response(
                    ApiError.TOO_LARGE, f"the body is over the limit of {self.limit} bytes"
                )
                return await refused(scope, receive, send)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# --------------------------------------------------------------------------- the handlers
# Every route's handler is here, a module-level function over the app's state (`api: Api`); every
# body type is its route family's types module's (models.py: the pruning routes' and what every
# route shares; opensearch_api.py; compress_api.py). Each POST route is registered with its job
# (`post`), and a route whose job the served model does not offer is refused (engine.http.served).


async def api_state(request: Request) -> ApiState:
    """The state of the app serving `request` (every handler's dependency)."""
    return request.app.state.api


#: a handler's parameter that receives the app's state
Api = Annotated[ApiState, Depends(api_state)]
#: the API's routes (create_app includes them; the highlighting page's are added there)
router = APIRouter()
#: each POST route's job: the served model offers it, or the route answers 404 saying why
ROUTE_JOBS: dict[str, Job] = {}


def post(job: Job, path: str, **kwargs: Any) -> Any:
    """`router.post(path, ...)` for a route of `job` (recorded in ROUTE_JOBS), with the errors every
    POST route may answer."""
    ROUTE_JOBS[path] = job
    return router.post(path, responses=POST_ERRORS, **kwargs)


@post(
    Job.PRUNE,
    "/rerank",
    response_model=list[TeiRank],
    response_model_exclude_none=True,
    summary="Rerank and prune texts (TEI's /rerank)",
)
async def rerank(req: TeiRerankRequest, api: Api):
    """TEI's /rerank: the texts best first, each with its score and pruned text."""
    results = await api.prune(req.query, req.texts, CallOptions.of_attributes(req))
    ranked = sorted(results, key=lambda r: -api.score(r, req.raw_scores))
    return [
        TeiRank(
            index=r.index,
            score=api.score(r, req.raw_scores),
            text=r.context if req.return_text else None,
            pruned_text=r.pruned_context,
            compressed_text=r.compressed_context,
            sentences=sentences_out(r) if req.return_sentences else None,
        )
        for r in ranked
    ]


@post(
    Job.PRUNE,
    "/v1/rerank",
    response_model=CohereRerankResponse,
    response_model_exclude_none=True,
    summary="Rerank documents (Cohere's v1 rerank)",
)
@post(
    Job.PRUNE,
    "/v2/rerank",
    response_model=CohereRerankResponse,
    response_model_exclude_none=True,
    summary="Rerank documents (Cohere's v2 rerank)",
)
async def cohere(req: CohereRerankRequest, api: Api):
    """Cohere's rerank (v1 and v2): the top_n documents best first."""
    texts = [d if isinstance(d, str) else d.text for d in req.documents]
    results = await api.prune(req.query, texts)
    ranked = sorted(results, key=lambda r: -api.score(r, False))[: req.top_n]
    return CohereRerankResponse(
        id=str(uuid.uuid4()),
        results=[
            CohereResult(
                index=r.index,
                relevance_score=api.score(r, False),
                document=CohereDocumentOut(text=r.context) if req.return_documents else None,
            )
            for r in ranked
        ],
        meta=CohereMeta(
            api_version=CohereApiVersion(version="2"), billed_units=CohereBilledUnits(search_units=1)
        ),
    )


@post(
    Job.PRUNE,
    "/v1/prune",
    response_model=PruneResponse,
    response_model_exclude_unset=True,
    summary="Prune passages: the engine's full result",
)
async def prune_endpoint(req: PruneRequest, api: Api):
    """The engine's own endpoint: each passage's full result, with every option of a call."""
    tagged = check_tags(req.pre, req.post)
    results = await api.prune(req.question, req.passages, CallOptions.of_attributes(req))
    return PruneResponse(
        model=api.config.model_name,
        results=[PrunedPassage.of(r, r.highlight(req.pre, req.post) if tagged else None) for r in results],
    )


@post(
    Job.PRUNE,
    opensearch.PATHS[0],
    response_model=opensearch.OpenSearchResponse,
    summary="OpenSearch's semantic highlighter: the remote model's contract (UTF-16 offsets)",
)
@post(
    Job.PRUNE,
    opensearch.PATHS[1],
    response_model=opensearch.OpenSearchResponse,
    summary="The same (the path earlier releases served)",
)
@post(
    Job.PRUNE,
    opensearch.PATHS[2],
    response_model=opensearch.OpenSearchResponse,
    summary="The same at TorchServe's path, as OpenSearch's own connector names it",
)
async def opensearch_highlight(req: opensearch.OpenSearchRequest, api: Api):
    """OpenSearch's remote semantic-highlighting model: each document's kept sentences as
    UTF-16 spans, one list per document of a batch (engine/http/opensearch_api.py)."""
    t0 = time.perf_counter()
    calls, batch = opensearch.queries(req)
    api.pruner.limits.check_count(len(calls), "documents in one request")
    spans = [opensearch.highlights(results[0]) for results in await api.prune_many(calls)]
    return opensearch.OpenSearchResponse(
        highlights=spans if batch else spans[0],
        processing_time_ms=round(1000 * (time.perf_counter() - t0), 3),
    )


@post(
    Job.COMPRESS,
    compress.PATH,
    response_model=compress.CompressResponse,
    response_model_exclude_none=True,
    summary="Compress a prompt with LLMLingua-2 (compress_prompt's arguments and fields)",
)
async def compress_endpoint(req: compress.CompressRequest, api: Api):
    """compress_prompt(use_llmlingua2=True) on the body's context, with its options."""
    result = await api.compress(req.context, req.model_dump(exclude={"context"}))
    return compress.CompressResponse(**result.to_dict())


@router.get(
    "/health",
    response_model=HealthResponse,
    summary="200 while the engine answers (a recent request, or a probe of its own), 503 otherwise",
    responses={503: {"model": ErrorBody, "description": ApiError.UNHEALTHY.meaning}},
)
async def health_endpoint(api: Api):
    """Whether the engine answers: a request succeeded within the last few seconds, or a probe
    of its own did (never queued behind requests)."""
    try:
        checked = await api.health.check()
    except Exception as exc:
        return error_response(
            ApiError.UNHEALTHY, f"the engine did not answer: {type(exc).__name__}: {exc}"[:500]
        )
    return HealthResponse(status="ok", checked=checked)


@router.get(
    "/info",
    response_model=InfoResponse | compress.CompressorInfo,
    summary="model, family, defaults, limits, version",
)
async def info(api: Api):
    """The model, its family and defaults (a compressor: its word rule and compress's defaults),
    the engine, the limits and the version."""
    config, served = api.config, api.served
    if served.pruner is None:
        return compressor_info(api)
    pruner = served.pruner
    rules, defaults = info_rules(pruner.family)
    beside = served.compressor
    return InfoResponse(
        model=config.model_name,
        family=pruner.family.name,
        rules=rules,
        defaults=defaults,
        engine=pruner.describe(),
        max_length=pruner.max_length,
        limits=pruner.limits.to_dict(),
        max_body_bytes=config.max_body_bytes,
        max_concurrent=config.max_concurrent,
        request_timeout=config.request_timeout,
        version=_version(),
        device=served.reports() or None,
        compressor=None
        if beside is None
        else CompressorBeside(
            model=config.compressor_name,
            tokenizer=beside.tokenizer_kind,
            engine=beside.describe(),
            routes=[compress.PATH],
        ),
    )


def compressor_info(api: ApiState) -> compress.CompressorInfo:
    """`/info` when the model served is a compressor."""
    c, config = api.compressor, api.config
    return compress.CompressorInfo(
        model=config.model_name,
        tokenizer=c.tokenizer_kind,
        engine=c.describe(),
        routes=[compress.PATH],
        defaults=compress.compress_defaults(),
        limits=c.limits.to_dict(),
        max_body_bytes=config.max_body_bytes,
        max_concurrent=config.max_concurrent,
        request_timeout=config.request_timeout,
        version=_version(),
        device=api.served.reports() or None,
    )


@router.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
async def metrics(api: Api):
    """The Prometheus metrics."""
    return PlainTextResponse(api.metrics.text(), media_type="text/plain; version=0.0.4")


def page_handler(path: str):
    """The handler of the page's file at `path` (read once, here)."""
    name, media = PAGE_FILES[path]
    body = _page_file(name)

    async def serve():
        return Response(body, media_type=media, headers=PAGE_HEADERS)

    return serve


# --------------------------------------------------------------------------- middleware


async def guard(request: Request, call_next):
    """Every request: the API key checked where one is set (but on OPEN_PATHS), and its
    status and latency counted by route."""
    api: ApiState = request.app.state.api
    path = request.url.path
    route = path if path in api.routes else "other"  # bounded label values
    if path not in OPEN_PATHS and not api.config.authorizes(request.headers.get("authorization")):
        api.metrics.requests.labels(route, "401").inc()
        return error_response(ApiError.UNAUTHORIZED, "a valid API key is required: Authorization: Bearer KEY")
    refused = api.refused.get(path)
    if refused is not None:  # a compressor's app and a pruner's serve each other's routes with a 404
        api.metrics.requests.labels(route, "404").inc()
        return error_response(ApiError.NOT_OFFERED, refused)
    t0 = time.perf_counter()
    response = await call_next(request)
    api.metrics.latency.labels(route).observe(time.perf_counter() - t0)
    api.metrics.requests.labels(route, str(response.status_code)).inc()
    return response


# --------------------------------------------------------------------------- the app


@contextlib.asynccontextmanager
async def _lifespan(app):
    api = app.state.api
    service = None
    try:
        if api.config.model_service:
            from engine.http import milvus

            service = await milvus.start(api, api.config.model_service, api.embedder)
        yield
    finally:
        if service is not None:
            await service.stop(api.config.request_timeout)
        api.close()


def create_app(
    model: PrunerProtocol | CompressorProtocol,
    config: ApiConfig = ApiConfig(),
    embedder: Any = None,
    log: Any = None,
) -> Any:
    """The ASGI app serving `model` (which it does not close: its owner does): a pruner (and the
    compressor beside it, an in-process Pruner's) or a compressor, typed by the jobs it offers
    (engine.http.served.Served), the routes of the others refused with a 404 saying why; and, when
    `config.model_service` is set, Milvus's model service beside it (engine/http/milvus.py;
    `embedder` answers its Embedding calls; `log` is told the port it binds when asked for 0)."""
    app = FastAPI(
        title="prune-engine",
        version=_version(),
        lifespan=_lifespan,
        exception_handlers=EXCEPTION_HANDLERS,
        # no /docs or /redoc: FastAPI's pages load their scripts from a CDN, and are blank offline; the
        # schema is at /openapi.json, and the highlighting page at / needs nothing from outside
        docs_url=None,
        redoc_url=None,
        description="Context pruning and semantic highlighting: TEI- and Cohere-compatible rerank, "
        "and the engine's own prune endpoint (docs/http-api.md).",
    )
    app.middleware("http")(guard)
    app.include_router(router)
    for path in PAGE_FILES:
        app.get(path, include_in_schema=False)(page_handler(path))
    served = Served.of(model)
    app.state.api = api = ApiState.of(served, config, routes=route_paths(app), embedder=embedder, log=log)
    api.refused = {
        path: served.refusal(job, path, config.model_name)
        for path, job in ROUTE_JOBS.items()
        if job not in served.jobs
    }
    return _BodyLimit(app, config.max_body_bytes, config.body_timeout)


def route_paths(app: FastAPI) -> frozenset[str]:
    """Every path `app` serves (the metrics' route labels): the router's and the app's own
    (the schema, its pages, the highlighting page). An included router is one entry of
    `app.routes` without a path in some FastAPI versions, so its routes are read from it."""
    return frozenset({r.path for r in router.routes} | {r.path for r in app.routes if hasattr(r, "path")})


def _page_file(name: str) -> bytes:
    """A file of the page, from where the package is installed."""
    from importlib.resources import files

    return (files("engine.http") / "page" / name).read_bytes()


def _version() -> str:
    import engine

    return engine.__version__
