"""Triton python-backend *text* model of an LLMLingua-2 compressor: a JSON call in, llmlingua's
result out. Any KServe v2 client (curl, Java, Go, TypeScript) can call it.

    input  "request": BYTES [1], a JSON object with POST /v1/compress's fields (context: a string
           or a list of them; rate, target_token, force_tokens, ...; unknown fields refused)
    output "result":  BYTES [1], a JSON object: compress_prompt's fields and kept_spans, as
           POST /v1/compress answers

A bad call is answered with an error whose message starts with INPUT_ERROR_PREFIX
(engine.triton.wire), its neighbours with their results. Copied by `prune repository` into
`<name>_text/1/model.py`, beside the export's tokenizer.json and manifest.json. It runs the
engine's own code (engine.compressor.Compressor: chunks, words, tiktoken counts, llmlingua's
decisions) and sends the chunks' padded batches to the core model `<name>` with BLS requests,
where they meet other calls' batches in its dynamic batcher.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from engine.backends.base import TokenCore
from engine.compressor import Compressor
from engine.errors import BackendError, InputError
from engine.pipeline.budget import tiktoken_encoding
from engine.pipeline.inputs import Limits
from engine.pipeline.lingua_words import LinguaTokenizer
from engine.pipeline.spec import CompressorManifest
from engine.triton.wire import INPUT_ERROR_PREFIX


class _BLSTokenProbs(TokenCore):
    """The core model as the Compressor sees it: token_probs(ids, mask) over a BLS request."""

    name = "bls"

    def __init__(self, model, timeout_us):
        self.model, self.timeout_us = model, timeout_us

    def token_probs(self, ids, mask):
        request = pb_utils.InferenceRequest(
            model_name=self.model,
            inputs=[pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("attention_mask", mask)],
            requested_output_names=["token_probs"],
            timeout=self.timeout_us,
        )
        response = request.exec()
        if response.has_error():
            raise BackendError(f"core model {self.model!r}: {response.error().message()}")
        out = pb_utils.get_output_tensor_by_name(response, "token_probs")
        if out is None:
            raise BackendError(f"core model {self.model!r} returned no token_probs")
        return out.as_numpy()

    def describe(self):
        return f"Triton core model {self.model!r}"


class TritonPythonModel:
    """The compressor's text model: a JSON call in, its JSON result out."""

    def initialize(self, args):
        """The tokenizer and manifest from the model's folder, the core model from the config."""
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        CompressorManifest.read(folder)  # a clear error when the folder is not a compressor's
        core = _BLSTokenProbs(params["core_model"], int(params.get("core_timeout_ms", "60000")) * 1000)
        limits = Limits(max_passages=int(params["max_passages"]), max_chars=int(params["max_chars"]))
        # tiktoken's cl100k_base: where TIKTOKEN_CACHE_DIR points, or tiktoken's download
        # chunks per BLS request: 1 in front of a CPU core (no padding), more for a GPU's
        batch_chunks = int(params.get("batch_chunks", "16"))
        self.compressor = Compressor(
            LinguaTokenizer.from_folder(folder),
            core,
            tiktoken_encoding("gpt-3.5-turbo"),
            limits,
            batch_chunks,
        )

    def _answer(self, request):
        tensor = pb_utils.get_input_tensor_by_name(request, "request")
        if tensor is None:
            raise InputError('the input "request" is missing: a JSON object (context, rate, ...)')
        raw = tensor.as_numpy().reshape(-1)
        if raw.size != 1:
            raise InputError(f'"request" must hold one JSON object, got {raw.size} elements')
        try:
            call = json.loads(raw[0])
        except ValueError as exc:
            raise InputError(f'"request" is not JSON: {exc}') from None
        if not isinstance(call, dict) or "context" not in call:
            raise InputError('"request" must be a JSON object with a "context" (a string or a list of them)')
        context = call.pop("context")
        result = self.compressor.compress(context, **call)
        body = json.dumps(result.to_dict(), ensure_ascii=False).encode("utf-8")
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("result", np.array([body], dtype=np.object_))]
        )

    def execute(self, requests):
        """Answer each request on its own: a bad call gets its error, its neighbours their results."""
        responses = []
        for request in requests:
            try:
                responses.append(self._answer(request))
            except InputError as exc:
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(INPUT_ERROR_PREFIX + str(exc)))
                )
            except Exception as exc:  # never fail the neighbours
                message = f"text model: {type(exc).__name__}: {exc}"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
        return responses

    def finalize(self):
        """Release the compressor."""
        self.compressor = None
