"""The text model's wire contract: text in, pruned text out, over KServe v2 (Triton).

One request is one question and its passages, as UTF-8 BYTES tensors:

    inputs   question  BYTES [1]          required
             passages  BYTES [P]          required (P may be 0)
             and one optional tensor [1] per option of engine.pipeline.inputs.CallOptions, of its
             type (FP32 threshold, alpha, lexical_weight, passage_margin; INT32 top_k;
             BOOL reorder; BYTES title, windows, splitter): absent is the model's default, a
             negative alpha or passage_margin turns that rule off, as everywhere
    outputs  passage_index    INT32 [R]        which input passage each row is (input order,
                                               or best first with top_k)
             reranking_score  FP32  [R]        NaN where a passage produced no tokens
             sentence_count   INT32 [R]
             sentence_spans   INT64 [R, S, 2]  UTF-8 byte offsets [start, end) into the
                                               passage as sent, padded with -1
             sentence_probs   FP32  [R, S]     padded with -1
             kept             BOOL  [R, S]     padded with false
             pruned_context   BYTES [R]        kept sentences, original text and separators
             compression_rate FP32  [R]        share of the passage's characters removed
             blocks           INT32 [R]        model windows the passage needed
             unknown_share    FP32  [R]        share of the passage's characters the model does not
                                               see as written (engine.pipeline.encode); NaN:
                                               not measured. Optional (OPTIONAL_OUTPUTS): a client
                                               asks for it where the model has it, so a repository
                                               written before it still serves

Offsets count UTF-8 bytes of the passage exactly as the client sent it: the one unit
every client language can slice its own request with (Python and Rust strings count
code points or bytes, Java and JavaScript UTF-16 units; the bytes on the wire are the
same for all). The Python client turns them back into code point offsets.

A request with neither `question` nor `passages` is a *describe* request: it returns
`manifest` and `tokenizer` (BYTES [1], JSON), so a client of the token-level core can
fetch the tokenizer from the server. Torch-free; no Triton import (the server side and
the client side both use it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.pipeline.results import PruneResult, Sentence
from engine.errors import InputError
from engine.pipeline.inputs import OPTION_NAMES, CallOptions, Limits, check_call
from engine.pipeline.option_schema import option_type
from engine.settings import DEFAULTS
from engine.pipeline.text import running_offsets

#: the Triton datatype of each option type (engine.pipeline.option_schema.option_type)
OPTION_DATATYPES = {float: "FP32", int: "INT32", bool: "BOOL", str: "BYTES"}
#: name -> (Triton datatype, dims) of the text model's inputs; all optional in the config
#: (a describe request has none); `question` and `passages` are checked by `read_request`;
#: the options are CallOptions', one element each.
TEXT_INPUTS: dict[str, tuple[str, list[int]]] = {
    "question": ("BYTES", [1]),
    "passages": ("BYTES", [-1]),
    **{name: (OPTION_DATATYPES[option_type(name)], [1]) for name in OPTION_NAMES},
}
TEXT_OUTPUTS: dict[str, tuple[str, list[int]]] = {
    "passage_index": ("INT32", [-1]),
    "reranking_score": ("FP32", [-1]),
    "sentence_count": ("INT32", [-1]),
    "sentence_spans": ("INT64", [-1, -1, 2]),
    "sentence_probs": ("FP32", [-1, -1]),
    "kept": ("BOOL", [-1, -1]),
    "pruned_context": ("BYTES", [-1]),
    "compression_rate": ("FP32", [-1]),
    "blocks": ("INT32", [-1]),
    "unknown_share": ("FP32", [-1]),
}
#: the outputs a text model written by an earlier version lacks: asked for only where it has them
OPTIONAL_OUTPUTS = ("unknown_share",)


def requested_outputs(available: Sequence[str] | None) -> list[str]:
    """The outputs a client asks a text model for: every one but an optional output the model
    lacks (`available`: its metadata's outputs; None: unknown, ask for all)."""
    have = set(available or TEXT_OUTPUTS)
    return [n for n in TEXT_OUTPUTS if n in have or n not in OPTIONAL_OUTPUTS]


DESCRIBE_OUTPUTS: dict[str, tuple[str, list[int]]] = {
    "manifest": ("BYTES", [1]),
    "tokenizer": ("BYTES", [1]),
}
#: Per-request limits of the text model (`prune repository --text-max-passages/-chars`):
#: an `engine.pipeline.inputs.Limits` that the server checks each request against.
DEFAULT_MAX_PASSAGES = DEFAULTS.text_max_passages
DEFAULT_MAX_CHARS = DEFAULTS.text_max_chars
#: Marks an error that the request's input caused (an `InputError` on the server), so the
#: client raises InputError with the same message instead of a BackendError.
INPUT_ERROR_PREFIX = "invalid input: "


def input_error(message: str) -> InputError | None:
    """The InputError a server error message carries (see INPUT_ERROR_PREFIX), or None."""
    at = message.find(INPUT_ERROR_PREFIX)
    return None if at < 0 else InputError(message[at + len(INPUT_ERROR_PREFIX) :].strip())


@dataclass
class TextRequest:
    """One text-model request: a question, its passages and the call's options."""

    question: str
    passages: list[str]
    options: CallOptions = field(default_factory=CallOptions)


# ---------------------------------------------------------------------- offsets


def byte_offsets(text: str, positions: Sequence[int]) -> list[int]:
    """UTF-8 byte offsets of ascending code point `positions` in `text` (one pass)."""
    if text.isascii():
        return list(positions)
    return running_offsets(positions, lambda a, b: len(text[a:b].encode("utf-8")))


def char_offsets(text: str, positions: Sequence[int]) -> list[int]:
    """Code point offsets of ascending UTF-8 byte `positions` into `text.encode()`."""
    if text.isascii():
        return list(positions)
    data = text.encode("utf-8")
    return running_offsets(positions, lambda a, b: len(data[a:b].decode("utf-8")))


# ---------------------------------------------------------------------- server side


def _decode(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, (bytes, bytearray, np.bytes_)):
        raise InputError(f"{what} must be BYTES (UTF-8 text), got {type(value).__name__}")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} is not valid UTF-8 (byte {exc.start}: {exc.reason})") from None


