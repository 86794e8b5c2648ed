"""The transport to a model on Triton servers, over gRPC (default) or HTTP.

`Transport` is what the token-level core (`engine.backends.triton.TritonBackend`) and the
text-model pruner (`engine.remote.text_pruner`) send their requests through. Two
implement it: `TritonClient`, one server, and `engine.triton.replicas.ReplicaSet`,
several replicas of one model with failover. Both classify errors with `retryable`.

`TritonClient` retries connection errors (and a model whose stub died or is still
loading) with exponential backoff capped at 2 s, all within one deadline per call
(`timeout`): every request is sent with what is left of it, retries and backoff
included, so a dead or stalled server is a clear error in at most `timeout` seconds.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from engine.errors import BackendError, ModelLoadError

T = TypeVar("T")
R = TypeVar("R")

RETRYABLE = (
    "unavailable",
    "connection refused",
    "connect",
    "socket closed",
    "broken pipe",
    "reset by peer",
    "failed to establish",
    "timed out",
    "deadline",
    "is not healthy",  # a model whose python-backend stub died (prune serve restarts it)
    "has no available versions",
)  # a (re)starting server still loading the model


def retryable(exc: BaseException) -> bool:
    """A connection error, a timeout, a dead stub or a loading model: worth another try
    (on the same server after a backoff, or on another replica)."""
    return isinstance(exc, TimeoutError) or any(k in str(exc).lower() for k in RETRYABLE)


@runtime_checkable
class Transport(Protocol):
    """Requests to one model on one Triton server or on several replicas of it."""

    tc: Any  # tritonclient.grpc or tritonclient.http
    protocol: str
    model: str
    timeout: float
    concurrency: int  # requests of one call in flight at once
    config: dict[str, Any]
    max_batch_size: int | None
    metadata_inputs: list[str]
    metadata_outputs: list[str]

    @property
    def url(self) -> str:
        """The server's address."""

    @property
    def is_text_model(self) -> bool:
        """Whether the model takes text (a text model) rather than token ids."""

    def deadline(self) -> float:
        """The deadline of a call starting now (monotonic seconds)."""

    def infer_with_retries(self, model: str, inputs: Any, outputs: Any, deadline: float | None = None) -> Any:
        """One inference, retried on a server that is restarting, within `deadline`."""

    def infer_all(self, model: str, requests: Sequence[tuple[Any, Any]], deadline: float) -> list[Any]:
        """Several inferences in flight at once, their answers in order."""

    def parameters(self) -> dict[str, str]:
        """The model config's parameters."""

    def manifest(self) -> dict[str, Any]:
        """The model's manifest (its prune_manifest parameter)."""

    def health(self) -> bool:
        """Whether the model is ready."""

    def describe(self) -> str:
        """The server and model, in words."""

    def close(self) -> None:
        """Close the connection."""


#: the longest pause between retries: a server back up is reached within it
MAX_BACKOFF = 2.0


def grpc_channel_args() -> list[tuple[str, int]]:
    """tritonclient's own channel options, plus: a subchannel of this client's own (gRPC
    shares subchannels between channels to the same address, so a new client would inherit
    the reconnect backoff of one that saw the server go: seconds, growing), and reconnect
    backoff capped at one second (a restarted server is reached within a second)."""
    from tritonclient.grpc import KeepAliveOptions
    from tritonclient.grpc._client import MAX_GRPC_MESSAGE_SIZE

    k = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", k.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", k.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", k.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", k.http2_max_pings_without_data),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


