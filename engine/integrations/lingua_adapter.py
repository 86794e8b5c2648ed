"""What the LLMLingua-2 adapters share (LangChain's `LinguaCompressor`, LlamaIndex's
`LinguaPostprocessor`): the compressor they are given, their options by the names of the
frameworks' own LLMLingua classes, and one compress call per query.

The frameworks already offer LLMLingua through llmlingua's `PromptCompressor`: LangChain's
`LLMLinguaCompressor` (langchain-community, `document_compressors/llmlingua_filter.py`) and
LlamaIndex's `LongLLMLinguaPostprocessor` (llama-index-postprocessor-longllmlingua; LLMLingua-2
with `use_llmlingua2=True`, there is no other LLMLingua-2 class). The names of theirs that mean
the same for LLMLingua-2 are kept: `target_token`, and `additional_compress_kwargs`, the rest of
`compress_prompt`'s arguments (`rate`, `force_tokens`, `force_reserve_digit`, `drop_consecutive`,
...; engine.pipeline.lingua_decide.CompressOptions). The model is `compressor` (a Compressor, a
server's URL, a folder), in place of their model_name/device_map/model_config/lingua.

LLMLingua-2 is question-agnostic: the originals pass the query (`question`), an instruction and a
`rank_method` to `compress_prompt`, which drops them, and LongLLMLingua's other arguments, for an
LLMLingua-2 model. Here those names are refused with that reason rather than silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr, model_validator

from engine.errors import InputError
from engine.pipeline.lingua_decide import CompressOptions, CompressResult

#: compress_prompt's arguments that it drops for an LLMLingua-2 model (LongLLMLingua's, llmlingua 0.2.2)
LONGLLMLINGUA_ONLY = frozenset(
    {
        "instruction",
        "question",
        "rank_method",
        "iterative_size",
        "force_context_number",
        "use_sentence_level_filter",
        "keep_split",
        "keep_first_sentence",
        "keep_last_sentence",
        "keep_sentence_number",
        "high_priority_bonus",
        "context_budget",
        "token_budget_ratio",
        "condition_in_question",
        "reorder_context",
        "dynamic_context_compression_ratio",
        "condition_compare",
        "add_instruction",
        "concate_question",
        "context_segs",
        "context_segs_rate",
        "context_segs_compress",
        "strict_preserve_uncompressed",
    }
)
#: the originals' ways of naming the model (PromptCompressor's arguments, LangChain's `lingua`)
MODEL_NAMES = frozenset(
    {
        "model_name",
        "device_map",
        "model_config",
        "model_configuration",
        "open_api_config",
        "lingua",
        "use_llmlingua2",
    }
)


def refusal(name: str) -> str | None:
    """Why an original class's argument `name` is not one here, or None for a name it never had."""
    if name in LONGLLMLINGUA_ONLY or name == "instruction_str":
        return (
            f"{name} is LongLLMLingua's: LLMLingua-2 is question-agnostic, and llmlingua's compress_prompt "
            "drops it for an LLMLingua-2 model (the query, instruction and rank_method included)"
        )
    if name in MODEL_NAMES:
        return (
            f"{name}: the model is `compressor` here (an engine Compressor, a server's URL with /v1/compress, "
            "or an LLMLingua-2 checkpoint or export folder)"
        )
    return None


def resolve_compressor(compressor: Any) -> Any:
    """A compressor object (in-process `Compressor`, an `HttpCompressor`) as it is; an `http(s)://`
    URL: the HTTP API's `/v1/compress`; a path: `Compressor.load` of that checkpoint or export."""
    if isinstance(compressor, (str, Path)):
        text = str(compressor)
        if text.startswith(("http://", "https://")):
            from engine.remote.http_client import HttpCompressor

            return HttpCompressor(text)
        from engine.compressor import Compressor

        return Compressor.load(text)
    if not callable(getattr(compressor, "compress", None)):
        raise TypeError(
            "compressor must be a Compressor, a server's URL or an LLMLingua-2 folder, "
            f"got {type(compressor).__name__}"
        )
    return compressor


def compress_options(target_token: int, extra: dict[str, Any]) -> dict[str, Any]:
    """compress's keyword arguments: `target_token` and `additional_compress_kwargs` (`extra`),
    checked now (an InputError naming what is wrong), as the original would pass them."""
    for name in extra:
        if why := refusal(name):
            raise InputError(f"additional_compress_kwargs: {why}")
    if "target_token" in extra:  # the original's call would be a TypeError: the argument given twice
        raise InputError("additional_compress_kwargs: target_token is the adapter's own field; give it there")
    options = {"target_token": target_token, **extra}
    CompressOptions.of(**options)
    return options


class LinguaModel(BaseModel):
    """The compressor an adapter is given, opened once when the adapter is made, and its options
    (checked then)."""

    compressor: Any = Field(
        description="an engine Compressor (Compressor.load), an HttpCompressor, a server's URL "
        "(its /v1/compress), or an LLMLingua-2 checkpoint or export folder"
    )
    target_token: int = Field(
        -1, description="tokens to keep, over the whole call (tiktoken's count); -1: none"
    )
    additional_compress_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="the rest of compress_prompt's arguments for LLMLingua-2: rate, force_tokens, "
        "force_reserve_digit, drop_consecutive, use_context_level_filter, ...",
    )
    metadata_key: str = Field("compression", description="the metadata key the compression details go under")
    _engine: Any = PrivateAttr(default=None)
    _call: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in sorted(k for k in data if k not in cls.model_fields and not k.startswith("_")):
                why = refusal(name)
                raise InputError(
                    f"{cls.__name__} has no option {name!r}"
                    + (f" ({why})" if why else "")
                    + "; its options: "
                    f"{', '.join(n for n in cls.model_fields if n != 'callback_manager')}"
                )
        return data

    def model_post_init(self, __context: Any) -> None:
        """Check the options, open the compressor."""
        self._call = compress_options(self.target_token, self.additional_compress_kwargs)
        self._engine = resolve_compressor(self.compressor)

    def _compress(self, context: str | list[str]) -> CompressResult:
        """One compress call on `context` with the adapter's options."""
        return self._engine.compress(context, **self._call)


def figures(result: CompressResult) -> dict[str, Any]:
    """The call's figures, as compress_prompt reports them (tokens of tiktoken gpt-3.5-turbo)."""
    return {
        "origin_tokens": result.origin_tokens,
        "compressed_tokens": result.compressed_tokens,
        "ratio": result.ratio,
        "rate": result.rate,
    }