def _one(arr: np.ndarray, name: str) -> Any:
    if arr.size != 1:
        raise InputError(f"{name} must hold exactly one value, got shape {list(arr.shape)}")
    return arr.reshape(-1)[0]


def read_request(get: Callable[[str], np.ndarray | None], limits: Limits) -> TextRequest | None:
    """Parse one request from its tensors (`get(name)` -> numpy array or None).

    Returns None for a describe request; raises InputError for anything invalid, with the
    message every entry point gives (`engine.pipeline.inputs`) or one that names the tensor."""
    q, p = get("question"), get("passages")
    others = {n: get(n) for n in OPTION_NAMES}
    if q is None and p is None:
        if any(v is not None for v in others.values()):
            raise InputError("question and passages are required")
        return None
    if q is None:
        raise InputError("question is required (BYTES [1], UTF-8)")
    if p is None:
        raise InputError(
            "passages is required (BYTES [P], UTF-8; one request = one question and its passages)"
        )
    question = _decode(_one(q, "question"), "question")
    if p.ndim != 1:
        raise InputError(f"passages must be BYTES [P], got shape {list(p.shape)}")
    limits.check_count(p.shape[0])  # before decoding any of them
    question, passages = check_call(
        question, [_decode(raw, f"passage {i}") for i, raw in enumerate(p)], limits
    )
    values = {}
    for name, arr in others.items():
        if arr is not None:
            kind, one = option_type(name), _one(arr, name)
            values[name] = _decode(one, name) if kind is str else kind(one)
    return TextRequest(question, passages, CallOptions.of(**values))


def options_to_tensors(options: CallOptions) -> dict[str, np.ndarray]:
    """The tensors [1] of the options a call sets (the others stay absent: the model's
    default), as `read_request` reads them back."""
    out = {}
    for name, value in options.given().items():
        kind = option_type(name)
        out[name] = (
            np.array([value.encode("utf-8")], dtype=np.object_)
            if kind is str
            else np.array([value], dtype={float: np.float32, int: np.int32, bool: np.bool_}[kind])
        )
    return out