class TritonClient:
    """A connection to one model on a Triton server: readiness, config, retries."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        protocol: str = "grpc",
        version: str = "",
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        concurrency: int = 8,
        ready_timeout: float = 10.0,
    ):
        if protocol not in ("grpc", "http"):
            raise ModelLoadError(f"protocol must be grpc or http, got {protocol!r}")
        try:
            if protocol == "grpc":
                import tritonclient.grpc as tc
            else:
                import tritonclient.http as tc
        except ImportError as exc:
            raise ModelLoadError("tritonclient is not installed: pip install 'prune-engine[triton]'") from exc
        self.tc, self.protocol, self.url, self.model, self.version = tc, protocol, url, model, version
        self.timeout, self.retries, self.backoff, self.concurrency = timeout, retries, backoff, concurrency
        # The HTTP client is gevent-based: one Pruner per thread; gRPC clients are thread-safe.
        self._client_kwargs = (
            {"channel_args": grpc_channel_args()}
            if protocol == "grpc"
            else {"concurrency": concurrency, "connection_timeout": timeout, "network_timeout": timeout}
        )
        self.client = tc.InferenceServerClient(url, **self._client_kwargs)
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="triton")
        self._wait_ready(ready_timeout)
        self.config = self._model_config()
        self.max_batch_size = int(self.config.get("max_batch_size", 0)) or None
        self.metadata_inputs, self.metadata_outputs = self._metadata()

    # -------------------------------------------------------------- set-up
    def deadline(self) -> float:
        """The monotonic time by which a call started now must be answered."""
        return time.monotonic() + self.timeout

    def _call(self, fn, *args, deadline: float | None = None, **kwargs):
        """`fn(*args, **kwargs)`, retrying connection errors with exponential backoff,
        never past `deadline` (default: `timeout` from now)."""
        deadline = self.deadline() if deadline is None else deadline
        delay = self.backoff
        for attempt in range(self.retries + 1):
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"no answer from {self.url} within the call's deadline ({self.timeout:g} s)"
                )
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                text = str(exc).lower()
                if attempt == self.retries or not retryable(exc):
                    raise
                if self.protocol == "grpc" and ("unavailable" in text or "connect" in text):
                    # a gRPC channel that saw its server go keeps backing off its reconnects
                    # (seconds, growing): a new channel connects at once to a server back up
                    self.client = self.tc.InferenceServerClient(self.url, **self._client_kwargs)
                time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
                delay = min(delay * 2, MAX_BACKOFF)

    def infer_once(self, model: str, inputs, outputs, deadline: float):
        """One inference request with what is left of `deadline` as its timeout."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no answer from {self.url} within the call's deadline ({self.timeout:g} s)")
        if self.protocol == "grpc":
            return self.client.infer(
                model,
                inputs,
                model_version=self.version if model == self.model else "",
                outputs=outputs,
                client_timeout=remaining,
            )
        # HTTP: the gevent-based client waits at most `remaining` for this answer
        request = self.client.async_infer(
            model, inputs, model_version=self.version if model == self.model else "", outputs=outputs
        )
        return request.get_result(timeout=remaining)

    def infer_with_retries(self, model: str, inputs, outputs, deadline: float | None = None):
        """One inference, retried on a server that is restarting, within `deadline`."""
        deadline = self.deadline() if deadline is None else deadline
        return self._call(lambda: self.infer_once(model, inputs, outputs, deadline), deadline=deadline)

    def infer_all(self, model: str, requests: Sequence[tuple[Any, Any]], deadline: float) -> list[Any]:
        """Every (inputs, outputs) request of one call, sent concurrently, results in order.
        HTTP: the client's own connection pool sends them (its gevent-based client must stay
        on the calling thread); a request that failed retryably is sent again with retries."""
        if self.protocol == "grpc":
            return list(
                self._pool.map(lambda io: self.infer_with_retries(model, io[0], io[1], deadline), requests)
            )
        version = self.version if model == self.model else ""
        pending = [self.client.async_infer(model, i, model_version=version, outputs=o) for i, o in requests]
        results = []
        for (i, o), req in zip(requests, pending):
            try:
                results.append(req.get_result(timeout=max(0.001, deadline - time.monotonic())))
            except Exception as exc:
                if not retryable(exc):
                    raise
                results.append(self.infer_with_retries(model, i, o, deadline))
        return results

    def _wait_ready(self, ready_timeout: float) -> None:
        deadline = time.monotonic() + ready_timeout
        last = None
        while True:
            try:
                probe = {"client_timeout": 2.0} if self.protocol == "grpc" else {}
                if self.client.is_server_ready(**probe):
                    break
            except Exception as exc:
                last = exc
            if time.monotonic() > deadline:
                raise BackendError(
                    f"Triton server at {self.url} ({self.protocol}) is not reachable or not "
                    f"ready after {ready_timeout:.0f} s" + (f": {last}" if last else "") + self._port_hint()
                )
            time.sleep(0.2)
        try:
            ready = self.client.is_model_ready(self.model, self.version)
        except Exception as exc:
            ready, last = False, exc
        if not ready:
            try:
                index = self.client.get_model_repository_index()
                names = sorted(
                    {
                        (m.name if hasattr(m, "name") else m["name"])
                        for m in (index.models if hasattr(index, "models") else index)
                    }
                )
            except Exception:
                names = []
            raise BackendError(
                f"model {self.model!r} is not ready on the Triton server at {self.url}"
                + (f" (models there: {', '.join(names)})" if names else "")
            )

    def _port_hint(self) -> str:
        """gRPC sent to Triton's HTTP port fails obscurely: say so when HTTP answers there."""
        if self.protocol != "grpc":
            return ""
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://{self.url}/v2/health/live", timeout=1) as r:
                if r.status == 200:
                    return (
                        f". {self.url} answers HTTP: it is Triton's HTTP port; pass protocol='http' "
                        "(--protocol http) or use the gRPC port (8001 by default)"
                    )
        except Exception:
            pass
        return ""

    def _model_config(self) -> dict[str, Any]:
        if self.protocol == "grpc":
            from google.protobuf.json_format import MessageToDict

            cfg = self.client.get_model_config(self.model, self.version, client_timeout=self.timeout).config
            d = MessageToDict(cfg, preserving_proto_field_name=True)
            d["max_batch_size"] = cfg.max_batch_size
            return d
        return self.client.get_model_config(self.model, self.version)

    def _metadata(self) -> tuple[list[str], list[str]]:
        meta = self.client.get_model_metadata(self.model, self.version)
        if self.protocol == "grpc":
            return [i.name for i in meta.inputs], [o.name for o in meta.outputs]
        return [i["name"] for i in meta["inputs"]], [o["name"] for o in meta["outputs"]]

    @property
    def is_text_model(self) -> bool:
        """Whether the model takes text (a text model) rather than token ids."""
        return "question" in self.metadata_inputs and "passages" in self.metadata_inputs

    def parameters(self) -> dict[str, str]:
        """The model config's parameters."""
        params = self.config.get("parameters", {})
        return {k: (v.get("string_value") if isinstance(v, dict) else v) for k, v in params.items()}

    def manifest(self) -> dict[str, Any]:
        """The model's manifest (its prune_manifest parameter)."""
        text = self.parameters().get("prune_manifest")
        if not text:
            raise ModelLoadError(
                f"model {self.model!r} has no prune_manifest parameter: "
                "generate its repository with `prune repository`"
            )
        return json.loads(text)

    def health(self) -> bool:
        """Whether the model is ready (asked within 2 s)."""
        try:
            probe = {"client_timeout": 2.0} if self.protocol == "grpc" else {}
            return bool(self.client.is_model_ready(self.model, self.version, **probe))
        except Exception:
            return False

    def close(self) -> None:
        """Close the connection."""
        self._pool.shutdown(wait=False)
        try:
            self.client.close()
        except Exception:
            pass

    def describe(self) -> str:
        """The server and model, in words."""
        return f"triton {self.protocol}://{self.url} model {self.model}"
