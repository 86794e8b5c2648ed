"""One model on several Triton replicas: the client side of running at scale.

    pruner = Pruner.connect(["10.0.0.5:8001", "10.0.0.6:8001"], "default_text")
    pruner = Pruner.connect("dns:///prune-triton-headless.prune.svc:8001", "default_text")

A `ReplicaSet` is a `Transport` (`engine.triton.client`), as a single server's
`TritonClient` is, so the text-model pruner and the core backend run on it unchanged. Every
request goes to the ready replica with the fewest requests outstanding (ties in turn). A replica that fails with a
connection error or a timeout is taken out at once and the request is sent to another
(inference is idempotent: nothing is counted twice, because a request's result is used
exactly once, where its caller waits for it). A health thread probes every replica each
`health_interval` seconds and takes a replica back when its server and model are ready
again; a `dns:///name:port` endpoint is resolved again each `resolve_interval` seconds, so
replicas that a headless Kubernetes Service adds or removes are followed.

A replica whose model differs from the others' (another manifest: another model or
version behind the same name) is refused, so one call never mixes two models' decisions.

A failed request is not retried on the same replica with backoff (a single server's
`retries`/`backoff`): it goes to the next ready replica, and waits for one to come back
when none is, until the call's deadline.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from engine.triton.client import TritonClient, retryable
from engine.errors import BackendError, ModelLoadError

DNS_SCHEME = "dns:///"


def parse_endpoints(url: str | Sequence[str]) -> tuple[list[str], str | None]:
    """(endpoints, dns name or None) from a list, a comma-separated string or `dns:///host:port`."""
    if isinstance(url, str):
        if url.startswith(DNS_SCHEME):
            return resolve(url[len(DNS_SCHEME) :]), url[len(DNS_SCHEME) :]
        url = [u for u in url.split(",")]
    endpoints = [u.strip() for u in url]
    if not endpoints or any(not u or ":" not in u for u in endpoints):
        raise ModelLoadError(f"endpoints must be host:port, got {list(url)!r}")
    if len(set(endpoints)) != len(endpoints):
        raise ModelLoadError(f"the same endpoint is given twice: {endpoints}")
    return endpoints, None


def is_replicated(url: str | Sequence[str]) -> bool:
    """Whether `url` names several servers (a list, commas, or dns:///)."""
    return not isinstance(url, str) or url.startswith(DNS_SCHEME) or "," in url


def resolve(name: str) -> list[str]:
    """Every address a `host:port` name resolves to (a headless Service: one per ready pod)."""
    host, _, port = name.rpartition(":")
    if not host or not port.isdigit():
        raise ModelLoadError(f"dns:/// endpoints are host:port, got {name!r}")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise BackendError(f"cannot resolve {host!r}: {exc}") from exc
    addrs = sorted({i[4][0] for i in infos if i[0] == socket.AF_INET}) or sorted(
        {i[4][0] for i in infos if i[0] == socket.AF_INET6}
    )  # one family: no double counting
    return [f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in addrs]


@dataclass
class Replica:
    """One server of a replica set: its client, readiness and load."""

    endpoint: str
    ready: bool = False
    client: TritonClient | None = None
    outstanding: int = 0
    served: int = 0  # requests it answered
    failed: int = 0  # requests that failed over from it
    removals: int = 0
    readmissions: list[float] = field(default_factory=list)  # monotonic times it came back
    down_since: float | None = None
    reason: str = ""


class ReplicaSet:
    """A client of one model on several Triton servers (see the module's docstring)."""

    def __init__(
        self,
        url: str | Sequence[str],
        model: str,
        *,
        protocol: str = "grpc",
        version: str = "",
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        concurrency: int = 8,
        ready_timeout: float = 10.0,
        try_timeout: float | None = None,
        health_interval: float = 0.5,
        resolve_interval: float = 10.0,
        log: Callable[[str], None] | None = None,
    ):
        endpoints, self.dns_name = parse_endpoints(url)
        self.model, self.protocol, self.version = model, protocol, version
        self.timeout, self.try_timeout, self.concurrency = timeout, try_timeout, concurrency
        self.health_interval, self.resolve_interval = health_interval, resolve_interval
        self.log = log or (lambda m: None)
        self._client_kwargs = dict(
            protocol=protocol,
            version=version,
            timeout=timeout,
            retries=0,
            backoff=backoff,
            concurrency=concurrency,
        )
        self._lock = threading.Lock()
        self._ready_event = threading.Condition(self._lock)
        self._turn = 0
        self.replicas: dict[str, Replica] = {e: Replica(e) for e in endpoints}
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="replicas")
        # the first replica that is ready defines the model every other must serve
        if protocol != "grpc":
            raise ModelLoadError(
                "several endpoints need protocol='grpc' (an HTTP client belongs to the "
                "thread that made it); behind one HTTP load balancer, connect to its URL"
            )
        first, first_replica, errors = None, None, []
        deadline = time.monotonic() + ready_timeout
        while first is None:
            for r in self.replicas.values():
                try:
                    first, first_replica = self._open(r, ready_timeout=min(2.0, ready_timeout)), r
                    break
                except Exception as exc:
                    errors.append(f"{r.endpoint}: {exc}")
            if first is None and time.monotonic() > deadline:
                raise BackendError(
                    f"no replica of model {model!r} is ready after {ready_timeout:.0f} s: "
                    + "; ".join(errors[-len(self.replicas) :])
                )
        self.reference = first
        self.tc, self.config = first.tc, first.config
        self.max_batch_size, self.metadata_inputs = first.max_batch_size, first.metadata_inputs
        self.metadata_outputs = first.metadata_outputs
        self._admit(first_replica, first)
        for r in self.replicas.values():
            if not r.ready:
                self._try_admit(r, ready_timeout=1.0)
        self._stop = threading.Event()
        self._health = threading.Thread(target=self._watch, name="replica-health", daemon=True)
        self._health.start()

    # ------------------------------------------------------------------ replicas
    def _open(self, r: Replica, ready_timeout: float) -> TritonClient:
        return TritonClient(r.endpoint, self.model, ready_timeout=ready_timeout, **self._client_kwargs)

    def _same_model(self, client: TritonClient) -> bool:
        ref = self.reference
        return (
            client.parameters().get("prune_manifest") == ref.parameters().get("prune_manifest")
            and client.metadata_inputs == ref.metadata_inputs
            and client.metadata_outputs == ref.metadata_outputs
        )

    def _admit(self, r: Replica, client: TritonClient) -> None:
        with self._lock:
            old, r.client = r.client, client
            if not r.ready and r.down_since is not None:
                r.readmissions.append(time.monotonic())
                self.log(
                    f"replica {r.endpoint} is back ({time.monotonic() - r.down_since:.1f} s after it left)"
                )
            r.ready, r.down_since, r.reason = True, None, ""
            self._ready_event.notify_all()
        if old is not None and old is not client and old is not getattr(self, "reference", None):
            old.close()

    def _try_admit(self, r: Replica, ready_timeout: float) -> bool:
        try:
            client = self._open(r, ready_timeout=ready_timeout)
        except Exception as exc:
            self._remove(r, f"not ready: {exc}", count=False)
            return False
        if not self._same_model(client):
            client.close()
            self._remove(
                r,
                f"serves another model behind the name {self.model!r} (manifest differs): refused",
                count=False,
            )
            return False
        self._admit(r, client)
        return True

    def _remove(self, r: Replica, why: str, count: bool = True) -> None:
        with self._lock:
            if r.ready:
                r.ready, r.down_since, r.removals = False, time.monotonic(), r.removals + 1
                self.log(f"replica {r.endpoint} taken out: {why}")
            elif r.down_since is None:
                r.down_since = time.monotonic()
            r.reason = why
            if count:
                r.failed += 1

    def _watch(self) -> None:
        """Probe every replica; take back those that are ready again; follow DNS."""
        last_resolve = time.monotonic()
        while not self._stop.wait(self.health_interval):
            if self.dns_name and time.monotonic() - last_resolve > self.resolve_interval:
                last_resolve = time.monotonic()
                self._follow_dns()
            for r in list(self.replicas.values()):
                if self._stop.is_set():
                    return
                if r.ready:
                    client = r.client
                    if client is not None and not client.health():
                        self._remove(r, "health check failed", count=False)
                else:
                    self._try_admit(r, ready_timeout=min(0.5, self.health_interval))

    def _follow_dns(self) -> None:
        try:
            endpoints = set(resolve(self.dns_name or ""))
        except Exception as exc:
            self.log(f"cannot resolve {self.dns_name}: {exc}; keeping the known replicas")
            return
        with self._lock:
            for e in endpoints - set(self.replicas):
                self.replicas[e] = Replica(e, down_since=time.monotonic(), reason="new in DNS")
            for e in set(self.replicas) - endpoints:
                if self.replicas[e].outstanding == 0:
                    gone = self.replicas.pop(e)
                    if gone.client is not None and gone.client is not self.reference:
                        gone.client.close()

    def _pick(self, skip: set[str]) -> Replica | None:
        with self._lock:
            ready = [r for r in self.replicas.values() if r.ready and r.endpoint not in skip]
            if not ready:
                return None
            least = min(r.outstanding for r in ready)
            tied = [r for r in ready if r.outstanding == least]
            r = tied[self._turn % len(tied)]
            self._turn += 1
            r.outstanding += 1
            return r

    # ------------------------------------------------------------------ the client interface
    def deadline(self) -> float:
        """The deadline of a call starting now (monotonic seconds)."""
        return time.monotonic() + self.timeout

    def infer_with_retries(self, model: str, inputs, outputs, deadline: float | None = None):
        """One request on the least busy ready replica; on a connection error or a timeout,
        the next one, until the call's deadline."""
        deadline = self.deadline() if deadline is None else deadline
        tried: set[str] = set()
        last: BaseException | None = None
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(
                    f"no replica answered within the call's deadline ({self.timeout:g} s)"
                    + (f"; last error: {last}" if last else "")
                )
            r = self._pick(tried)
            if r is None:
                if tried and len(tried) >= len(self.replicas):
                    tried.clear()  # every replica failed once: try again those that came back
                with self._lock:  # wait for the health thread to take one back
                    self._ready_event.wait(timeout=min(self.health_interval, max(0.0, deadline - now)))
                continue
            client = r.client
            try:
                if client is None:
                    raise BackendError("no connection")
                limit = (
                    deadline
                    if self.try_timeout is None
                    else min(deadline, time.monotonic() + self.try_timeout)
                )
                result = client.infer_once(model, inputs, outputs, limit)
            except Exception as exc:
                if not retryable(exc):
                    raise
                last = exc
                tried.add(r.endpoint)
                self._remove(r, str(exc).splitlines()[0][:200])
                continue
            finally:
                with self._lock:
                    r.outstanding -= 1
            with self._lock:
                r.served += 1
            return result

    def infer_all(self, model: str, requests: Sequence[tuple[Any, Any]], deadline: float) -> list[Any]:
        """Every (inputs, outputs) request of one call, concurrently, each with failover."""
        return list(
            self._pool.map(lambda io: self.infer_with_retries(model, io[0], io[1], deadline), requests)
        )

    def parameters(self) -> dict[str, str]:
        """The model config's parameters (from a ready replica)."""
        return self.reference.parameters()

    def manifest(self) -> dict[str, Any]:
        """The model's manifest (from a ready replica)."""
        return self.reference.manifest()

    @property
    def is_text_model(self) -> bool:
        """Whether the model takes text."""
        return self.reference.is_text_model

    @property
    def url(self) -> str:
        """The replica set's address as given."""
        return ",".join(self.replicas) if not self.dns_name else DNS_SCHEME + self.dns_name

    def health(self) -> bool:
        """Whether any replica is ready."""
        return any(r.ready for r in self.replicas.values())

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per replica: ready, served, failed over, removals, re-admission times, outstanding."""
        with self._lock:
            return {
                e: {
                    "ready": r.ready,
                    "served": r.served,
                    "failed": r.failed,
                    "removals": r.removals,
                    "readmissions": list(r.readmissions),
                    "outstanding": r.outstanding,
                    "reason": r.reason,
                }
                for e, r in self.replicas.items()
            }

    def describe(self) -> str:
        """The replicas and how many are ready, in words."""
        ready = sum(r.ready for r in self.replicas.values())
        return f"triton {self.protocol}://{self.url} model {self.model} ({ready}/{len(self.replicas)} replicas ready)"

    def close(self) -> None:
        """Stop the health checks and close every replica."""
        self._stop.set()
        self._health.join(timeout=5)
        self._pool.shutdown(wait=False)
        for r in self.replicas.values():
            if r.client is not None and r.client is not self.reference:
                r.client.close()
        self.reference.close()