def results_to_tensors(results: Sequence[PruneResult]) -> dict[str, np.ndarray]:
    """The text model's outputs for one request's results (see the module docstring)."""
    n = len(results)
    width = max((len(r.sentences) for r in results), default=0)
    spans = np.full((n, width, 2), -1, dtype=np.int64)
    probs = np.full((n, width), -1.0, dtype=np.float32)
    kept = np.zeros((n, width), dtype=bool)
    for row, r in enumerate(results):
        k = len(r.sentences)
        if not k:
            continue
        bounds = byte_offsets(r.context, [x for s in r.sentences for x in (s.start, s.end)])
        spans[row, :k] = np.asarray(bounds, dtype=np.int64).reshape(k, 2)
        probs[row, :k] = [s.probability for s in r.sentences]
        kept[row, :k] = [s.kept for s in r.sentences]
    return {
        "passage_index": np.array([r.index for r in results], dtype=np.int32),
        "reranking_score": np.array(
            [math.nan if r.reranking_score is None else r.reranking_score for r in results], dtype=np.float32
        ),
        "sentence_count": np.array([len(r.sentences) for r in results], dtype=np.int32),
        "sentence_spans": spans,
        "sentence_probs": probs,
        "kept": kept,
        "pruned_context": np.array([r.pruned_context.encode("utf-8") for r in results], dtype=np.object_),
        "compression_rate": np.array([r.compression_rate for r in results], dtype=np.float32),
        "blocks": np.array([r.blocks for r in results], dtype=np.int32),
        "unknown_share": np.array(
            [math.nan if r.unknown_share is None else r.unknown_share for r in results], dtype=np.float32
        ),
    }


def describe_tensors(manifest: dict[str, Any], tokenizer_json: str) -> dict[str, np.ndarray]:
    """The text model's describe answer: its manifest and tokenizer as JSON tensors."""
    return {
        "manifest": np.array([json.dumps(manifest).encode("utf-8")], dtype=np.object_),
        "tokenizer": np.array([tokenizer_json.encode("utf-8")], dtype=np.object_),
    }


# ---------------------------------------------------------------------- client side


def tensors_to_results(
    passages: Sequence[str],
    out: dict[str, np.ndarray],
    threshold: float,
    offset: int = 0,
    windows: str = "sentences",
    lexical_weight: float = 0.0,
    splitter: str = "engine",
) -> list[PruneResult]:
    """PruneResults (code point offsets) from one response of the text model; `offset` is
    the index of `passages[0]` in the caller's whole call; `windows` the windowing it ran,
    `splitter` the splitter, `threshold` and `lexical_weight` the settings it ran with."""
    results = []
    for row, idx in enumerate(np.asarray(out["passage_index"]).reshape(-1)):
        context = passages[int(idx)]
        k = int(out["sentence_count"][row])
        flat = out["sentence_spans"][row, :k].reshape(-1).tolist()
        bounds = char_offsets(context, flat)
        sentences = [
            Sentence(
                context[bounds[2 * j] : bounds[2 * j + 1]],
                bounds[2 * j],
                bounds[2 * j + 1],
                float(out["sentence_probs"][row, j]),
                bool(out["kept"][row, j]),
            )
            for j in range(k)
        ]
        score = float(out["reranking_score"][row])
        pruned = out["pruned_context"][row]
        unknown = math.nan if out.get("unknown_share") is None else float(out["unknown_share"][row])
        results.append(
            PruneResult(
                index=offset + int(idx),
                context=context,
                pruned_context=pruned.decode("utf-8") if isinstance(pruned, bytes) else str(pruned),
                reranking_score=None if math.isnan(score) else score,
                sentences=sentences,
                compression_rate=float(out["compression_rate"][row]),
                threshold=threshold,
                blocks=int(out["blocks"][row]),
                windows=windows,
                lexical_weight=float(lexical_weight),
                splitter=splitter,
                unknown_share=None if math.isnan(unknown) else round(unknown, 4),
            )
        )
    return results
