"""`POST /v1/compress`: LLMLingua-2 over HTTP, with `PromptCompressor.compress_prompt`'s argument
names (llmlingua 0.2.2, use_llmlingua2=True) and its result fields, plus `kept_spans` and
`kept_contexts`.

    curl -s localhost:8080/v1/compress -H 'Content-Type: application/json' \\
         -d '{"context": "...", "rate": 0.33, "force_tokens": ["\\n", "?"]}'

The body is engine.pipeline.lingua_decide.CompressOptions' fields (one definition) and
`context` (a string or a list of them); a field it does not know is refused (422 naming the
nearest), as /v1/prune refuses one; the call's limits are the pruner's (contexts, characters).
`prune api --model` on an LLMLingua-2 checkpoint or export serves this route, /health, /info
and /metrics; the pruning routes answer 404 saying the model is a compressor. `prune api --model
PRUNER --compressor DIR` serves both jobs at one address: the pruning routes and this one, on the
compressor loaded beside the pruner (/info's `compressor` names it). A pruning model without one
answers 404 here saying so (`refusals`, read once: the app's guard looks the path up).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Literal, get_type_hints

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, create_model

from engine.http.models import POST_ERRORS, CompressorBeside, ErrorBody, StrictRequest
from engine.http.opensearch_api import PATHS as opensearch_paths
from engine.http.state import ApiState
from engine.pipeline.lingua_decide import CompressOptions

PATH = "/v1/compress"

#: what each option does, in the body's schema (the reference's names and defaults)
_HELP = {
    "rate": "the share of tokens to keep, in (0, 1] (tiktoken gpt-3.5-turbo's count)",
    "target_token": "tokens to keep (tiktoken's count); overrides rate; -1: none",
    "use_context_level_filter": "with several contexts, drop the least probable first (the reference's default)",
    "use_token_level_filter": "compress each kept context word by word",
    "target_context": "contexts to keep (the context-level filter); -1: none",
    "context_level_rate": "the share of contexts to keep, in (0, 1]",
    "context_level_target_token": "tokens the kept contexts hold; -1: none",
    "force_context_ids": "contexts always kept (their indices)",
    "return_word_label": "also fn_labeled_original_prompt: every word with 1 (kept) or 0",
    "word_sep": "between the words of fn_labeled_original_prompt",
    "label_sep": "between a word and its label in fn_labeled_original_prompt",
    "token_to_word": "a word's probability: the mean of its tokens' or the first's",
    "force_tokens": "tokens always kept (at most 100); one that is not one token becomes [NEWi]",
    "force_reserve_digit": "keep every word with a digit",
    "drop_consecutive": "drop a force token that repeats the last kept word",
    "chunk_end_tokens": "where a chunk of 512 model tokens may end",
}


def _option_fields() -> dict[str, tuple[Any, Any]]:
    """CompressOptions' fields as pydantic fields: the body's names, types and defaults."""
    types = {tuple[int, ...]: list[int], tuple[str, ...]: list[str]}
    hints = get_type_hints(CompressOptions)
    out: dict[str, tuple[Any, Any]] = {}
    for f in fields(CompressOptions):
        kind = (
            Literal["mean", "first"] if f.name == "token_to_word" else types.get(hints[f.name], hints[f.name])
        )
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        out[f.name] = (kind, Field(default, description=_HELP.get(f.name, "")))
    return out


#: `/v1/compress`'s body: the context and every CompressOptions field, by the reference's names
CompressRequest = create_model(
    "CompressRequest",
    __base__=StrictRequest,
    __doc__="`/v1/compress`'s body: compress_prompt(use_llmlingua2=True)'s arguments.",
    context=(str | list[str], Field(description="the prompt, or its contexts (a list)")),
    **{name: (kind, spec) for name, (kind, spec) in _option_fields().items()},
)


class CompressResponse(BaseModel):
    """`/v1/compress`'s answer: the reference's result fields, the kept words' spans and which
    contexts were kept."""

    compressed_prompt: str = Field(description="the kept words; contexts joined by two newlines")
    compressed_prompt_list: list[str] = Field(description="each kept context's kept words")
    origin_tokens: int = Field(description="the prompt's tokens (tiktoken gpt-3.5-turbo)")
    compressed_tokens: int = Field(description="the compressed prompt's tokens (tiktoken gpt-3.5-turbo)")
    ratio: str = Field(description="origin_tokens / compressed_tokens, as '3.3x'")
    rate: str = Field(description="compressed_tokens / origin_tokens, as '30.6%'")
    saving: str = Field(description="the reference's cost line (GPT-4 at $0.06 per 1k tokens)")
    fn_labeled_original_prompt: str | None = Field(
        None, description="with return_word_label: every word and its label (1 kept, 0 dropped)"
    )
    kept_spans: list[list[tuple[int, int]]] = Field(
        description="engine extra: per context, the kept words as [start, end) character spans of the original"
    )
    kept_contexts: list[int] = Field(
        description="engine extra: the indices of the contexts compressed_prompt_list holds, in order "
        "(the context-level filter drops some)"
    )


class CompressorInfo(BaseModel):
    """`/info`'s answer when the model is an LLMLingua-2 compressor."""

    model: str
    kind: Literal["compressor"] = "compressor"
    family: Literal["llmlingua2"] = "llmlingua2"
    tokenizer: str = Field(description="the word rule: wordpiece (mBERT) or sentencepiece (XLM-R)")
    engine: str
    routes: list[str] = Field(description="the POST routes this model serves")
    defaults: dict[str, Any] = Field(description="compress's options when a call gives none")
    limits: dict[str, int]
    max_body_bytes: int
    max_concurrent: int
    request_timeout: float
    version: str
    device: dict[str, dict] | None = Field(
        default=None, description="the GPU graph's figures, as a pruner's /info"
    )


