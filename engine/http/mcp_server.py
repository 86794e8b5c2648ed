"""The MCP server (`prune mcp`): the pruner and the LLMLingua-2 compressor as Model Context Protocol
tools for agents, on the official `mcp` SDK (pip install 'prune-engine[mcp]').

- `prune_context`: a question and passages in; per passage the kept text, the reranking score and
  the kept sentences' character spans out (Pruner.prune);
- `compress_text`, where a compressor is loaded: a text, a rate or a token target and force tokens
  in; the compressed text, the kept words' spans and the token counts out (Compressor.compress).

The models run in this process, each call on a worker thread (the event loop stays free), at most
`workers` at once and within `timeout` seconds (past it the call's work stops at its next batch:
engine.cancellation.run_cancellable). The engine checks every call as it checks any other (its limits:
passages and characters per call); its InputError, or any of its errors, is the tool's error
result with the engine's message, and the server goes on serving. Over streamable HTTP the app
is `http_app`'s: the SDK's DNS-rebinding protection on a loopback host, the request body bounded,
and with an API key only `Authorization: Bearer KEY` passes (the HTTP API's one rule).

This module has no `from __future__ import annotations`: the SDK reads the tools' signatures, whose
descriptions are made here from the loaded models (their limits, the pruner's default threshold).
"""

import threading
from typing import Annotated, Any, Callable, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from engine.errors import PruneError
from engine.pipeline.inputs import CallOptions
from engine.cancellation import run_cancellable

#: the tools' names
PRUNE_TOOL, COMPRESS_TOOL = "prune_context", "compress_text"
#: the SDK's log levels
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class BudgetUse(BaseModel):
    """What a call's token budget did to one passage (engine.pipeline.budget.Budget)."""

    tokens: int = Field(description="the call's budget_tokens")
    used: int = Field(description="tokens of all the call's pruned passages together")
    kept: int = Field(description="tokens of this passage's pruned text")
    cut: int = Field(description="sentences of this passage the budget removed")
    tokenizer: str = Field(description="the tokenizer that counted")


class PrunedPassage(BaseModel):
    """One passage's answer of prune_context."""

    index: int = Field(description="the passage's position in the call's passages")
    pruned_context: str = Field(
        description="the kept sentences in order, with the passage's own text between them; "
        "empty when nothing in the passage answers the question"
    )
    reranking_score: float | None = Field(
        description="how relevant the whole passage is to the question (the model's raw score: "
        "higher is more relevant; compare passages of one call with it); null for an empty passage"
    )
    kept_spans: list[tuple[int, int]] = Field(
        description="the kept sentences as [start, end) character offsets into the passage"
    )
    compression_rate: float = Field(description="share of the passage's characters removed, 0 to 1")
    budget: BudgetUse | None = Field(
        None, description="the token budget's account, when budget_tokens was set"
    )


class PruneContextResult(BaseModel):
    """prune_context's result: one entry per passage, in input order."""

    results: list[PrunedPassage]


class CompressedText(BaseModel):
    """compress_text's result."""

    compressed_text: str = Field(description="the kept words, in order")
    kept_spans: list[tuple[int, int]] = Field(
        description="the kept words as [start, end) character offsets into the text"
    )
    origin_tokens: int = Field(description="tokens of the text (tiktoken, gpt-3.5-turbo's encoding)")
    compressed_tokens: int = Field(description="tokens of the compressed text (the same count)")


