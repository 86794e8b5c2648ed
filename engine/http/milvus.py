"""Milvus's model service: the gRPC contract Milvus 2.6.8+ calls for semantic highlighting
(and for its zilliz rerank and text-embedding functions), served by the engine.

Milvus's `SemanticHighlighter` has one provider, a gRPC client of `model_service.proto`
(vendored in engine/http/proto/, source and licence in its header). A self-hosted Milvus
whose milvus.yaml sets `function.models.zilliz.endpoint: HOST:PORT` calls this server
(docs/milvus.md). What Milvus's client (internal/util/function/models/zilliz) does, and so
what this server answers:
- plaintext HTTP/2, every request gzip-compressed; messages up to 100 MiB; keepalive pings
  every 30 s even without calls (permitted here, so the connection is not torn down);
- metadata `instance-id`, `model-deployment-id`, `db-name`, never an API key (so a server
  with `--api-key` asks for `authorization: Bearer KEY` metadata, which Milvus cannot send);
- it never reads `Status`: errors are gRPC status codes (INVALID_ARGUMENT for a bad param or
  input, RESOURCE_EXHAUSTED when busy, DEADLINE_EXCEEDED, UNAVAILABLE when the engine
  fails), and a success carries `Status{code: 0}`;
- `Highlight`: one RPC per search query with all its hits, params as strings (`threshold`,
  `pre_tags`/`post_tags` as JSON lists, both or neither, `highlight_only` "True"/"true", and `queries`,
  `input_fields`, ... which are ignored). One request is one call of the pruner: each
  result's sentences are what `/v1/prune` keeps for the same question, documents and
  threshold, tagged, with their probabilities as `scores` (always as many as sentences:
  Milvus 2.6.9+ refuses otherwise);
- `Rerank`: one score per document, `/rerank`'s;
- `Embedding`: the texts' embeddings as little-endian float32 `dense` vectors, from the
  retrieval encoder the server was given (UNIMPLEMENTED without one); a text over the
  encoder's window is cut to it (counted, logged) unless the function's params say
  `truncate` false (its params arrive as strings, with `input_type`).

The servicers run on the HTTP API's event loop and share its `ApiState`: the same worker
pool, limits, deadline (a call past it stops at its next batch), API key rule and metrics
(their own counter, by the RPC's path and gRPC status code).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from engine.errors import InputError, PruneError
from engine.pipeline.inputs import CallOptions, check_tags
from engine.http.state import ApiState, Busy

PACKAGE = "milvus.proto.modelservice"
#: what Milvus's client sends and accepts at most: the server takes as much
MILVUS_MAX_MESSAGE = 100 * 1024 * 1024
DEFAULT_TAGS = (["<em>"], ["</em>"])  # Milvus's highlighters' own default tags


#: the vendored proto, by the package-qualified name it registers under in protobuf's pool (a
#: bare `model_service.proto` could meet another library's file of that name there)
PROTO = "engine/http/proto/model_service.proto"


def proto_modules() -> tuple[Any, Any]:
    """The vendored proto's message and service modules (parsed when first asked, by
    grpcio-tools, from the installed package: registered as PROTO)."""
    import sys
    from pathlib import Path

    import grpc

    try:
        import grpc_tools  # noqa: F401
    except ImportError as exc:
        raise PruneError(
            "the model service needs grpcio-tools: pip install 'prune-engine[model-service]'"
        ) from exc
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the engine package
    sys.path.insert(0, root)
    try:
        return grpc.protos_and_services(PROTO)
    finally:
        sys.path.remove(root)


@dataclass(frozen=True)
class HighlightParams:
    """A Highlight call's params, read from Milvus's strings."""

    options: CallOptions
    pre: list[str]
    post: list[str]
    highlight_only: bool

    @classmethod
    def parse(cls, params: dict[str, str]) -> HighlightParams:
        """The params Milvus forwards (strings), checked; InputError naming the bad one."""
        raw = {k.lower(): v for k, v in params.items()}
        threshold = None
        if raw.get("threshold", "").strip():
            try:
                threshold = float(raw["threshold"])
            except ValueError:
                raise InputError(f"threshold: {raw['threshold']!r} is not a number") from None
        check_tags(raw.get("pre_tags"), raw.get("post_tags"), ("pre_tags", "post_tags"))
        pre = _tags(raw, "pre_tags", DEFAULT_TAGS[0])
        post = _tags(raw, "post_tags", DEFAULT_TAGS[1])
        return cls(
            options=CallOptions.of(threshold=threshold),
            pre=pre,
            post=post,
            highlight_only=_boolean(raw, "highlight_only", True),
        )


def _tags(raw: dict[str, str], name: str, default: list[str]) -> list[str]:
    """A JSON list of strings (as pymilvus and the Java SDK send tags), or the default."""
    if name not in raw:
        return default
    try:
        tags = json.loads(raw[name])
    except json.JSONDecodeError:
        raise InputError(f"{name}: {raw[name]!r} is not a JSON list of strings") from None
    if not isinstance(tags, list) or not tags or not all(isinstance(t, str) for t in tags):
        raise InputError(f"{name}: {raw[name]!r} is not a non-empty JSON list of strings")
    return tags


def _boolean(raw: dict[str, str], name: str, default: bool) -> bool:
    """What Go's strconv.ParseBool takes, as Milvus reads its own boolean params: 'True'/'true'/
    't'/'1' or 'False'/'false'/'f'/'0' (pymilvus sends str(bool), Java lower case)."""
    value = raw.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("true", "t", "1"):
        return True
    if value in ("false", "f", "0"):
        return False
    raise InputError(f"{name}: {raw[name]!r} is not a boolean (true or false)")


@dataclass(frozen=True)
class EmbeddingParams:
    """An Embedding call's params, read from Milvus's strings (its zilliz text-embedding
    function forwards the function's params, and `input_type`, which changes nothing here)."""

    truncate: bool = True  # a text over the window is cut to it; false: refused (INVALID_ARGUMENT)
    direction: str = "right"  # which end is kept: right (the start, the default) or left (the end)

    @classmethod
    def parse(cls, params: dict[str, str]) -> EmbeddingParams:
        """`truncate` (true/false as Milvus's own TEI function reads it) and
        `truncation_direction` (Left or Right, TEI's values); InputError naming the bad one."""
        raw = {k.lower(): v for k, v in params.items()}
        direction = raw.get("truncation_direction", "").strip().lower() or "right"
        if direction not in ("left", "right"):
            raise InputError(f"truncation_direction: {raw['truncation_direction']!r} is not Left or Right")
        return cls(truncate=_boolean(raw, "truncate", True), direction=direction)


class NotServed(Exception):
    """An RPC this server has no model for (UNIMPLEMENTED)."""


class ModelService:
    """The three services' handlers over one ApiState (and an optional retrieval encoder)."""

    def __init__(self, api: ApiState, pb: Any, embedder: Any = None):
        self.api, self.pb, self.embedder = api, pb, embedder

    async def highlight(self, request: Any, context: Any) -> Any:
        """One query and its hits: each hit's kept sentences, tagged, with their probabilities."""
        params = HighlightParams.parse(dict(request.params))
        docs = list(request.documents)
        results = await self.api.prune(request.query, docs, params.options) if docs else []
        out = []
        for r in results:
            sentences, scores = r.fragments(params.pre, params.post, whole=not params.highlight_only)
            out.append(self.pb.HighlightResult(sentences=sentences, scores=scores))
        return self.pb.HighlightResponse(status=self.pb.Status(code=0), results=out)

    async def rerank(self, request: Any, context: Any) -> Any:
        """One score per document, in order: /rerank's."""
        docs = list(request.documents)
        results = await self.api.prune(request.query, docs) if docs else []
        return self.pb.TextRerankResponse(
            status=self.pb.Status(code=0), scores=[self.api.score(r, False) for r in results]
        )

    async def embedding(self, request: Any, context: Any) -> Any:
        """Each text's embedding, little-endian float32, from the retrieval encoder."""
        if self.embedder is None:
            raise NotServed(
                "this server has no embedding model: its pruning model scores sentences, it does not "
                "embed; give prune api --encoder FOLDER (prune export --encoder makes one), or serve "
                "--model default, which brings its encoder"
            )
        texts = list(request.texts)
        self.api.pruner.limits.check_count(len(texts), "texts in one request")
        vectors = await self.api.in_pool(self._embed, texts, EmbeddingParams.parse(dict(request.params)))
        dense = self.pb.DenseVector.DType.Value("DTYPE_FLOAT")
        return self.pb.TextEmbeddingResponse(
            status=self.pb.Status(code=0),
            results=[
                self.pb.EmbeddingResult(
                    dense=self.pb.DenseVector(dtype=dense, data=v.astype("<f4").tobytes(), dim=len(v))
                )
                for v in vectors
            ],
        )

    def _embed(self, texts: list[str], params: EmbeddingParams) -> Any:
        """The texts' embeddings, on a worker thread: a text over the encoder's window is cut
        to it (counted in the metrics, logged once per call) or, with truncate false, refused."""
        ids, cut = self.embedder.tokenize(texts, truncate=params.direction if params.truncate else None)
        if cut:
            self.api.metrics.truncated.inc(len(cut))
            logging.getLogger("prune.api").warning(
                "Embedding: %d of %d texts were longer than the encoder's window (%d tokens) and were cut to it, "
                "keeping their %s (text %s; the param truncate=false refuses them instead)",
                len(cut),
                len(texts),
                self.embedder.max_length,
                "start" if params.direction == "right" else "end",
                ", ".join(map(str, cut[:5])) + (", ..." if len(cut) > 5 else ""),
            )
        return self.embedder.embed(ids)


def _grpc() -> Any:
    import grpc

    return grpc


def _guarded(api: ApiState, route: str, handler: Callable[[Any, Any], Awaitable[Any]]):
    """`handler` with the API's key, metrics and error codes around it."""
    grpc = _grpc()

    async def call(request: Any, context: Any) -> Any:
        t0, code = time.perf_counter(), grpc.StatusCode.OK
        try:
            if not api.config.authorizes(dict(context.invocation_metadata() or ()).get("authorization")):
                raise Unauthenticated("a valid API key is required: metadata authorization: Bearer KEY")
            return await handler(request, context)
        except Exception as exc:  # noqa: BLE001  (each becomes its status code)
            code, message = _status_of(exc)
            await context.abort(code, message)
        finally:
            api.metrics.latency.labels(route).observe(time.perf_counter() - t0)
            api.metrics.grpc_requests.labels(route, code.name).inc()

    return call


class Unauthenticated(Exception):
    """A call without the API key (UNAUTHENTICATED)."""


def _status_of(exc: Exception) -> tuple[Any, str]:
    """The gRPC status code and message an error answers with."""
    grpc = _grpc()
    for kind, code in (
        (InputError, grpc.StatusCode.INVALID_ARGUMENT),
        (Busy, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (NotServed, grpc.StatusCode.UNIMPLEMENTED),
        (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    ):
        if isinstance(exc, kind):
            return code, str(exc)
    if isinstance(exc, asyncio.TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, "no answer within the request timeout"
    if isinstance(exc, PruneError):
        return grpc.StatusCode.UNAVAILABLE, f"the engine failed: {exc}"
    logging.getLogger("prune.api").error("model service: unexpected error", exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"an unexpected server error: {type(exc).__name__}"


#: service -> (its RPC, the ModelService handler, the request and response messages)
ROUTES = {
    "HighlightService": ("Highlight", "highlight", "HighlightRequest", "HighlightResponse"),
    "RerankService": ("Rerank", "rerank", "TextRerankRequest", "TextRerankResponse"),
    "TextEmbeddingService": ("Embedding", "embedding", "TextEmbeddingRequest", "TextEmbeddingResponse"),
}


async def start(api: ApiState, address: str, embedder: Any = None) -> Any:
    """The model service serving on `address` (host:port) on the running event loop."""
    grpc = _grpc()
    pb, _ = proto_modules()
    service = ModelService(api, pb, embedder)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", min(api.config.max_body_bytes, MILVUS_MAX_MESSAGE)),
            ("grpc.max_send_message_length", MILVUS_MAX_MESSAGE),
            ("grpc.keepalive_permit_without_calls", 1),  # Milvus pings every 30 s, idle or not
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ("grpc.http2.max_ping_strikes", 0),
        ]
    )
    handlers = []
    for name, (method, attr, request_name, response_name) in ROUTES.items():
        request, response = getattr(pb, request_name), getattr(pb, response_name)
        rpc = grpc.unary_unary_rpc_method_handler(
            _guarded(api, f"/{PACKAGE}.{name}/{method}", getattr(service, attr)),
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
        handlers.append(grpc.method_handlers_generic_handler(f"{PACKAGE}.{name}", {method: rpc}))
    server.add_generic_rpc_handlers(handlers)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise PruneError(f"the model service cannot listen on {address}: {exc}") from exc
    if not port:
        raise PruneError(f"the model service cannot listen on {address} (in use?)")
    await server.start()
    host, _, asked = address.rpartition(":")
    if asked == "0" and api.log:  # the port the system chose is the one a client needs
        api.log(f"Milvus's model service listening on {host}:{port} (gRPC)")
    return server


def address(host: str, port: int) -> str:
    """host:port as gRPC takes it (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
