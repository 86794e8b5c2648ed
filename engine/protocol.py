"""The protocols of the two model kinds: what every pruner offers (PrunerProtocol) and what every
compressor offers (CompressorProtocol), wherever its model runs.

Pruners: two classes satisfy it: `engine.pruner.Pruner` (in-process, or a Triton core model with
client-side tokenization) and `engine.remote.text_pruner.TritonTextPruner` (a Triton text
model: text in, results out). `Pruner.load` and `Pruner.connect` return one of them; code
above the pruner (batch files, the HTTP API, the framework adapters) is written against
this protocol alone. Both check their input with `engine.pipeline.inputs`, so a bad call gets the
same InputError from either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from engine.pipeline.results import PruneResult
from engine.pipeline.families import Family
from engine.pipeline.inputs import CallOptions, Limits
from engine.pipeline.lingua_decide import CompressResult
from engine.pipeline.spec import ModelSpec


@runtime_checkable
class PrunerProtocol(Protocol):
    """What every pruner offers (in-process, Triton text model, HTTP): prune, aprune, family,
    max_length, limits."""

    limits: Limits  # what one call may hold (engine.pipeline.inputs)

    @property
    def family(self) -> Family:
        """The model's family with the defaults it runs with."""

    @property
    def max_length(self) -> int:
        """The model's window in tokens."""

    def prune(
        self,
        question: str,
        passages: str | Sequence[str],
        options: CallOptions | None = None,
        *,
        sentences: Any = None,
        **changes: Any,
    ) -> list[PruneResult]:
        """One PruneResult per passage, in input order (or best first with reorder/top_k)."""
        ...

    async def aprune(
        self, question: str, passages: str | Sequence[str], options: CallOptions | None = None, **kwargs: Any
    ) -> list[PruneResult]:
        """`prune` for asyncio code; the event loop stays free."""
        ...

    def prune_many(self, queries: Sequence[dict[str, Any]]) -> list[list[PruneResult] | Exception]:
        """Several calls (`prune` keyword arguments each) at once; per query its results or
        the InputError its own input raised, in order."""
        ...

    def describe(self) -> str:
        """What runs the model, in words."""

    def close(self) -> None:
        """Release connections and sessions."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> None: ...


@runtime_checkable
class CompressorProtocol(Protocol):
    """What every LLMLingua-2 compressor offers (in-process `engine.compressor.Compressor`, a
    Triton text model's `TritonCompressor`, an HTTP API's `HttpCompressor`): compress, limits,
    tokenizer_kind, describe, close. Code above the compressor (the HTTP API, the MCP server, the
    adapters) is written against it."""

    limits: Limits  # what one call may hold (contexts, characters)

    @property
    def tokenizer_kind(self) -> str:
        """The word rule: wordpiece (mBERT) or sentencepiece (XLM-R)."""

    def compress(self, context: str | list[str], **arguments: Any) -> CompressResult:
        """compress_prompt(use_llmlingua2=True) on `context`, with its argument names."""
        ...

    def describe(self) -> str:
        """What runs the model, in words."""

    def close(self) -> None:
        """Release connections and sessions."""


class FromSpec:
    """`family` and `max_length` of a pruner that holds its model's ModelSpec as `spec`
    (the in-process Pruner, the Triton text model's)."""

    spec: ModelSpec

    @property
    def family(self) -> Family:
        """The model's family with the defaults it runs with."""
        return self.spec.family

    @property
    def max_length(self) -> int:
        """The model's window in tokens."""
        return self.spec.max_length
