"""The HTTP API: TEI's and Cohere's rerank protocols and the engine's own prune endpoint,
in front of any pruner (`engine.protocol.PrunerProtocol`): the in-process `Pruner` or a
Triton text model through its client (one server or replicas).

    app = create_app(Pruner.load("default"), ApiConfig(api_key="..."))
    uvicorn.run(app, host="127.0.0.1", port=8080)

Why FastAPI on Starlette and uvicorn: request and response models (pydantic) give each
wrong field a 422 naming it and an OpenAPI schema for free, and it is what TEI-style
Python services (Infinity) are written in. The pruner runs in a bounded thread pool, never
on the event loop; one pruner serves every request.

Hardening (docs/http-api.md): loopback by default (the CLI), an optional Bearer API key
compared in constant time, the body size checked before it is read and a slow body cut
off, the engine's input limits, at most `max_concurrent` requests in flight (429 with
Retry-After past it), a deadline per request (504), and JSON errors, never a traceback.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from engine.decide import PruneResult
from engine.errors import InputError, PruneError
from engine.inputs import OPTION_NAMES, CallOptions
from engine.protocol import PrunerProtocol
from engine.settings import DEFAULTS

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from engine.http.models import (POST_ERRORS, ApiError, CohereDocumentOut, CohereRerankRequest,
                                    CohereRerankResponse, CohereResult, Defaults, ErrorBody, HealthResponse,
                                    InfoResponse, PrunedPassage, PruneRequest, PruneResponse, TeiRank,
                                    TeiRerankRequest, sentences_out)
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("the HTTP API needs FastAPI and uvicorn: pip install 'prune-engine[api]'") from exc

__all__ = ["ApiConfig", "create_app", "PruneRequest", "ApiError"]


@dataclass(frozen=True)
class ApiConfig:
    """How the API serves: the key, worker threads, limits and the model's public name."""
    api_key: str | None = None
    workers: int = 1
    max_concurrent: int = DEFAULTS.max_concurrent
    request_timeout: float = DEFAULTS.request_timeout
    max_body_bytes: int = DEFAULTS.max_body_bytes
    body_timeout: float = 10.0            # seconds the body may take to arrive
    model_name: str = "prune-engine"


#: seconds a successful request vouches for the engine's health (docs/http-api.md)
HEALTH_FRESH_S = 2.0


# --------------------------------------------------------------------------- the app

