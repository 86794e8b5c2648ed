"""Triton Inference Server over gRPC (default) or HTTP: the production path.

The client pads every batch to the engine's length buckets, so requests from many
clients have equal shapes and the server's dynamic batcher can join them (the
onnxruntime and tensorrt backends need equal shapes). A call with more rows than the
model's `max_batch_size` is split; the batches of one call are sent concurrently.
Connection errors (and a model whose stub died or is still loading) are retried with
exponential backoff capped at 2 s, all within one deadline per
call (`timeout`): every request is sent with what is left of it, retries and backoff
included, so a dead or stalled server is a clear error in at most `timeout` seconds.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np

from engine.backends.base import Backend
from engine.batching import ModelBatch
from engine.errors import BackendError, ModelLoadError
from engine.spec import GRAPH_OUTPUTS

_RETRYABLE = ("unavailable", "connection refused", "connect", "socket closed", "broken pipe",
              "reset by peer", "failed to establish", "timed out", "deadline",
              "is not healthy",         # a model whose python-backend stub died (prune serve restarts it)
              "has no available versions")   # a (re)starting server still loading the model


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
    return [("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.keepalive_time_ms", k.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", k.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", k.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", k.http2_max_pings_without_data),
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000)]


class TritonClient:
    """A connection to one model on a Triton server: readiness, config, retries."""

    def __init__(self, url: str, model: str, *, protocol: str = "grpc", version: str = "",
                 timeout: float = 30.0, retries: int = 3, backoff: float = 0.5, concurrency: int = 8,
                 ready_timeout: float = 10.0):
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
        self._client_kwargs = ({"channel_args": grpc_channel_args()} if protocol == "grpc" else
                               {"concurrency": concurrency, "connection_timeout": timeout, "network_timeout": timeout})
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
                raise TimeoutError(f"no answer from {self.url} within the call's deadline ({self.timeout:g} s)")
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                text = str(exc).lower()
                if attempt == self.retries or not any(k in text for k in _RETRYABLE):
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
            return self.client.infer(model, inputs, model_version=self.version if model == self.model else "",
                                     outputs=outputs, client_timeout=remaining)
        # HTTP: the gevent-based client waits at most `remaining` for this answer
        request = self.client.async_infer(model, inputs, model_version=self.version if model == self.model else "",
                                          outputs=outputs)
        return request.get_result(timeout=remaining)

    def infer_with_retries(self, model: str, inputs, outputs, deadline: float | None = None):
        deadline = self.deadline() if deadline is None else deadline
        return self._call(lambda: self.infer_once(model, inputs, outputs, deadline), deadline=deadline)

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
                raise BackendError(f"Triton server at {self.url} ({self.protocol}) is not reachable or not "
                                   f"ready after {ready_timeout:.0f} s" + (f": {last}" if last else "")
                                   + self._port_hint())
            time.sleep(0.2)
        try:
            ready = self.client.is_model_ready(self.model, self.version)
        except Exception as exc:
            ready, last = False, exc
        if not ready:
            try:
                index = self.client.get_model_repository_index()
                names = sorted({(m.name if hasattr(m, "name") else m["name"]) for m in
                                (index.models if hasattr(index, "models") else index)})
            except Exception:
                names = []
            raise BackendError(f"model {self.model!r} is not ready on the Triton server at {self.url}"
                               + (f" (models there: {', '.join(names)})" if names else ""))

    def _port_hint(self) -> str:
        """gRPC sent to Triton's HTTP port fails obscurely: say so when HTTP answers there."""
        if self.protocol != "grpc":
            return ""
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://{self.url}/v2/health/live", timeout=1) as r:
                if r.status == 200:
                    return (f". {self.url} answers HTTP: it is Triton's HTTP port; pass protocol='http' "
                            "(--protocol http) or use the gRPC port (8001 by default)")
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
        return "question" in self.metadata_inputs and "passages" in self.metadata_inputs

    def parameters(self) -> dict[str, str]:
        params = self.config.get("parameters", {})
        return {k: (v.get("string_value") if isinstance(v, dict) else v) for k, v in params.items()}

    def manifest(self) -> dict[str, Any]:
        text = self.parameters().get("prune_manifest")
        if not text:
            raise ModelLoadError(f"model {self.model!r} has no prune_manifest parameter: "
                                 "generate its repository with `prune repository`")
        return json.loads(text)

    def health(self) -> bool:
        try:
            probe = {"client_timeout": 2.0} if self.protocol == "grpc" else {}
            return bool(self.client.is_model_ready(self.model, self.version, **probe))
        except Exception:
            return False

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        try:
            self.client.close()
        except Exception:
            pass

    def describe(self) -> str:
        return f"triton {self.protocol}://{self.url} model {self.model}"


