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
import math
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from engine.decide import PruneResult
from engine.errors import InputError, PruneError
from engine.inputs import OPTION_NAMES, CallOptions, option_choices, option_help, option_type
from engine.protocol import PrunerProtocol
from engine.settings import DEFAULTS

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse
    from pydantic import BaseModel, ConfigDict, Field, create_model
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("the HTTP API needs FastAPI and uvicorn: pip install 'prune-engine[api]'") from exc


@dataclass(frozen=True)
class ApiConfig:
    api_key: str | None = None
    workers: int = 1
    max_concurrent: int = DEFAULTS.max_concurrent
    request_timeout: float = DEFAULTS.request_timeout
    max_body_bytes: int = DEFAULTS.max_body_bytes
    body_timeout: float = 10.0            # seconds the body may take to arrive
    model_name: str = "prune-engine"


# --------------------------------------------------------------------------- scores

def rank_score(result: PruneResult, family: str, raw: bool) -> float:
    """What `score` (TEI) and `relevance_score` (Cohere) mean, per family. Sorting by it
    gives the engine's reranking order (docs/http-api.md):
    - provence, xprovence: the rerank head's logit; `raw_scores=false` gives its sigmoid;
    - open_provence: already the sigmoid of the logit (as its own code reports it, 0.0 when
      nothing is kept); `raw_scores=true` gives the logit back;
    - embedding: the best sentence's cosine with the question, fused with the share of the
      question's words the passage holds at the model's lexical_weight (engine.lexical);
      `raw_scores=false` maps it to [0, 1] as (1 + score) / 2;
    - opensearch: the model has no rerank head: 0.0 for every text (input order).
    A passage with no text (empty or whitespace) scores 0.0, or the lowest raw score."""
    s = result.reranking_score
    if s is None:
        return -1e9 if raw and family in ("provence", "xprovence", "open_provence") else 0.0
    if family in ("provence", "xprovence"):
        return float(s) if raw else 1.0 / (1.0 + math.exp(-s))
    if family == "open_provence":
        if not raw:
            return float(s)
        p = min(max(float(s), 1e-12), 1 - 1e-12)
        return math.log(p / (1 - p))
    if family == "embedding":
        return float(s) if raw else (1.0 + float(s)) / 2.0
    return float(s)


# --------------------------------------------------------------------------- models

class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")     # clients send fields of their own (Cohere's priority, ...)


class ErrorBody(BaseModel):
    """TEI's error body, with Cohere's `message` beside it."""
    error: str
    error_type: str
    message: str


#: the errors every POST route may answer with, documented in the schema
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": what} for code, what in [
        (400, "the body cannot be read (not UTF-8, a bad Content-Length)"),
        (401, "a missing or wrong API key"), (408, "the body arrived too slowly"),
        (413, "the body is over --max-body-bytes"), (422, "invalid input, naming the field"),
        (429, "too many requests in flight (Retry-After)"), (503, "the engine failed"),
        (504, "no answer within --request-timeout")]}


class TeiRerankRequest(_Request):
    query: str = Field(min_length=1, description="the question")
    texts: list[str] = Field(description="the passages to rank and prune")
    raw_scores: bool = Field(False, description="the model's own score instead of one in [0, 1]")
    return_text: bool = Field(False, description="return each text")
    truncate: bool = Field(False, description="accepted for TEI clients; nothing is truncated (long texts are "
                                              "cut into windows)")
    truncation_direction: Literal["Left", "Right", "left", "right"] = "Right"
    return_sentences: bool = Field(False, description="engine extra: each text's sentences with spans, "
                                                      "probabilities and kept flags")


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = None
    pruned_text: str
    sentences: list[dict[str, Any]] | None = None