def _error(kind: ApiError, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The answer of error `kind` with `message` (TEI's body, Cohere's `message` beside it)."""
    return JSONResponse(kind.body(message), status_code=kind.status, headers=headers)


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
                return await _error(ApiError.UNREADABLE, "Content-Length is not a number")(scope, receive, send)
            if size > self.limit:
                refused = _error(ApiError.TOO_LARGE, f"the body is {size} bytes; the limit is {self.limit}")
                return await refused(scope, receive, send)
        body, more = bytearray(), True
        while more:
            try:
                message = await asyncio.wait_for(receive(), self.timeout)
            except asyncio.TimeoutError:
                late = _error(ApiError.BODY_TIMEOUT,
                              f"the body did not arrive within {self.timeout:g} s of its last part")
                return await late(scope, receive, send)
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                refused = _error(ApiError.TOO_LARGE, f"the body is over the limit of {self.limit} bytes")
                return await refused(scope, receive, send)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()
        await self.app(scope, replay, send)


class _Health:
    """What `/health` knows of the engine. A request that succeeded within HEALTH_FRESH_S
    vouches for it (and no engine failure since); otherwise a real inference of its own
    answers, on a thread of its own, never queued behind user requests in the worker pool,
    one at a time (concurrent checks share it), within the request timeout. So readiness
    does not flap when the server is busy, and still turns 503 when the engine fails."""

    def __init__(self, pruner: PrunerProtocol, timeout: float):
        self.pruner, self.timeout = pruner, timeout
        self.ok_at: float | None = None
        self.failed_at: float | None = None
        self._probe: asyncio.Future | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prune-health")

    def succeeded(self) -> None:
        self.ok_at = time.monotonic()

    def failed(self, exc: BaseException) -> None:
        self.failed_at = time.monotonic()

    async def check(self) -> str:
        """'requests' or 'probe' when the engine answers; raises when it does not."""
        now = time.monotonic()
        if (self.ok_at is not None and now - self.ok_at < HEALTH_FRESH_S
                and (self.failed_at is None or self.failed_at < self.ok_at)):
            return "requests"
        if self._probe is None or self._probe.done():
            loop = asyncio.get_running_loop()
            self._probe = loop.run_in_executor(
                self._pool, lambda: self.pruner.prune("Is the engine up?", ["The engine is up."]))
        await asyncio.wait_for(asyncio.shield(self._probe), self.timeout)
        self.failed_at = None          # the engine answers again; only user requests vouch for it
        return "probe"

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def create_app(pruner: PrunerProtocol, config: ApiConfig = ApiConfig()) -> Any:
    """The ASGI app serving `pruner` (which it does not close: its owner does)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    fam = pruner.family
    known_routes: set[str] = set()
    pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="prune-api")
    health = _Health(pruner, timeout=config.request_timeout)
    state = {"in_flight": 0}
    registry = CollectorRegistry()
    requests = Counter("prune_api_requests", "HTTP requests by route and status", ["route", "status"],
                       registry=registry)
    latency = Histogram("prune_api_request_seconds", "request latency by route", ["route"], registry=registry,
                        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
    passages = Counter("prune_api_passages", "passages pruned", registry=registry)
    in_flight = Gauge("prune_api_in_flight", "requests being served", registry=registry)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        pool.shutdown(wait=True)       # drain: what is in flight finishes
        health.close()

    app = FastAPI(title="prune-engine", version=_version(), lifespan=lifespan,
                  description="Context pruning and semantic highlighting: TEI- and Cohere-compatible rerank, "
                              "and the engine's own prune endpoint (docs/http-api.md).")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            why, at = first.get("ctx", {}).get("error", "invalid"), first.get("loc", ("", "?"))[-1]
            return _error(ApiError.INVALID, f"the body is not valid JSON ({why} at character {at})")
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return _error(ApiError.INVALID, f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 400 and "parsing the body" in detail:
            detail = "the body cannot be read as JSON (is it UTF-8?)"
        return _error(ApiError.of_status(exc.status_code), detail)

    @app.middleware("http")
    async def _guard(request: Request, call_next):
        path = request.url.path
        route = path if path in known_routes else "other"     # bounded label values
        if config.api_key and path not in ("/health", "/metrics", *PAGE_FILES):   # the page asks for the key
            given = request.headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), config.api_key.encode()):
                requests.labels(route, "401").inc()
                return _error(ApiError.UNAUTHORIZED, "a valid API key is required: Authorization: Bearer KEY")
        t0 = time.perf_counter()
        response = await call_next(request)
        latency.labels(route).observe(time.perf_counter() - t0)
        requests.labels(route, str(response.status_code)).inc()
        return response

    async def run(fn, *args, **kwargs):
        """`fn` in the worker pool, at most `max_concurrent` at once, within the deadline."""
        if state["in_flight"] >= config.max_concurrent:
            raise _Busy()
        state["in_flight"] += 1
        in_flight.inc()
        try:
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(pool, lambda: fn(*args, **kwargs))
            return await asyncio.wait_for(future, config.request_timeout)
        finally:
            state["in_flight"] -= 1
            in_flight.dec()

    class _Busy(Exception):
        pass

    @app.exception_handler(_Busy)
    async def _busy(request: Request, exc: _Busy):
        return _error(ApiError.OVERLOADED, f"{config.max_concurrent} requests are in flight; retry shortly",
                      headers={"Retry-After": "1"})

    @app.exception_handler(asyncio.TimeoutError)
    async def _late(request: Request, exc: asyncio.TimeoutError):
        return _error(ApiError.TIMEOUT, f"no answer within {config.request_timeout:g} s")

    @app.exception_handler(InputError)
    async def _bad(request: Request, exc: InputError):
        return _error(ApiError.INVALID, str(exc))

    @app.exception_handler(PruneError)
    async def _failed(request: Request, exc: PruneError):
        return _error(ApiError.BACKEND, str(exc))

    def prune(question: str, texts: list[str], options: CallOptions | None = None) -> list[PruneResult]:
        try:
            results = pruner.prune(question, texts, options)
        except PruneError as exc:
            if not isinstance(exc, InputError):
                health.failed(exc)
            raise
        health.succeeded()
        passages.inc(len(texts))
        return results

    def score(r: PruneResult, raw: bool) -> float:
        return fam.rank_score(r.reranking_score, raw)

    @app.post("/rerank", response_model=list[TeiRank], response_model_exclude_none=True, responses=POST_ERRORS,
              summary="Rerank and prune texts (TEI's /rerank)")
    async def rerank(req: TeiRerankRequest):
        results = await run(prune, req.query, req.texts)
        ranked = sorted(results, key=lambda r: -score(r, req.raw_scores))
        return [TeiRank(index=r.index, score=score(r, req.raw_scores),
                        text=r.context if req.return_text else None, pruned_text=r.pruned_context,
                        sentences=sentences_out(r) if req.return_sentences else None)
                for r in ranked]

    async def cohere(req: CohereRerankRequest):
        texts = [d if isinstance(d, str) else d.text for d in req.documents]
        results = await run(prune, req.query, texts)
        ranked = sorted(results, key=lambda r: -score(r, False))[:req.top_n]
        return CohereRerankResponse(
            id=str(uuid.uuid4()),
            results=[CohereResult(index=r.index, relevance_score=score(r, False),
                                  document=CohereDocumentOut(text=r.context) if req.return_documents else None)
                     for r in ranked],
            meta={"api_version": {"version": "2"}, "billed_units": {"search_units": 1}})

    for path, which in (("/v2/rerank", "v2"), ("/v1/rerank", "v1")):
        app.post(path, response_model=CohereRerankResponse, response_model_exclude_none=True,
                 responses=POST_ERRORS, summary=f"Rerank documents (Cohere's {which} rerank)")(cohere)

    @app.post("/v1/prune", response_model=PruneResponse, response_model_exclude_unset=True, responses=POST_ERRORS,
              summary="Prune passages: the engine's full result")
    async def prune_endpoint(req: PruneRequest):
        options = CallOptions.of(**{name: getattr(req, name) for name in OPTION_NAMES})
        results = await run(prune, req.question, req.passages, options)
        tagged = req.pre is not None or req.post is not None
        return PruneResponse(model=config.model_name, results=[
            PrunedPassage.of(r, r.highlight(req.pre or "", req.post or "") if tagged else None) for r in results])

    @app.get("/health", response_model=HealthResponse,
             summary="200 while the engine answers (a recent request, or a probe of its own), 503 otherwise",
             responses={503: {"model": ErrorBody, "description": ApiError.UNHEALTHY.meaning}})
    async def health_endpoint():
        try:
            checked = await health.check()
        except Exception as exc:
            return _error(ApiError.UNHEALTHY, f"the engine did not answer: {type(exc).__name__}: {exc}"[:500])
        return HealthResponse(status="ok", checked=checked)

    @app.get("/info", response_model=InfoResponse, summary="model, family, defaults, limits, version")
    async def info():
        defaults = Defaults(threshold=fam.default_threshold(fam.lexical_weight), lexical_weight=fam.lexical_weight,
                            threshold_without_lexical=fam.threshold, title=fam.title, alpha=fam.backoff_alpha,
                            windows=fam.windows, passage_margin=fam.passage_margin, keep_rule=fam.keep_rule,
                            score_kind=fam.score_kind, zero_rerank_when_empty=fam.zero_rerank_when_empty,
                            decides_per_window=fam.windows == "reference" and fam.window_tokens > 0)
        return InfoResponse(model=config.model_name, family=fam.name, defaults=defaults, engine=pruner.describe(),
                            max_length=pruner.spec.max_length, limits=pruner.limits.to_dict(),
                            max_body_bytes=config.max_body_bytes, max_concurrent=config.max_concurrent,
                            request_timeout=config.request_timeout, version=_version())

    page = {path: (_page_file(name), media) for path, (name, media) in PAGE_FILES.items()}

    def page_route(path: str):
        body, media = page[path]

        async def serve():
            return Response(body, media_type=media, headers=PAGE_HEADERS)
        return serve

    for path in PAGE_FILES:
        app.get(path, include_in_schema=False)(page_route(path))

    @app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
    async def metrics():
        return PlainTextResponse(generate_latest(registry), media_type="text/plain; version=0.0.4")

    known_routes.update(r.path for r in app.routes)
    return _BodyLimit(app, config.max_body_bytes, config.body_timeout)


#: The highlighting page (engine/http/page, package data): its paths, files and types.
PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
              "/page/page.js": ("page.js", "text/javascript; charset=utf-8"),
              "/page/page.css": ("page.css", "text/css; charset=utf-8")}
#: Its headers: only its own script and style run, it talks only to this server, no page
#: may frame it, and nothing is sniffed or cached.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache"}


def _page_file(name: str) -> bytes:
    """A file of the page, from where the package is installed."""
    from importlib.resources import files
    return (files("engine.http") / "page" / name).read_bytes()


def _version() -> str:
    import engine
    return engine.__version__
