"""The token-level core model (the engine's graph contract) on Triton: the production path.

The client pads every batch to the engine's length buckets, so requests from many
clients have equal shapes and the server's dynamic batcher can join them (the
onnxruntime and tensorrt backends need equal shapes). A call with more rows than the
model's `max_batch_size` is split; the batches of one call are sent concurrently, all
within one deadline, through a transport (`engine.triton.client`): one server with
retries, or a replica set with failover.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from engine.backends.base import Backend
from engine.pipeline.encode import ModelBatch
from engine.errors import BackendError, ModelLoadError
from engine.pipeline.spec import GRAPH_OUTPUTS
from engine.triton.client import Transport


class TritonBackend(Backend):
    """The token-level core model on Triton, through `transport` (one server or replicas)."""

    name = "triton"
    sends_together = True

    def __init__(self, transport: Transport):
        self.transport = transport
        self.max_batch_size = transport.max_batch_size
        required = {"input_ids", "attention_mask", "sentence_ids"}
        inputs, outputs = transport.metadata_inputs, transport.metadata_outputs
        if not required <= set(inputs) or not set(GRAPH_OUTPUTS) <= set(outputs):
            raise ModelLoadError(
                f"model {transport.model!r} on {transport.url} does not follow the engine's "
                f"contract: inputs {inputs}, outputs {outputs}"
            )
        self.input_names = list(inputs)

    def manifest(self) -> dict[str, Any]:
        """The core model's manifest, as its config's prune_manifest parameter holds it."""
        return self.transport.manifest()

    def tokenizer_json(self) -> str | None:
        """The tokenizer, from the text model beside the core (a describe request)."""
        t = self.transport
        text_model = t.parameters().get("prune_text_model")
        if not text_model:
            return None
        try:
            res = t.infer_with_retries(text_model, [], [t.tc.InferRequestedOutput("tokenizer")])
        except Exception as exc:
            raise ModelLoadError(
                f"cannot fetch the tokenizer from the text model {text_model!r} on {t.url}: {exc}"
            ) from exc
        value = res.as_numpy("tokenizer")
        if value is None or value.size != 1:
            raise ModelLoadError(f"the text model {text_model!r} returned no tokenizer")
        return bytes(value.reshape(-1)[0]).decode("utf-8")

    # -------------------------------------------------------------- inference
    def _request(self, feeds: dict[str, np.ndarray]):
        tc = self.transport.tc
        inputs = []
        for name in self.input_names:
            arr = np.ascontiguousarray(feeds[name])
            inp = tc.InferInput(name, list(arr.shape), "INT64")
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        return inputs, [tc.InferRequestedOutput(n) for n in GRAPH_OUTPUTS]

    def _outputs(self, res) -> tuple[np.ndarray, np.ndarray]:
        rerank = res.as_numpy("rerank_score")
        probs = res.as_numpy("sentence_probs")
        if rerank is None or probs is None:
            raise BackendError(f"Triton returned no outputs for model {self.transport.model!r}")
        return rerank.reshape(-1).astype(np.float32, copy=False), probs.astype(np.float32, copy=False)

    def infer(self, batch: ModelBatch) -> tuple[np.ndarray, np.ndarray]:
        """(rerank_score [B], sentence_probs [B, S]) of one padded batch, from the Triton core model."""
        return self.infer_many([batch])[0]

    def infer_many(self, batches: Sequence[ModelBatch]) -> list[tuple[np.ndarray, np.ndarray]]:
        """All batches of a call, split to max_batch_size and sent concurrently."""
        t = self.transport
        jobs, owners = [], []
        step = self.max_batch_size or 10**9
        for k, b in enumerate(batches):
            feeds = b.inputs(self.input_names)
            for s in range(0, b.shape[0], step):
                jobs.append({n: a[s : s + step] for n, a in feeds.items()})
                owners.append(k)
        deadline = t.deadline()  # one deadline for the whole call
        try:
            raw = t.infer_all(t.model, [self._request(f) for f in jobs], deadline)
        except Exception as exc:
            raise BackendError(f"Triton inference on {t.url} (model {t.model!r}) failed: {exc}") from exc
        results = [self._outputs(r) for r in raw]
        out: list[tuple[np.ndarray, np.ndarray]] = []
        for k in range(len(batches)):
            parts = [r for r, o in zip(results, owners) if o == k]
            width = max(p.shape[1] for _, p in parts)
            probs = np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1]))) for _, p in parts])
            out.append((np.concatenate([r for r, _ in parts]), probs))
        return out

    def health(self) -> bool:
        """Whether the core model is ready on its server."""
        return self.transport.health()

    def close(self) -> None:
        """Close the client."""
        self.transport.close()

    def describe(self) -> str:
        """The server and model, in words."""
        return self.transport.describe()