class TritonBackend(TritonClient, Backend):
    """The token-level core model (the engine's graph contract) on a Triton server."""
    name = "triton"

    def __init__(self, url: str, model: str, **kwargs: Any):
        super().__init__(url, model, **kwargs)
        self._check_contract()

    def _check_contract(self) -> None:
        required = {"input_ids", "attention_mask", "sentence_ids"}
        if not required <= set(self.metadata_inputs) or not set(GRAPH_OUTPUTS) <= set(self.metadata_outputs):
            raise ModelLoadError(f"model {self.model!r} on {self.url} does not follow the engine's contract: "
                                 f"inputs {self.metadata_inputs}, outputs {self.metadata_outputs}")
        self.input_names = self.metadata_inputs

    def tokenizer_json(self) -> str | None:
        """The tokenizer, from the text model beside the core (a describe request)."""
        text_model = self.parameters().get("prune_text_model")
        if not text_model:
            return None
        try:
            res = self.infer_with_retries(text_model, [], [self.tc.InferRequestedOutput("tokenizer")])
        except Exception as exc:
            raise ModelLoadError(f"cannot fetch the tokenizer from the text model {text_model!r} on {self.url}: "
                                 f"{exc}") from exc
        value = res.as_numpy("tokenizer")
        if value is None or value.size != 1:
            raise ModelLoadError(f"the text model {text_model!r} returned no tokenizer")
        return bytes(value.reshape(-1)[0]).decode("utf-8")

    # -------------------------------------------------------------- inference
    def _request(self, feeds: dict[str, np.ndarray]):
        tc = self.tc
        inputs = []
        for name in self.input_names:
            arr = np.ascontiguousarray(feeds[name])
            inp = tc.InferInput(name, list(arr.shape), "INT64")
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        return inputs, [tc.InferRequestedOutput(n) for n in GRAPH_OUTPUTS]

    def _infer_chunk(self, feeds: dict[str, np.ndarray], deadline: float) -> tuple[np.ndarray, np.ndarray]:
        inputs, outputs = self._request(feeds)
        try:
            res = self.infer_with_retries(self.model, inputs, outputs, deadline)
        except Exception as exc:
            raise BackendError(f"Triton inference on {self.url} (model {self.model!r}) failed: {exc}") from exc
        return self._outputs(res)

    def _infer_http(self, jobs: list[dict[str, np.ndarray]], deadline: float) -> list[tuple[np.ndarray, np.ndarray]]:
        """HTTP: the client's own connection pool sends the requests concurrently (its
        gevent-based client must stay on the calling thread)."""
        def submit(feeds):
            inputs, outputs = self._request(feeds)
            return self.client.async_infer(self.model, inputs, model_version=self.version, outputs=outputs)

        def run(feeds):
            inputs, outputs = self._request(feeds)
            return self.infer_with_retries(self.model, inputs, outputs, deadline)
        try:
            pending = [submit(f) for f in jobs]
            results = []
            for feeds, req in zip(jobs, pending):
                try:
                    results.append(req.get_result(timeout=max(0.001, deadline - time.monotonic())))
                except Exception as exc:
                    if not any(k in str(exc).lower() for k in _RETRYABLE):
                        raise
                    results.append(run(feeds))
        except Exception as exc:
            raise BackendError(f"Triton inference on {self.url} (model {self.model!r}) failed: {exc}") from exc
        return [self._outputs(r) for r in results]

    def _outputs(self, res) -> tuple[np.ndarray, np.ndarray]:
        rerank = res.as_numpy("rerank_score")
        probs = res.as_numpy("sentence_probs")
        if rerank is None or probs is None:
            raise BackendError(f"Triton returned no outputs for model {self.model!r}")
        return rerank.reshape(-1).astype(np.float32, copy=False), probs.astype(np.float32, copy=False)

    def infer(self, batch: ModelBatch) -> tuple[np.ndarray, np.ndarray]:
        return self.infer_many([batch])[0]

    def infer_many(self, batches: Sequence[ModelBatch]) -> list[tuple[np.ndarray, np.ndarray]]:
        """All batches of a call, split to max_batch_size and sent concurrently."""
        jobs, owners = [], []
        step = self.max_batch_size or 10**9
        for k, b in enumerate(batches):
            feeds = b.inputs(self.input_names)
            for s in range(0, b.shape[0], step):
                jobs.append({n: a[s:s + step] for n, a in feeds.items()})
                owners.append(k)
        deadline = self.deadline()      # one deadline for the whole call
        if self.protocol == "http":
            results = self._infer_http(jobs, deadline)
        else:
            results = list(self._pool.map(lambda f: self._infer_chunk(f, deadline), jobs))
        out: list[tuple[np.ndarray, np.ndarray]] = []
        for k in range(len(batches)):
            parts = [r for r, o in zip(results, owners) if o == k]
            width = max(p.shape[1] for _, p in parts)
            probs = np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1]))) for _, p in parts])
            out.append((np.concatenate([r for r, _ in parts]), probs))
        return out
