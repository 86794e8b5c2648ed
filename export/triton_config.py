"""The pieces of a Triton `config.pbtxt` that the pruners' repository (triton_repository.py) and
an LLMLingua-2 compressor's (triton_compressor.py) both write."""

from __future__ import annotations

import json


def tensor(name: str, dtype: str, dims: str, reshape: str = "", optional: bool = False) -> str:
    """One entry of an `input` or `output` list."""
    extra = "\n    optional: true" if optional else ""
    return f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: [ {dims} ]{reshape}{extra}\n  }}'


def parameters(params: dict[str, str]) -> str:
    """The `parameters` entries (string values, JSON-quoted)."""
    return "\n".join(
        f'parameters: {{\n  key: "{k}"\n  value: {{ string_value: {json.dumps(v)} }}\n}}'
        for k, v in params.items()
    )


def joins_requests(precision: str, join_requests: str) -> bool:
    """Whether the cpu core runs the requests the dynamic batcher groups as one padded batch.
    An INT8 graph quantizes its activations with scales taken over the whole batch, so a
    joined run makes each answer depend on the requests beside it: "auto" runs them alone."""
    if join_requests == "auto":
        return precision != "int8"
    return join_requests == "always"