class CohereDocument(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: str


class CohereRerankRequest(_Request):
    model: str | None = None
    query: str = Field(min_length=1)
    documents: list[str | CohereDocument]
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False


class CohereResult(BaseModel):
    index: int
    relevance_score: float
    document: dict[str, Any] | None = None


class CohereRerankResponse(BaseModel):
    id: str
    results: list[CohereResult]
    meta: dict[str, Any]


def _option_field(name: str) -> tuple[Any, Any]:
    """A request model's field for a CallOptions option: its type, None (or false) the
    model's default, its description the option's own (engine.inputs)."""
    choices = option_choices(name)
    kind = Literal[choices] if choices else option_type(name)     # type: ignore[valid-type]
    if name == "reorder":
        return bool, Field(False, description=option_help(name))
    return kind | None, Field(None, description=option_help(name))


#: `/v1/prune`'s body: the question, the passages, every CallOptions option, and the tags
PruneRequest = create_model(
    "PruneRequest", __base__=_Request,
    question=(str, Field(min_length=1, description="the question the passages are pruned for")),
    passages=(list[str], Field(description="the passages, one call")),
    **{name: _option_field(name) for name in OPTION_NAMES},
    pre=(str | None, Field(None, description="with post: each result's passage with its kept sentences tagged")),
    post=(str | None, Field(None, description="the tag after each kept sentence (with pre)")))


class PruneResponse(BaseModel):
    model: str
    results: list[dict[str, Any]]


# --------------------------------------------------------------------------- the app

def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """TEI's error body ({error, error_type}) with Cohere's `message` beside it."""
    return JSONResponse({"error": message, "error_type": kind, "message": message}, status_code=status,
                        headers=headers)


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
                return await _error(400, "Content-Length is not a number", "Validation")(scope, receive, send)
            if size > self.limit:
                return await _error(413, f"the body is {size} bytes; the limit is {self.limit}",
                                    "Validation")(scope, receive, send)
        body, more = bytearray(), True
        while more:
            try:
                message = await asyncio.wait_for(receive(), self.timeout)
            except asyncio.TimeoutError:
                return await _error(408, f"the body did not arrive within {self.timeout:g} s of its last part",
                                    "Validation")(scope, receive, send)
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await _error(413, f"the body is over the limit of {self.limit} bytes",
                                    "Validation")(scope, receive, send)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()
        await self.app(scope, replay, send)


def create_app(pruner: PrunerProtocol, config: ApiConfig = ApiConfig()) -> Any:
    """The ASGI app serving `pruner` (which it does not close: its owner does)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    family = pruner.family.name
    known_routes: set[str] = set()
    pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="prune-api")
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

    app = FastAPI(title="prune-engine", version=_version(), lifespan=lifespan,
                  description="Context pruning and semantic highlighting: TEI- and Cohere-compatible rerank, "
                              "and the engine's own prune endpoint (docs/http-api.md).")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return _error(422, f"the body is not valid JSON ({first.get('ctx', {}).get('error', 'invalid')} "
                               f"at character {first.get('loc', ('', '?'))[-1]})", "Validation")
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return _error(422, f"{where}: {first.get('msg', 'invalid')}", "Validation")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 400 and "parsing the body" in detail:
            detail = "the body cannot be read as JSON (is it UTF-8?)"
        return _error(exc.status_code, detail, "Validation" if exc.status_code < 500 else "Server")

    @app.middleware("http")
    async def _guard(request: Request, call_next):
        path = request.url.path
        route = path if path in known_routes else "other"     # bounded label values
        if config.api_key and path not in ("/health", "/metrics"):
            given = request.headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), config.api_key.encode()):
                requests.labels(route, "401").inc()
                return _error(401, "a valid API key is required: Authorization: Bearer KEY", "Unauthorized")
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
        return _error(429, f"{config.max_concurrent} requests are in flight; retry shortly", "Overloaded",
                      headers={"Retry-After": "1"})

    @app.exception_handler(asyncio.TimeoutError)
    async def _late(request: Request, exc: asyncio.TimeoutError):
        return _error(504, f"no answer within {config.request_timeout:g} s", "Timeout")

    @app.exception_handler(InputError)
    async def _bad(request: Request, exc: InputError):
        return _error(422, str(exc), "Validation")

    @app.exception_handler(PruneError)
    async def _failed(request: Request, exc: PruneError):
        return _error(503, str(exc), "Backend")

    def prune(question: str, texts: list[str], options: CallOptions | None = None) -> list[PruneResult]:
        results = pruner.prune(question, texts, options)
        passages.inc(len(texts))
        return results

    @app.post("/rerank", response_model=list[TeiRank], response_model_exclude_none=True, responses=ERRORS,
              summary="Rerank and prune texts (TEI's /rerank)")
    async def rerank(req: TeiRerankRequest):
        results = await run(prune, req.query, req.texts)
        ranked = sorted(results, key=lambda r: -rank_score(r, family, req.raw_scores))
        return [TeiRank(index=r.index, score=rank_score(r, family, req.raw_scores),
                        text=r.context if req.return_text else None, pruned_text=r.pruned_context,
                        sentences=[_sentence(s) for s in r.sentences] if req.return_sentences else None)
                for r in ranked]

    async def cohere(req: CohereRerankRequest):
        texts = [d if isinstance(d, str) else d.text for d in req.documents]
        results = await run(prune, req.query, texts)
        ranked = sorted(results, key=lambda r: -rank_score(r, family, False))[:req.top_n]
        return CohereRerankResponse(
            id=str(uuid.uuid4()),
            results=[CohereResult(index=r.index, relevance_score=rank_score(r, family, False),
                                  document={"text": r.context} if req.return_documents else None)
                     for r in ranked],
            meta={"api_version": {"version": "2"}, "billed_units": {"search_units": 1}})

    app.post("/v2/rerank", response_model=CohereRerankResponse, response_model_exclude_none=True, responses=ERRORS,
             summary="Rerank documents (Cohere's v2 rerank)")(cohere)
    app.post("/v1/rerank", response_model=CohereRerankResponse, response_model_exclude_none=True, responses=ERRORS,
             summary="Rerank documents (Cohere's v1 rerank)")(cohere)

    @app.post("/v1/prune", response_model=PruneResponse, responses=ERRORS,
              summary="Prune passages: the engine's full result")
    async def prune_endpoint(req: PruneRequest):
        options = CallOptions.of(**{name: getattr(req, name) for name in OPTION_NAMES})
        results = await run(prune, req.question, req.passages, options)
        out = []
        for r in results:
            d = r.to_dict()
            if req.pre is not None or req.post is not None:
                d["highlighted"] = r.highlight(req.pre or "", req.post or "")
            out.append(d)
        return PruneResponse(model=config.model_name, results=out)

    @app.get("/health", summary="200 when a real inference answers, 503 otherwise",
             responses={503: {"model": ErrorBody, "description": "the engine did not answer"}})
    async def health():
        try:
            await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(
                pool, lambda: pruner.prune("Is the engine up?", ["The engine is up."])), 5.0)
        except Exception as exc:
            return _error(503, f"the engine did not answer: {type(exc).__name__}: {exc}"[:500], "Unhealthy")
        return {"status": "ok"}

    @app.get("/info", summary="model, family, limits, version")
    async def info():
        fam = pruner.family
        defaults = {"threshold": fam.default_threshold(fam.lexical_weight), "lexical_weight": fam.lexical_weight,
                    "threshold_without_lexical": fam.threshold, "title": fam.title, "alpha": fam.backoff_alpha,
                    "windows": fam.windows, "passage_margin": fam.passage_margin}
        return {"model": config.model_name, "family": family, "defaults": defaults, "engine": pruner.describe(),
                "max_length": pruner.spec.max_length, "limits": pruner.limits.to_dict(),
                "max_body_bytes": config.max_body_bytes, "max_concurrent": config.max_concurrent,
                "request_timeout": config.request_timeout, "version": _version()}

    @app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
    async def metrics():
        return PlainTextResponse(generate_latest(registry), media_type="text/plain; version=0.0.4")

    known_routes.update(r.path for r in app.routes)
    return _BodyLimit(app, config.max_body_bytes, config.body_timeout)


def _sentence(s) -> dict[str, Any]:
    return {"text": s.text, "start": s.start, "end": s.end, "probability": s.probability, "kept": s.kept}


def _version() -> str:
    import engine
    return engine.__version__
