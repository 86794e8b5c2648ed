"""An LLMLingua-2 compressor served by Triton (`prune repository` on its export): `Compressor.connect`.

    from engine import Compressor
    compressor = Compressor.connect("localhost:8001", "lingua_text")
    compressor.compress(prompt, rate=0.33, force_tokens=["\\n", "?"]).compressed_prompt

The text model (`<name>_text`, triton_models/python_compress/model.py) takes one JSON call (POST
/v1/compress's fields) and answers llmlingua's result: the client sends the call and reads the
result, with the deadline, retries and backoff of a pruner's Triton client (engine.triton.client).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from engine.errors import BackendError, InputError, ModelLoadError
from engine.pipeline.inputs import Limits
from engine.pipeline.lingua_decide import CompressResult
from engine.triton.wire import input_error


class TritonCompressor:
    """Compressor's API (compress, describe, close) on a compressor's Triton text model."""

    def __init__(self, transport: Any):
        self.transport = transport
        if transport.metadata_inputs != ["request"] or "result" not in transport.metadata_outputs:
            transport.close()
            raise ModelLoadError(
                f"model {transport.model!r} is not an LLMLingua-2 compressor's text model (inputs "
                f"{transport.metadata_inputs}): connect to `<name>_text` of a repository that "
                "`prune repository` wrote from an LLMLingua-2 export"
            )
        params = transport.parameters()
        #: a call's limits, the server's (its text model's max_passages and max_chars)
        self.limits = Limits(max_passages=int(params["max_passages"]), max_chars=int(params["max_chars"]))
        #: wordpiece or sentencepiece (prune repository writes it)
        self.tokenizer_kind = params.get("tokenizer_kind", "unknown")

    @classmethod
    def connect(cls, url: str, model: str, **kwargs: Any) -> "TritonCompressor":
        """The compressor's text model `model` on the Triton server at `url` (host:port); the
        keywords are TritonClient's (protocol, timeout, retries, backoff, ready_timeout)."""
        from engine.triton.client import TritonClient

        return cls(TritonClient(url, model, **kwargs))

    def compress(self, context: str | list[str], **arguments: Any) -> CompressResult:
        """Compressor.compress, run by the server: the same arguments, the same result."""
        c = self.transport
        try:
            body = json.dumps({"context": context, **arguments}, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise InputError(f"the call's arguments are not JSON: {exc}") from None
        request = c.tc.InferInput("request", [1], "BYTES")
        request.set_data_from_numpy(np.array([body.encode("utf-8")], dtype=np.object_))
        try:
            answer = c.infer_with_retries(c.model, [request], [c.tc.InferRequestedOutput("result")])
        except Exception as exc:
            bad_input = input_error(str(exc))  # the server refused this input: as in-process
            if bad_input is not None:
                raise bad_input from None
            raise BackendError(f"Triton text model {c.model!r} on {c.url} failed: {exc}") from exc
        out = answer.as_numpy("result")
        if out is None or out.size != 1:
            raise BackendError(f"Triton text model {c.model!r} returned no result")
        data = json.loads(out.reshape(-1)[0])
        data["kept_spans"] = [[tuple(s) for s in spans] for spans in data.get("kept_spans", [])]
        return CompressResult(**data)

    def describe(self) -> str:
        """The server and model, in words."""
        return f"LLMLingua-2 on {self.transport.describe()}"

    def close(self) -> None:
        """Close the connection."""
        self.transport.close()