class Calls:
    """Tool calls on worker threads: at most `workers` at once, each within `timeout` seconds;
    the engine's errors become the tool's error result (a ToolError with the engine's message)."""

    def __init__(self, workers: int = 1, timeout: float = 60.0):
        self.workers, self.timeout = workers, timeout
        self._limiter: Any = None  # made on the server's event loop, at the first call

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on a worker thread; a call given up on (past the deadline, or cancelled by
        its client) is told to stop, and stops between two model batches."""
        import anyio

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.workers)
        stop = threading.Event()
        try:
            with anyio.fail_after(self.timeout):
                return await anyio.to_thread.run_sync(
                    run_cancellable, stop, fn, *args, limiter=self._limiter, abandon_on_cancel=True
                )
        except TimeoutError:
            raise ToolError(
                f"the call took longer than {self.timeout:g} s (--request-timeout) and was stopped"
            ) from None
        except PruneError as exc:  # InputError: the caller's to fix; the others: the engine's message
            raise ToolError(str(exc)) from exc
        finally:
            stop.set()


def create_server(
    pruner: Any = None,
    compressor: Any = None,
    *,
    workers: int = 1,
    timeout: float = 60.0,
    log_level: LogLevel = "WARNING",
) -> MCPServer:
    """The MCP server of `pruner` (an engine.Pruner: prune_context) and `compressor` (an
    engine.Compressor: compress_text); at least one of them."""
    import engine

    if pruner is None and compressor is None:
        raise ValueError("the MCP server needs a pruner, a compressor, or both")
    server = MCPServer(
        "prune-engine",
        version=engine.__version__,
        instructions=_instructions(pruner, compressor),
        log_level=log_level,
    )
    calls = Calls(workers, timeout)
    if pruner is not None:
        add_prune_tool(server, pruner, calls)
    if compressor is not None:
        add_compress_tool(server, compressor, calls)
    return server


def _instructions(pruner: Any, compressor: Any) -> str:
    """What the server tells an agent when it connects."""
    out = []
    if pruner is not None:
        out.append(
            f"{PRUNE_TOOL} keeps only the sentences of retrieved passages (search results, documents, tool "
            "output) that answer a question, and scores each passage's relevance: call it before reading "
            "long context."
        )
    if compressor is not None:
        out.append(
            f"{COMPRESS_TOOL} shortens a text with LLMLingua-2 (drops the least informative words, not "
            "question-aware) to fit more into a prompt."
        )
    return " ".join(out)


#: what both tools are: they read, change nothing, and give the same answer to the same call
READ_ONLY = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)


def _limits(limits: Any, items: str) -> str:
    return (
        f"at most {limits.max_passages} {items} and {limits.max_chars} characters in one call"
        " (split a larger one into several calls)"
    )


def add_prune_tool(server: MCPServer, pruner: Any, calls: Calls) -> None:
    """prune_context on `server`: Pruner.prune on a worker thread."""
    default = pruner.spec.family.rules.resolve(CallOptions()).threshold
    limits = pruner.limits

    async def prune_context(
        question: Annotated[str, Field(description="the question the passages should answer (not empty)")],
        passages: Annotated[
            list[str],
            Field(
                description="the passages to prune, each a text of any length; "
                + _limits(limits, "passages"),
                json_schema_extra={"maxItems": limits.max_passages},
            ),
        ],
        threshold: Annotated[
            float | None,
            Field(
                description="keep a sentence whose probability of answering the question passes this, 0 to 1: "
                f"lower keeps more (default: this model's, {default:g})",
                json_schema_extra={"minimum": 0, "maximum": 1},
            ),
        ] = None,
        budget_tokens: Annotated[
            int | None,
            Field(
                description="keep at most this many tokens (the model tokenizer's count) over all the passages "
                "together, the most probable sentences first (default: no budget)",
                json_schema_extra={"minimum": 1},
            ),
        ] = None,
    ) -> PruneContextResult:
        results = await calls.run(_prune, pruner, question, passages, threshold, budget_tokens)
        return PruneContextResult(results=[_passage(r) for r in results])

    prune_context.__doc__ = (
        "Prune retrieved passages to the sentences that answer a question. Each passage is cut into "
        f"sentences, a context-pruning model ({pruner.spec.family.name}) scores each sentence against the "
        "question, and the sentences that pass the threshold are kept, in order, with the passage's own "
        "text. Use it on search results, documents or long tool output before reading them or putting them "
        "in a prompt: it cuts tokens and keeps the answer. Returns, per passage in input order: "
        "pruned_context (the kept text; empty when nothing in the passage is relevant), reranking_score "
        "(the passage's relevance, to rank or drop passages), kept_spans (character offsets of the kept "
        "sentences in the passage) and compression_rate. " + _limits(limits, "passages").capitalize() + "."
    )
    server.add_tool(
        prune_context, name=PRUNE_TOOL, title="Prune context to a question", annotations=READ_ONLY
    )


def _prune(pruner: Any, question: Any, passages: Any, threshold: Any, budget_tokens: Any) -> list[Any]:
    """Pruner.prune with the options the call set (unset: the model's defaults)."""
    options = {"threshold": threshold, "budget_tokens": budget_tokens}
    return pruner.prune(question, passages, **{k: v for k, v in options.items() if v is not None})


def _passage(r: Any) -> PrunedPassage:
    """A PruneResult as prune_context gives it."""
    return PrunedPassage(
        index=r.index,
        pruned_context=r.pruned_context,
        reranking_score=r.reranking_score,
        kept_spans=[(s.start, s.end) for s in r.sentences if s.kept],
        compression_rate=r.compression_rate,
        budget=None if r.budget is None else BudgetUse(**r.budget.to_dict()),
    )


def add_compress_tool(server: MCPServer, compressor: Any, calls: Calls) -> None:
    """compress_text on `server`: Compressor.compress on a worker thread."""
    limits = compressor.limits

    async def compress_text(
        text: Annotated[str, Field(description="the text to compress (not empty)")],
        rate: Annotated[
            float | None,
            Field(
                description="the share of the text's tokens to keep, more than 0 and at most 1 (default 0.5)",
                json_schema_extra={"exclusiveMinimum": 0, "maximum": 1},
            ),
        ] = None,
        target_token: Annotated[
            int | None,
            Field(
                description="instead of rate: about how many tokens to keep (tiktoken's gpt-3.5-turbo count); "
                "overrides rate",
                json_schema_extra={"minimum": 1},
            ),
        ] = None,
        force_tokens: Annotated[
            list[str],
            Field(
                description='strings always kept where they occur, e.g. ["\\n", "?"] to keep line breaks and '
                "question marks (default: none)"
            ),
        ] = [],  # the schema's default; never changed
    ) -> CompressedText:
        result = await calls.run(_compress, compressor, text, rate, target_token, force_tokens)
        return CompressedText(
            compressed_text=result.compressed_prompt,
            kept_spans=result.kept_spans[0] if result.kept_spans else [],
            origin_tokens=result.origin_tokens,
            compressed_tokens=result.compressed_tokens,
        )

    compress_text.__doc__ = (
        "Compress a text with LLMLingua-2: a token classifier keeps the most informative words, in order "
        "and as written, and drops the rest, so more fits into a prompt. It does not know a question: to "
        f"keep what answers one, use {PRUNE_TOOL} where it is offered. rate is the share of tokens to keep "
        "(default 0.5); target_token a token count to aim for instead. Returns compressed_text, kept_spans "
        "(character offsets of the kept words in the text), origin_tokens and compressed_tokens. "
        f"The text may hold at most {limits.max_chars} characters."
    )
    server.add_tool(
        compress_text, name=COMPRESS_TOOL, title="Compress a text (LLMLingua-2)", annotations=READ_ONLY
    )


def _compress(compressor: Any, text: Any, rate: Any, target_token: Any, force_tokens: Any) -> Any:
    """Compressor.compress with the arguments the call set (unset: compress_prompt's defaults)."""
    arguments = {"rate": rate, "target_token": target_token, "force_tokens": force_tokens}
    return compressor.compress(text, **{k: v for k, v in arguments.items() if v is not None})


def http_app(server: MCPServer, host: str, max_body_bytes: int, api_key: str | None = None) -> Any:
    """The streamable HTTP app of `server` at /mcp: the SDK's, its body bounded by `max_body_bytes`
    (413 past it), its DNS-rebinding protection on where `host` is loopback; with `api_key`, a
    request without `Authorization: Bearer KEY` is answered 401."""
    app = server.streamable_http_app(host=host, max_request_body_size=max_body_bytes)
    if not api_key:
        return app
    from engine.http.state import ApiConfig

    config = ApiConfig(api_key=api_key)

    async def guarded(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            credentials = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
            if not config.authorizes(credentials):
                await _unauthorized()(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


def _unauthorized() -> Any:
    """The HTTP API's 401, in its words."""
    from starlette.responses import JSONResponse

    from engine.http.models import ApiError

    kind = ApiError.UNAUTHORIZED
    return JSONResponse(
        kind.body("a valid API key is required: Authorization: Bearer KEY"),
        status_code=kind.status,
        headers={"WWW-Authenticate": "Bearer"},
    )
