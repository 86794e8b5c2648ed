"""The HTTP API's public types: every request and response body, and its one error enum.

These models are the wire contract, kept apart from the engine's dataclasses
(`engine.pipeline.results.PruneResult`): a field renamed inside the engine fails here, loudly,
instead of changing what clients read. TEI's and Cohere's bodies keep their protocols'
field names; `/v1/prune` is the engine's own (docs/http-api.md). OpenAPI (`/openapi.json`)
shows every field of every body.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from enum import Enum
from typing import Any, ClassVar, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator
from pydantic_core import PydanticCustomError

from engine.pipeline.results import PruneResult
from engine.pipeline.families import Family
from engine.pipeline.inputs import CallOptions, Rules, token_windows
from engine.pipeline.option_schema import option_fields, unknown_name
from engine.pipeline.encode import UNKNOWN_SHARE_WARNING

# --------------------------------------------------------------------------- errors


class ErrorBody(BaseModel):
    """TEI's error body, with Cohere's `message` beside it."""

    error: str
    error_type: str
    message: str


class ApiError(Enum):
    """Every error the API answers with: its status, what it means, and TEI's `error_type`
    ("Validation", TEI's kind of a request at fault, unless another is named). One place
    decides both the status and the kind of each error."""

    UNREADABLE = (400, "the body cannot be read (not UTF-8, a bad Content-Length)")
    UNAUTHORIZED = (401, "a missing or wrong API key", "Unauthorized")
    NOT_FOUND = (404, "no such route")
    NOT_ALLOWED = (405, "the route does not take this method")
    NOT_OFFERED = (
        404,
        "the route is not offered for the loaded model (a compressor serves /v1/compress only)",
        "NotOffered",
    )
    BODY_TIMEOUT = (408, "the body arrived too slowly")
    TOO_LARGE = (413, "the body is over --max-body-bytes")
    INVALID = (422, "invalid input, naming the field")
    OVERLOADED = (429, "too many requests in flight (Retry-After)", "Overloaded")
    SERVER = (500, "an unexpected server error", "Server")
    BACKEND = (503, "the engine failed", "Backend")
    UNHEALTHY = (503, "the engine did not answer", "Unhealthy")
    TIMEOUT = (504, "no answer within --request-timeout", "Timeout")

    def __init__(self, status: int, meaning: str, error_type: str = "Validation"):
        self.status, self.error_type, self.meaning = status, error_type, meaning

    def body(self, message: str) -> dict[str, str]:
        """The JSON body of this error with `message`."""
        return ErrorBody(error=message, error_type=self.error_type, message=message).model_dump()

    @classmethod
    def of_status(cls, status: int) -> ApiError:
        """The error a framework-raised status (404, 405, ...) is answered as."""
        for kind in cls:
            if kind.status == status:
                return kind
        return cls.INVALID if status < 500 else cls.SERVER


#: the errors every POST route may answer with, documented in the schema
POST_ERRORS: dict[int | str, dict[str, Any]] = {
    kind.status: {"model": ErrorBody, "description": kind.meaning}
    for kind in (
        ApiError.UNREADABLE,
        ApiError.UNAUTHORIZED,
        ApiError.NOT_OFFERED,
        ApiError.BODY_TIMEOUT,
        ApiError.TOO_LARGE,
        ApiError.INVALID,
        ApiError.OVERLOADED,
        ApiError.BACKEND,
        ApiError.TIMEOUT,
    )
}


# --------------------------------------------------------------------------- shared parts


class _Request(BaseModel):
    """A protocol's body (TEI's, Cohere's): a field the engine does not use is ignored, as
    TEI's serde types and Cohere's published schema do (clients send fields of their own:
    Cohere's priority, max_tokens_per_doc, ...); but a field whose name is close to one of the
    engine's extras (`budget_token` for `budget_tokens`) is refused, as /v1/prune refuses it:
    an extra asked for and misspelt is never dropped in silence."""

    model_config = ConfigDict(extra="ignore")
    ENGINE_EXTRAS: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _misspelt_extras(cls, data: Any) -> Any:
        if isinstance(data, dict) and cls.ENGINE_EXTRAS:
            import difflib

            for name in data:
                if name not in cls.model_fields and difflib.get_close_matches(
                    str(name), cls.ENGINE_EXTRAS, n=1, cutoff=0.75
                ):
                    raise PydanticCustomError(
                        "unknown_field",
                        "{message}",
                        {"message": unknown_name(str(name), list(cls.ENGINE_EXTRAS), "engine extra")},
                    )
        return data


class StrictRequest(BaseModel):
    """The engine's own bodies (/v1/prune, /v1/highlight): a field they do not know is
    refused (422 naming it and the nearest known one), never a silent default."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in data:
                if name not in cls.model_fields:
                    raise PydanticCustomError(
                        "unknown_field",
                        "{message}",
                        {"message": unknown_name(str(name), list(cls.model_fields))},
                    )
        return data


class SentenceOut(BaseModel):
    """One sentence of a passage: its text, character span, keep probability and decision."""

    text: str
    start: int = Field(description="character offset of the sentence in its passage")
    end: int = Field(description="character offset just past the sentence")
    probability: float = Field(description="the sentence's keep probability")
    kept: bool


def sentences_out(result: PruneResult) -> list[SentenceOut]:
    """A result's sentences as the API returns them."""
    return [
        SentenceOut(text=s.text, start=s.start, end=s.end, probability=s.probability, kept=s.kept)
        for s in result.sentences
    ]


# --------------------------------------------------------------------------- TEI


class TeiRerankRequest(_Request):
    """TEI's `/rerank` body (text-embeddings-inference's RerankRequest), plus `return_sentences`."""

    query: str = Field(min_length=1, description="the question")
    texts: list[str] = Field(description="the passages to rank and prune")
    raw_scores: bool = Field(False, description="the model's own score instead of one in [0, 1]")
    return_text: bool = Field(False, description="return each text")
    truncate: bool = Field(
        False, description="accepted for TEI clients; nothing is truncated (long texts are cut into windows)"
    )
    truncation_direction: Literal["Left", "Right", "left", "right"] = "Right"
    return_sentences: bool = Field(
        False, description="engine extra: each text's sentences with spans, probabilities and kept flags"
    )
    budget_tokens: int | None = Field(
        None,
        description="engine extra: pruned_text within this many tokens over all texts (the /v1/prune option)",
    )
    budget_tokenizer: str | None = Field(
        None, description="engine extra: what budget_tokens counts (the /v1/prune option)"
    )
    compress_rate: float | None = Field(
        None,
        description="engine extra: with a compressor beside the pruner (prune api --compressor), each "
        "pruned_text compressed by LLMLingua-2 to this share of its tokens (the /v1/prune option)",
    )
    compress_target_token: int | None = Field(
        None, description="engine extra: the same to this many tokens over each text (the /v1/prune option)"
    )
    ENGINE_EXTRAS: ClassVar[tuple[str, ...]] = (
        "return_sentences",
        "budget_tokens",
        "budget_tokenizer",
        "compress_rate",
        "compress_target_token",
    )


class TeiRank(BaseModel):
    """One text of TEI's `/rerank` answer, best first; `pruned_text` is the engine's extra."""

    index: int
    score: float
    text: str | None = None
    pruned_text: str = Field(description="engine extra: the text's kept sentences")
    compressed_text: str | None = Field(
        None, description="engine extra, with compress_rate or compress_target_token: pruned_text compressed"
    )
    sentences: list[SentenceOut] | None = None


# --------------------------------------------------------------------------- Cohere


class CohereDocument(BaseModel):
    """A Cohere document given as an object (v1 allows `{"text": ...}` with fields of its own)."""

    model_config = ConfigDict(extra="allow")
    text: str


class CohereRerankRequest(_Request):
    """Cohere's rerank body (v1 and v2)."""

    model: str | None = None
    query: str = Field(min_length=1)
    documents: list[str | CohereDocument]
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False


class CohereDocumentOut(BaseModel):
    """A returned document (`return_documents=true`)."""

    text: str


class CohereResult(BaseModel):
    """One document of Cohere's answer, best first."""

    index: int
    relevance_score: float
    document: CohereDocumentOut | None = None


class CohereApiVersion(BaseModel):
    """Cohere's `meta.api_version`."""

    version: str


class CohereBilledUnits(BaseModel):
    """Cohere's `meta.billed_units`."""

    search_units: int


class CohereMeta(BaseModel):
    """Cohere's `meta`."""

    api_version: CohereApiVersion
    billed_units: CohereBilledUnits


class CohereRerankResponse(BaseModel):
    """Cohere's rerank answer."""

    id: str
    results: list[CohereResult]
    meta: CohereMeta


# --------------------------------------------------------------------------- /v1/prune

#: `/v1/prune`'s body: the question, the passages, every CallOptions option, and the tags
PruneRequest = create_model(
    "PruneRequest",
    __base__=StrictRequest,
    question=(str, Field(min_length=1, description="the question the passages are pruned for")),
    passages=(list[str], Field(description="the passages, one call")),
    **option_fields(),
    pre=(
        str | None,
        Field(None, description="with post: each result's passage with its kept sentences tagged"),
    ),
    post=(str | None, Field(None, description="the tag after each kept sentence (with pre)")),
)


class BudgetOut(BaseModel):
    """What a call's budget did (engine.pipeline.budget.Budget), on each passage of a call that set budget_tokens."""

    tokens: int = Field(description="the call's budget_tokens")
    used: int = Field(description="tokens the call's pruned texts hold together")
    kept: int = Field(description="tokens this passage's pruned text holds")
    cut: int = Field(description="sentences of this passage the threshold kept and the budget cut")
    tokenizer: str = Field(
        description="what counted: model (the engine model's tokenizer), a tiktoken encoding "
        "or a tokenizer.json path"
    )


class PrunedPassage(BaseModel):
    """One passage of `/v1/prune`'s answer, in the call's order (or reordered)."""

    index: int = Field(description="the passage's position in the request")
    context: str = Field(description="the passage, untouched")
    pruned_context: str = Field(description="the kept sentences, with their original separators")
    reranking_score: float | None = Field(
        description="the model's own passage score (null: an empty passage)"
    )
    sentences: list[SentenceOut]
    compression_rate: float = Field(description="share of the passage's characters removed, 0..1")
    threshold: float = Field(description="the keep threshold the call ran with")
    blocks: int = Field(description="model windows the passage needed")
    windows: str = Field(description="how a long passage was cut: 'sentences' or 'reference'")
    splitter: str = Field(
        description="who cut the passage into sentences: 'engine' or 'reference' (the family's own code's)"
    )
    lexical_weight: float = Field(description="the lexical score's share in the probabilities")
    highlighted: str | None = Field(
        None, description="with pre and post: the passage with its kept sentences tagged"
    )
    budget: BudgetOut | None = Field(None, description="with budget_tokens: what the budget kept and cut")
    unknown_share: float | None = Field(
        None,
        description="share of the passage's non-space characters the model does not see as written "
        f"([UNK], dropped by its tokenizer, or an accent or voicing mark stripped); over {UNKNOWN_SHARE_WARNING} "
        "its scores "
        "mean little (text outside the model's vocabulary: use a multilingual model); absent where not "
        "measured",
    )
    compressed_context: str | None = Field(
        None,
        description="with compress_rate or compress_target_token: the kept text compressed by the "
        "token compressor beside the pruner (LLMLingua-2), with the passage's separators",
    )
    compressed_spans: list[tuple[int, int]] | None = Field(
        None,
        description="with compress_rate or compress_target_token: its words as [start, end) of the passage",
    )

    @classmethod
    def of(cls, r: PruneResult, highlighted: str | None = None) -> PrunedPassage:
        """The wire form of one engine result."""
        out = cls(
            index=r.index,
            context=r.context,
            pruned_context=r.pruned_context,
            reranking_score=r.reranking_score,
            sentences=sentences_out(r),
            compression_rate=r.compression_rate,
            threshold=r.threshold,
            blocks=r.blocks,
            windows=r.windows,
            splitter=r.splitter,
            lexical_weight=r.lexical_weight,
        )
        if highlighted is not None:
            out.highlighted = highlighted
        if r.budget is not None:
            out.budget = BudgetOut(**r.budget.to_dict())
        if r.unknown_share is not None:
            out.unknown_share = r.unknown_share
        if r.compressed_context is not None:
            out.compressed_context, out.compressed_spans = r.compressed_context, r.compressed_spans
        return out


class PruneResponse(BaseModel):
    """`/v1/prune`'s answer."""

    model: str
    results: list[PrunedPassage]


# --------------------------------------------------------------------------- /health, /info


class HealthResponse(BaseModel):
    """`/health`'s answer when the engine is up; `checked` says how it was known."""

    status: Literal["ok"]
    checked: Literal["requests", "probe"] = Field(
        description="'requests': a request succeeded within the last few seconds; 'probe': a health inference "
        "of its own answered"
    )


def _rules_fields() -> dict[str, tuple[Any, Any]]:
    """engine.pipeline.inputs.Rules' settings as pydantic fields: the one definition, by its names."""
    hints = get_type_hints(Rules)
    return {f.name: (hints[f.name], ... if f.default is MISSING else f.default) for f in fields(Rules)}


RulesBody = create_model(
    "RulesBody",
    __doc__="The model's decision rules (engine.pipeline.inputs.Rules): its family's "
    "defaults with its export's; threshold applies to the model's scores alone, "
    "lexical_threshold (when not null) to the fused ones, so a call at the defaults may run another "
    "threshold than this one: `defaults.threshold` is the one it runs.",
    **_rules_fields(),
)

Defaults = create_model(
    "Defaults",
    __base__=RulesBody,
    __doc__="The decision settings a call gets when it passes none: the model's rules resolved for such a call "
    "(engine.pipeline.inputs.Rules.resolve; `threshold` the one it runs with), and what they mean.",
    threshold_without_lexical=(
        float,
        Field(description="the threshold of a call that sets lexical_weight 0"),
    ),
    score_kind=(str, Field(description="what reranking_score is: logit, probability, cosine or none")),
    zero_rerank_when_empty=(bool, Field(False, description="a passage with nothing kept scores 0.0")),
    decides_per_window=(
        bool,
        Field(
            False,
            description="a long passage is decided per token window (the union of "
            "the windows' decisions), not from its sentences' merged "
            "probabilities",
        ),
    ),
)


class CompressorBeside(BaseModel):
    """`/info`'s `compressor`: the LLMLingua-2 compressor loaded beside the pruner (`prune api
    --compressor DIR`), which answers POST /v1/compress and a call's `compress_rate`."""

    model: str = Field(description="its name (the folder's)")
    family: Literal["llmlingua2"] = "llmlingua2"
    tokenizer: str = Field(description="the word rule: wordpiece (mBERT) or sentencepiece (XLM-R)")
    engine: str
    routes: list[str] = Field(description="the POST routes it serves")


class InfoResponse(BaseModel):
    """`/info`'s answer: the model, its family and defaults, the engine, the limits (and the
    compressor beside the pruner, if one is loaded)."""

    model: str
    family: str
    rules: RulesBody
    defaults: Defaults
    engine: str
    max_length: int
    limits: dict[str, int]
    max_body_bytes: int
    max_concurrent: int
    request_timeout: float
    version: str
    device: dict[str, dict] | None = Field(
        default=None,
        description="the GPU graph's figures (model, and a compressor beside it): memory budget, weights "
        "(shared in place or not), dynamic session, each captured shape's bytes and capture seconds, total",
    )
    compressor: CompressorBeside | None = Field(
        None, description="the LLMLingua-2 compressor beside the pruner (POST /v1/compress); null: none"
    )


def info_rules(family: Family) -> tuple[RulesBody, Defaults]:
    """`/info`'s `rules` and `defaults` for a model of `family` (with its export's defaults)."""
    rules = family.rules
    defaults = Defaults(
        **rules.resolve(CallOptions()).to_dict(),
        threshold_without_lexical=rules.threshold_at(0.0),
        score_kind=family.score_kind,
        zero_rerank_when_empty=family.zero_rerank_when_empty,
        decides_per_window=token_windows(rules.windows, family.window_tokens),
    )
    return RulesBody(**rules.to_dict()), defaults