#: the POST routes of a pruning model, which a compressor does not serve
PRUNING_PATHS = frozenset({"/rerank", "/v1/rerank", "/v2/rerank", "/v1/prune", *opensearch_paths})

router = APIRouter()


@router.post(
    PATH,
    response_model=CompressResponse,
    response_model_exclude_none=True,
    responses=POST_ERRORS,
    summary="Compress a prompt with LLMLingua-2 (compress_prompt's arguments and fields)",
)
async def compress_endpoint(req: CompressRequest, request: Request):  # type: ignore[valid-type]
    """compress_prompt(use_llmlingua2=True) on the body's context, with its options."""
    api: ApiState = request.app.state.api
    options = req.model_dump(exclude={"context"})  # type: ignore[attr-defined]
    result = await api.compress(req.context, options)  # type: ignore[attr-defined]
    return CompressResponse(**result.to_dict())


def refusals(api: ApiState) -> dict[str, str]:
    """The routes not served for the loaded model, each with why (a pruning route on a
    compressor, or /v1/compress on a pruner with no compressor beside it): read once when the app
    is made."""
    if api.family is None:  # the model served is the compressor
        return {
            path: f"the loaded model ({api.config.model_name}) is an LLMLingua-2 compressor: it serves POST "
            f"{PATH}, not {path} (a pruning model does: prune api --model PRUNING_MODEL)"
            for path in PRUNING_PATHS
        }
    if api.compressor is not None:  # a pruner with a compressor beside it: both jobs
        return {}
    return {
        PATH: f"the loaded model ({api.config.model_name}) is a pruning model (family {api.family.name}): "
        f"{PATH} needs an LLMLingua-2 compressor (prune api --model LLMLINGUA2_CHECKPOINT_OR_EXPORT, or "
        "--compressor LLMLINGUA2_DIR beside this model)"
    }


def beside(api: ApiState) -> CompressorBeside | None:
    """`/info`'s `compressor` for a pruner: the compressor loaded beside it, or None."""
    c = api.compressor
    if c is None or api.family is None:
        return None
    return CompressorBeside(
        model=api.config.compressor_name,
        tokenizer=getattr(c, "tokenizer_kind", "?"),
        engine=c.describe(),
        routes=[PATH],
    )


def info(api: ApiState, version: str) -> CompressorInfo:
    """`/info` for a compressor."""
    defaults = {
        name: list(spec.default) if isinstance(spec.default, list) else spec.default
        for name, spec in CompressRequest.model_fields.items()  # type: ignore[attr-defined]
        if name != "context"
    }
    c = api.compressor
    return CompressorInfo(
        model=api.config.model_name,
        tokenizer=c.tokenizer_kind,
        engine=c.describe(),
        routes=[PATH],
        defaults=defaults,
        limits=c.limits.to_dict(),
        max_body_bytes=api.config.max_body_bytes,
        max_concurrent=api.config.max_concurrent,
        request_timeout=api.config.request_timeout,
        version=version,
        device=api.device_reports() or None,
    )


__all__ = [
    "CompressRequest",
    "CompressResponse",
    "CompressorInfo",
    "ErrorBody",
    "router",
    "refusals",
    "info",
    "beside",
]
