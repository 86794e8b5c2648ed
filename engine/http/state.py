"""The HTTP API's state: what its handlers serve from (`engine.http.app` puts an `ApiState`
on `app.state.api`), each part a plain object a test can make and drive alone: the config,
the engine's health, the metrics, the requests in flight and the worker pool the pruner
runs in."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from engine.pipeline.results import PruneResult
from engine.errors import Cancelled, InputError, PruneError
from engine.pipeline.families import Family
from engine.pipeline.inputs import CallOptions
from engine.pipeline.encode import unknown_warning
from engine.http.served import Served
from engine.pipeline.lingua_decide import CompressResult
from engine.protocol import CompressorProtocol, PrunerProtocol
from engine.cancellation import run_cancellable
from engine.settings import DEFAULTS


@dataclass(frozen=True)
class ApiConfig:
    """How the API serves: the key, worker threads, limits and the model's public name."""

    api_key: str | None = None
    workers: int = 1
    max_concurrent: int = DEFAULTS.max_concurrent
    request_timeout: float = DEFAULTS.request_timeout
    max_body_bytes: int = DEFAULTS.max_body_bytes
    body_timeout: float = 10.0  # seconds the body may take to arrive
    model_name: str = "prune-engine"
    compressor_name: str = "llmlingua2"  # the public name of a compressor beside the pruner (--compressor)
    model_service: str | None = None  # host:port of Milvus's model service (gRPC), or none

    def authorizes(self, credentials: str | None) -> bool:
        """Whether a call whose `Authorization` (HTTP's header, gRPC's metadata) is
        `credentials` may pass: always without an API key; with one, the scheme `Bearer` in
        any case (schemes are case-insensitive, RFC 9110), whitespace, then the key exactly
        (compared in constant time). The one rule of both surfaces."""
        if not self.api_key:
            return True
        scheme, _, token = (credentials or "").strip().partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        return hmac.compare_digest(token.encode(), self.api_key.encode())


#: seconds a successful request vouches for the engine's health (docs/http-api.md)
HEALTH_FRESH_S = 2.0


class Busy(Exception):
    """A request refused because `max_concurrent` requests are in flight (429)."""

    def __init__(self, limit: int):
        super().__init__(f"{limit} requests are in flight; retry shortly")


class Health:
    """What `/health` knows of the engine. A request that succeeded within HEALTH_FRESH_S
    vouches for it (and no engine failure since); otherwise a real inference of its own
    answers, on a thread of its own, never queued behind user requests in the worker pool,
    one at a time (concurrent checks share it), within the request timeout. So readiness
    does not flap when the server is busy, and still turns 503 when the engine fails."""

    def __init__(self, probe: Callable[[], Any], timeout: float):
        #: the health inference (engine.http.served.Served.probe: a pruner's prune call, a compressor's compress)
        self.probe, self.timeout = probe, timeout
        self.ok_at: float | None = None
        self.failed_at: float | None = None
        self._probe: asyncio.Future | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prune-health")

    def succeeded(self) -> None:
        """A request was answered now."""
        self.ok_at = time.monotonic()

    def failed(self, exc: BaseException) -> None:
        """The engine failed a request now."""
        self.failed_at = time.monotonic()

    async def check(self) -> str:
        """'requests' or 'probe' when the engine answers; raises when it does not."""
        now = time.monotonic()
        if (
            self.ok_at is not None
            and now - self.ok_at < HEALTH_FRESH_S
            and (self.failed_at is None or self.failed_at < self.ok_at)
        ):
            return "requests"
        if self._probe is None or self._probe.done():
            loop = asyncio.get_running_loop()
            self._probe = loop.run_in_executor(self._pool, self.probe)
        await asyncio.wait_for(asyncio.shield(self._probe), self.timeout)
        self.failed_at = None  # the engine answers again; only user requests vouch for it
        return "probe"

    def close(self) -> None:
        """Stop the probe's thread (a probe under way is not waited for)."""
        self._pool.shutdown(wait=False)


