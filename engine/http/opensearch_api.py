"""OpenSearch's semantic highlighter calls the engine as its remote model.

OpenSearch 3.x highlights with a remote model through an ML Commons connector whose
`request_body` is `{"question": ..., "context": ..., "inputs": ...}` (neural-search's
RemoteTorchServeConnector.json and ml-commons' SageMaker semantic-highlighter blueprint),
rendered in one of two shapes:
- one document (3.0+): `{"question": Q, "context": C, "inputs": null}` (or `[]`);
- a batch (3.3+, `batch_inference: true`): `{"question": "", "context": "",
  "inputs": [{"question": Q, "context": C}, ...]}`, the hits of one search in order.

The answer is a JSON object whose `highlights` is a list of `{start, end}` (one document)
or a list of such lists, one per input in order. Offsets count UTF-16 code units, as Java
strings do; each list is sorted, without overlaps, within `0 <= start < end <= length`
(OpenSearch 3.7 refuses anything else). The highlights are the sentences the engine keeps
for the question and the document: what `/v1/prune` keeps for that passage alone. The
engine's call options (`threshold`, ...) may be added to the body; the templates send none.
A field the body does not know is refused (422 naming the nearest known one); an `inputs`
item's other keys are ignored (OpenSearch builds those items).

Served at `POST /v1/highlight` (and `/opensearch/highlight`), and at TorchServe's `POST
/predictions/semantic_highlighter`, the URL OpenSearch's own connector names, so that a
connector made for TorchServe points at the engine unchanged (docs/integrations.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from engine.pipeline.results import PruneResult
from engine.errors import InputError
from engine.http.models import StrictRequest
from engine.pipeline.inputs import CallOptions
from engine.pipeline.option_schema import option_fields
from engine.pipeline.text import running_offsets

PATHS = ("/v1/highlight", "/opensearch/highlight", "/predictions/semantic_highlighter")


class OpenSearchInput(BaseModel):
    """One document of a batch: the question and the field's text."""

    model_config = ConfigDict(extra="ignore")
    question: str
    context: str


OpenSearchRequest = create_model(
    "OpenSearchRequest",
    __base__=StrictRequest,
    __doc__="What OpenSearch's connector sends: one question and context, or a batch in `inputs`.",
    question=(str, Field("", description="the question (one document; empty in a batch)")),
    context=(str, Field("", description="the field's text (one document; empty in a batch)")),
    inputs=(list[OpenSearchInput] | None, Field(None, description="a batch: the documents, in order")),
    **option_fields(),
)


class Span(BaseModel):
    """A highlighted span, in UTF-16 code units."""

    start: int
    end: int


class OpenSearchResponse(BaseModel):
    """`highlights`: the spans of one document, or of each document of a batch in order;
    `processing_time_ms`: the request's time in the engine (OpenSearch ignores it, as it
    ignores every other key; the opensearch-py-ml handler sends it too)."""

    highlights: list[Span] | list[list[Span]]
    processing_time_ms: float


def queries(req: Any) -> tuple[list[dict[str, Any]], bool]:
    """(the calls a request asks for, whether it is a batch): one per document."""
    options = CallOptions.of_attributes(req)
    if req.inputs:
        return [
            {"question": d.question, "passages": [d.context], "options": options} for d in req.inputs
        ], True
    if not req.question.strip():
        raise InputError("give question and context, or inputs: [{question, context}, ...]")
    return [{"question": req.question, "passages": [req.context], "options": options}], False


def highlights(result: PruneResult) -> list[Span]:
    """The kept sentences of a result as spans of UTF-16 code units."""
    kept = [s for s in result.sentences if s.kept]
    bounds = utf16_offsets(result.context, [x for s in kept for x in (s.start, s.end)])
    return [Span(start=bounds[2 * k], end=bounds[2 * k + 1]) for k in range(len(kept))]


def utf16_offsets(text: str, positions: Sequence[int]) -> list[int]:
    """UTF-16 offsets (Java's string indices) of ascending code point `positions` in `text`:
    a character outside the Basic Multilingual Plane counts two."""
    if all(ord(c) < 0x10000 for c in text):
        return list(positions)
    return running_offsets(positions, lambda a, b: len(text[a:b].encode("utf-16-le")) // 2)
