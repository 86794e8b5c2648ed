"""`POST /v1/compress`'s body types (its handler is engine.http.app's, as every route's): LLMLingua-2
over HTTP, with `PromptCompressor.compress_prompt`'s argument names (llmlingua 0.2.2,
use_llmlingua2=True) and its result fields, plus `kept_spans` and `kept_contexts`.

    curl -s localhost:8080/v1/compress -H 'Content-Type: application/json' \\
         -d '{"context": "...", "rate": 0.33, "force_tokens": ["\\n", "?"]}'

The body is engine.pipeline.lingua_decide.CompressOptions' fields (one definition) and
`context` (a string or a list of them); a field it does not know is refused (422 naming the
nearest), as /v1/prune refuses one; the call's limits are the pruner's (contexts, characters).
`prune api --model` on an LLMLingua-2 checkpoint or export serves this route, /health, /info
and /metrics; the pruning routes answer 404 saying the model is a compressor. `prune api --model
PRUNER --compressor DIR` serves both jobs at one address: the pruning routes and this one, on the
compressor loaded beside the pruner (/info's `compressor` names it). A pruning model without one
answers 404 here saying so (engine.http.served: the route's job not offered).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Literal, get_type_hints

from pydantic import BaseModel, Field, create_model

from engine.http.models import StrictRequest
from engine.pipeline.lingua_decide import CompressOptions

#: the route
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


def compress_defaults() -> dict[str, Any]:
    """compress's options when a call gives none: CompressRequest's defaults, by their names."""
    return {
        name: list(spec.default) if isinstance(spec.default, list) else spec.default
        for name, spec in CompressRequest.model_fields.items()
        if name != "context"
    }