class Metrics:
    """The API's Prometheus metrics, in a registry of the app's own."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter(
            "prune_api_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.grpc_requests = Counter(
            "prune_api_grpc_requests",
            "calls of Milvus's model service (gRPC) by route and status code",
            ["route", "code"],
            registry=self.registry,
        )
        self.truncated = Counter(
            "prune_api_truncated_texts",
            "texts of Embedding calls cut to the encoder's window",
            registry=self.registry,
        )
        self.latency = Histogram(
            "prune_api_request_seconds",
            "request latency by route",
            ["route"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.passages = Counter("prune_api_passages", "passages pruned", registry=self.registry)
        self.in_flight = Gauge("prune_api_in_flight", "requests being served", registry=self.registry)

    def watch_devices(self, reports: Callable[[], dict[str, dict]]) -> None:
        """Export the served models' device figures (`reports()`: role -> GpuGraphBackend.report)
        as gauges, read at each scrape."""
        self.registry.register(_DeviceCollector(reports))

    def text(self) -> bytes:
        """Every metric in Prometheus' text format."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _DeviceCollector:
    """The GPU graph's figures at scrape time: memory budget, weights, each captured shape's bytes
    and capture seconds, what is held, merged runs (label `model`: the served model, or the
    compressor beside it)."""

    def __init__(self, reports: Callable[[], dict[str, dict]]):
        self.reports = reports

    def describe(self) -> list:
        """Nothing up front: the families depend on what is loaded (prometheus_client's rule)."""
        return []

    def collect(self):
        """One family per figure, a sample per model (and shape)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            reports = self.reports()
        except Exception:  # a scrape never fails on the device's figures
            return
        plain = {
            "prune_gpu_budget_bytes": ("device memory the model may hold (gpu_memory)", "budget_bytes"),
            "prune_gpu_weights_bytes": ("device bytes of the one copy of the weights", "weights_bytes"),
            "prune_gpu_held_bytes": ("device bytes held: weights, dynamic session, shapes", "total_bytes"),
            "prune_gpu_captured_shapes": ("shapes captured as CUDA graphs", "captured"),
        }
        for name, (doc, key) in plain.items():
            family = GaugeMetricFamily(name, doc, labels=["model"])
            for role, r in reports.items():
                if r.get(key) is not None:
                    family.add_metric([role], float(r[key]))
            yield family
        shape_bytes = GaugeMetricFamily(
            "prune_gpu_shape_bytes", "device bytes of a captured shape", labels=["model", "shape"]
        )
        seconds = GaugeMetricFamily(
            "prune_gpu_capture_seconds",
            "seconds a shape took to build and capture",
            labels=["model", "shape"],
        )
        for role, r in reports.items():
            for s in r.get("shapes", []):
                shape = f"{s['rows']}x{s['length']}"
                seconds.add_metric([role, shape], float(s["capture_seconds"]))
                if s["bytes"] is not None:
                    shape_bytes.add_metric([role, shape], float(s["bytes"]))
        yield shape_bytes
        yield seconds
        runs = CounterMetricFamily(
            "prune_gpu_merged_runs", "model runs that merged concurrent calls", labels=["model"]
        )
        batches = CounterMetricFamily(
            "prune_gpu_merged_batches", "callers' batches those runs carried", labels=["model"]
        )
        for role, r in reports.items():
            runs.add_metric([role], float(r.get("merged_runs", 0)))
            batches.add_metric([role], float(r.get("merged_batches", 0)))
        yield runs
        yield batches


class InFlight:
    """The requests being served: at most `limit` at once, counted on the event loop (so
    without a lock) and mirrored in the metrics' gauge."""

    def __init__(self, limit: int, gauge: Any):
        self.limit, self.gauge, self.count = limit, gauge, 0

    @contextlib.contextmanager
    def slot(self):
        """One of the `limit` places, held for the with-block; Busy when every one is taken."""
        if self.count >= self.limit:
            raise Busy(self.limit)
        self.count += 1
        self.gauge.inc()
        try:
            yield
        finally:
            self.count -= 1
            self.gauge.dec()


class UnknownText:
    """The API's log line (logger `prune.api`, WARNING) for calls whose passages are largely
    unknown to the model's vocabulary (engine.pipeline.encode): the first such call's line,
    then at most one every `every` seconds, counting the calls since the last one."""

    def __init__(self, every: float = 60.0):
        self.every, self.last, self.since = every, -math.inf, 0
        self._lock = threading.Lock()

    def note(self, results: list[PruneResult]) -> None:
        """Log the line `results` warrant, unless one was logged within `every` seconds."""
        line = unknown_warning(results)
        if line is None:
            return
        with self._lock:
            self.since += 1
            now = time.monotonic()
            if now - self.last < self.every:
                return
            calls, self.since, self.last = self.since, 0, now
        more = f" ({calls} calls like it since the last such line)" if calls > 1 else ""
        logging.getLogger("prune.api").warning("%s%s", line, more)


