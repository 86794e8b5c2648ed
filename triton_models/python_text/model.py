"""Triton python-backend *text* model: a question and its passages in (UTF-8), pruned
text, sentence spans, probabilities and reranking scores out. Any KServe v2 client
(curl, Java, Go, TypeScript) can call it; the wire contract is `engine.triton.wire`.

Copied by `prune repository` into `<name>_text/1/model.py`, beside the export's
`tokenizer.json` and `manifest.json`. It runs the engine's own code (sentence
splitting, tokenization, blocks, batching, block merging and decisions:
`Pruner.prepare` / `Pruner.finish`) and sends the padded batches to the core model
`<name>` with asynchronous BLS requests, so blocks of concurrent text requests meet in
the core's dynamic batcher. Batches never exceed the core's max_batch_size. Each
request is answered on its own: a bad request gets its error, its neighbours their
results.
"""

import asyncio
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from engine.backends.base import Backend
from engine.errors import BackendError, InputError, PruneError
from engine.pipeline.encode import BatchingConfig
from engine.pipeline.inputs import Limits
from engine.pipeline.spec import Manifest, manifest_tokenizer
from engine.pruner import Pruner
from engine.settings import DEFAULTS
from engine.triton.wire import INPUT_ERROR_PREFIX, describe_tensors, read_request, results_to_tensors


class _BLSCore(Backend):
    """The core model as the Pruner sees it; batches go through `infer_async`."""

    name = "bls"

    def __init__(self, model, input_names, max_batch_size, timeout_us):
        self.model, self.input_names = model, list(input_names)
        self.max_batch_size, self.timeout_us = max_batch_size, timeout_us

    def infer(self, batch):  # the text model only runs batches asynchronously
        raise BackendError("the BLS core runs batches with infer_async")

    async def infer_async(self, batch):
        inputs = [pb_utils.Tensor(n, np.ascontiguousarray(getattr(batch, n))) for n in self.input_names]
        request = pb_utils.InferenceRequest(
            model_name=self.model,
            inputs=inputs,
            requested_output_names=["rerank_score", "sentence_probs"],
            timeout=self.timeout_us,
        )
        response = await request.async_exec()
        if response.has_error():
            raise BackendError(f"core model {self.model!r}: {response.error().message()}")
        rerank = pb_utils.get_output_tensor_by_name(response, "rerank_score")
        probs = pb_utils.get_output_tensor_by_name(response, "sentence_probs")
        if rerank is None or probs is None:
            raise BackendError(f"core model {self.model!r} returned no outputs")
        return rerank.as_numpy().reshape(-1), probs.as_numpy()


class TritonPythonModel:
    """The text model: text in, the engine's results out, its core model called over BLS."""

    def initialize(self, args):
        """Load the tokenizer and manifest, and the engine's pruner over the core model."""
        self.config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in self.config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.manifest = Manifest.read(folder)
        spec = self.manifest.spec(name=params["core_model"])
        tok_file = os.path.join(folder, self.manifest.tokenizer.file)
        with open(tok_file, encoding="utf-8") as fh:
            self.tokenizer_json = fh.read()
        core = _BLSCore(
            params["core_model"],
            spec.input_names,
            int(params["core_max_batch_size"]),
            int(params.get("core_timeout_ms", "60000")) * 1000,
        )
        batching = BatchingConfig(
            max_batch_tokens=int(params.get("max_batch_tokens", DEFAULTS.max_batch_tokens)),
            max_batch_size=core.max_batch_size,
        )
        self.pruner = Pruner(core, manifest_tokenizer(folder, self.manifest, spec.family), spec, batching)
        self.limits = Limits(max_passages=int(params["max_passages"]), max_chars=int(params["max_chars"]))
        self.core = core

    @staticmethod
    def _response(tensors):
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()])

    @staticmethod
    def _error(message):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))

    async def execute(self, requests):
        """Answer each request: prune it, or describe the model."""
        responses = [None] * len(requests)
        calls = []  # (request index, prepared call)
        for i, request in enumerate(requests):
            try:

                def get(name, request=request):
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    return None if tensor is None else tensor.as_numpy()

                args = read_request(get, self.limits)
                if args is None:
                    responses[i] = self._response(
                        describe_tensors(self.manifest.to_dict(), self.tokenizer_json)
                    )
                    continue
                calls.append((i, self.pruner.prepare(args.question, args.passages, args.options)))
            except InputError as exc:  # bad input: this request only; the client raises InputError
                responses[i] = self._error(INPUT_ERROR_PREFIX + str(exc))
            except PruneError as exc:
                responses[i] = self._error(str(exc))
            except Exception as exc:  # never fail the neighbours
                responses[i] = self._error(f"text model: {type(exc).__name__}: {exc}")
        jobs = [self.core.infer_async(b) for _, call in calls for b in call.batches]
        outputs = await asyncio.gather(*jobs, return_exceptions=True)
        pos = 0
        for i, call in calls:
            mine = outputs[pos : pos + len(call.batches)]
            pos += len(call.batches)
            failed = next((o for o in mine if isinstance(o, BaseException)), None)
            if failed is not None:
                responses[i] = self._error(str(failed))
                continue
            try:
                responses[i] = self._response(results_to_tensors(self.pruner.finish(call, mine)))
            except Exception as exc:
                responses[i] = self._error(f"text model: {type(exc).__name__}: {exc}")
        return responses

    def finalize(self):
        """Release the pruner."""
        self.pruner = None