@dataclass
class ApiState:
    """What the handlers serve from (`app.state.api`): the model served (typed by its jobs:
    engine.http.served.Served), the config, the worker pool, health, metrics, the requests in
    flight, and the app's routes (the metrics' label values)."""

    served: Served
    config: ApiConfig
    pool: ThreadPoolExecutor
    health: Health
    metrics: Metrics
    in_flight: InFlight
    routes: frozenset[str] = frozenset()
    embedder: Any = None  # the retrieval encoder Milvus's Embedding calls use, if any
    log: Callable[[str], None] | None = None  # where the server's own notes go (the CLI's stderr)
    #: the routes this model does not serve, each with why (Served.refusal): a 404
    refused: dict[str, str] = field(default_factory=dict)
    #: the log line of calls on text the model's vocabulary largely lacks
    unknown: UnknownText = field(default_factory=UnknownText)

    @classmethod
    def of(
        cls,
        served: Served,
        config: ApiConfig,
        routes: frozenset[str] = frozenset(),
        embedder: Any = None,
        log: Callable[[str], None] | None = None,
    ) -> ApiState:
        """The state of an app serving `served` (and `embedder`) as `config` says."""
        metrics = Metrics()
        state = cls(
            served=served,
            config=config,
            routes=routes,
            embedder=embedder,
            log=log,
            pool=ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="prune-api"),
            health=Health(served.probe, timeout=config.request_timeout),
            metrics=metrics,
            in_flight=InFlight(config.max_concurrent, metrics.in_flight),
        )
        metrics.watch_devices(served.reports)
        return state

    @property
    def pruner(self) -> PrunerProtocol:
        """The pruner served (a route of the pruning job reaches a handler only where there is one:
        the guard refuses it otherwise)."""
        if self.served.pruner is None:
            raise LookupError("no pruner is served")
        return self.served.pruner

    @property
    def compressor(self) -> CompressorProtocol:
        """The compressor served, or beside the pruner (as `pruner`, for the compressing job's routes)."""
        if self.served.compressor is None:
            raise LookupError("no compressor is served")
        return self.served.compressor

    @property
    def family(self) -> Family:
        """The pruner's family (its scores' meaning, its defaults)."""
        return self.pruner.family

    async def prune(
        self, question: str, texts: list[str], options: CallOptions | None = None
    ) -> list[PruneResult]:
        """One call of the pruner in the worker pool (`in_pool`)."""
        return await self.in_pool(self._prune_now, question, texts, options)

    async def in_pool(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` in the worker pool, at most `max_concurrent` at once (Busy past it),
        within the deadline (asyncio.TimeoutError past it). A call given up on (past the
        deadline, or its caller gone) is told to stop (engine.cancellation.run_cancellable): a call still queued
        never starts, one running stops at its next batch, so the pool is free again within
        one batch's time."""
        with self.in_flight.slot():
            stop = threading.Event()
            future = asyncio.get_running_loop().run_in_executor(self.pool, run_cancellable, stop, fn, *args)
            try:
                return await asyncio.wait_for(future, self.config.request_timeout)
            except BaseException:
                stop.set()
                raise

    def _prune_now(self, question: str, texts: list[str], options: CallOptions | None) -> list[PruneResult]:
        """The call itself, on a worker thread; health and the passages' count are told."""
        try:
            results = self.pruner.prune(question, texts, options)
        except PruneError as exc:
            if not isinstance(exc, (InputError, Cancelled)):
                self.health.failed(exc)
            raise
        self.health.succeeded()
        self.metrics.passages.inc(len(texts))
        self.unknown.note(results)
        return results

    async def prune_many(self, queries: list[dict[str, Any]]) -> list[list[PruneResult]]:
        """Several calls at once (`prune_many`: their blocks batched together) as one request
        in the pool (`in_pool`); the first bad call's error raised."""
        return await self.in_pool(self._prune_many_now, queries)

    def _prune_many_now(self, queries: list[dict[str, Any]]) -> list[list[PruneResult]]:
        try:
            out: list[list[PruneResult]] = []
            for each in self.pruner.prune_many(queries):
                if isinstance(each, Exception):
                    raise each
                out.append(each)
        except PruneError as exc:
            if not isinstance(exc, (InputError, Cancelled)):
                self.health.failed(exc)
            raise
        self.health.succeeded()
        self.metrics.passages.inc(sum(len(q["passages"]) for q in queries))
        for results in out:
            self.unknown.note(results)
        return out

    async def compress(self, context: str | list[str], arguments: dict[str, Any]) -> CompressResult:
        """One call of the compressor in the worker pool (`in_pool`), with compress_prompt's keyword
        `arguments`: its CompressResult."""
        return await self.in_pool(self._compress_now, context, arguments)

    def _compress_now(self, context: str | list[str], arguments: dict[str, Any]) -> CompressResult:
        try:
            result = self.compressor.compress(context, **arguments)
        except PruneError as exc:
            if not isinstance(exc, (InputError, Cancelled)):
                self.health.failed(exc)
            raise
        self.health.succeeded()
        self.metrics.passages.inc(1 if isinstance(context, str) else len(context))
        return result

    def score(self, r: PruneResult, raw: bool) -> float:
        """A result's score as the rerank endpoints give it (in [0, 1] unless `raw`)."""
        return self.family.rank_score(r.reranking_score, raw)

    def close(self) -> None:
        """Drain the worker pool (what is in flight finishes) and stop the health probe."""
        self.pool.shutdown(wait=True)
        self.health.close()
