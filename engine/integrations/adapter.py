"""What the framework adapters share: which pruner, which options, one call per query,
and the metadata every framework's documents carry.

Rules (docs/integrations.md):
- every document of one query goes to the pruner in one call (the engine batches);
- a document's content becomes its pruned text; its metadata gets `pruning` (the key is
  `metadata_key`): `original_text`, `reranking_score`, `compression_rate`, `threshold`,
  `highlighted` (kept sentences tagged with `pre`/`post`) and `sentences` (each one's text,
  start, end, probability and kept flag), so nothing of the original is lost;
- a document with no text to prune (empty or whitespace, or content that is not a str)
  is passed through unchanged with `pruning: {"skipped": why}`: never dropped, never
  sent; with reorder or top_k it follows the ranked ones and does not count toward k;
- a document pruned to nothing (no sentence kept) is dropped unless `keep_empty`;
- reorder or top_k (`top_n` in LangChain and LlamaIndex, as their rerankers say) rank by the
  reranking score, best first, as `Pruner.prune` does;
- the score goes where the framework's own rerankers put it: LangChain's
  `metadata["relevance_score"]`, LlamaIndex's node score, Haystack's `Document.score`; it
  is the reranking score in [0, 1], as the HTTP API's `relevance_score` (`relevance`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.pipeline.results import PruneResult
from engine.errors import InputError
from engine.pipeline.inputs import OPTION_NAMES, CallOptions
from engine.pipeline.option_schema import option_fields


#: an adapter's own fields, beside the call's options (engine.pipeline.inputs.CallOptions): default, meaning
ADAPTER_FIELD_HELP: dict[str, tuple[Any, str]] = {
    "keep_empty": (False, "keep a document pruned to nothing (otherwise it is dropped)"),
    "pre": ("<em>", "the tag before each kept sentence in the metadata's highlighted text"),
    "post": ("</em>", "the tag after each kept sentence in the metadata's highlighted text"),
    "metadata_key": ("pruning", "the metadata key the pruning details go under"),
}
ADAPTER_FIELDS = tuple(ADAPTER_FIELD_HELP)

#: the option names LangChain's and LlamaIndex's rerankers use (CohereRerank,
#: SentenceTransformerRerank, ...): `top_n`; Haystack's rankers say `top_k`
TOP_N = {"top_k": "top_n"}


@dataclass(frozen=True)
class PruneOptions:
    """What an adapter holds: the call's options (every CallOptions option, by its name)
    and its own fields."""

    call: CallOptions = field(default_factory=CallOptions)
    keep_empty: bool = False
    pre: str = "<em>"
    post: str = "</em>"
    metadata_key: str = "pruning"

    @classmethod
    def of(cls, **values: Any) -> "PruneOptions":
        """From option and adapter-field names (None for an option: the model's default)."""
        own = {k: values.pop(k) for k in ADAPTER_FIELDS if k in values}
        try:
            call = CallOptions.of(**values)
        except InputError as exc:
            if "unknown option" not in str(exc):
                raise
            raise InputError(f"{exc}; and the adapter's own: {', '.join(ADAPTER_FIELDS)}") from None
        return cls(call, **own)

    def with_top_k(self, top_k: int | None) -> "PruneOptions":
        """These options with `top_k` (None: unchanged)."""
        return self if top_k is None else replace(self, call=replace(self.call, top_k=top_k))

    def given(self) -> dict[str, Any]:
        """The options and adapter fields set to something other than their defaults."""
        own = {
            k: getattr(self, k)
            for k, (default, _) in ADAPTER_FIELD_HELP.items()
            if getattr(self, k) != default
        }
        return {**self.call.given(), **own}


def adapter_fields(rename: dict[str, str] | None = None) -> dict[str, tuple[Any, Any]]:
    """pydantic field definitions of every CallOptions option (named as `rename` says) and
    the adapter's own fields: what LangChain's and LlamaIndex's adapters are made of."""
    from pydantic import Field

    own = {
        k: (type(default), Field(default, description=what))
        for k, (default, what) in ADAPTER_FIELD_HELP.items()
    }
    return {**option_fields(rename), **own}


def options_of(adapter: Any, rename: dict[str, str] | None = None) -> PruneOptions:
    """The PruneOptions an adapter holds as attributes (its framework's own fields: a
    pydantic model for LangChain and LlamaIndex), named as `rename` says."""
    names = {(rename or {}).get(n, n): n for n in (*OPTION_NAMES, *ADAPTER_FIELDS)}
    return PruneOptions.of(
        **{option: getattr(adapter, attr) for attr, option in names.items() if hasattr(adapter, attr)}
    )


@contextlib.contextmanager
def framework(module: str, package: str, extra: str) -> Iterator[None]:
    """The imports of adapter `module`'s framework: a missing one is an ImportError that
    says which extra installs it."""
    try:
        yield
    except ImportError as exc:  # pragma: no cover - the message is the point
        raise ImportError(f"{module} needs {package}: pip install 'prune-engine[{extra}]'") from exc


def relevance(engine: Any, result: PruneResult) -> float:
    """The score a framework's reranker reports: the passage's reranking score in [0, 1],
    as the HTTP API's `relevance_score` (engine.pipeline.families.Family.rank_score)."""
    return engine.family.rank_score(result.reranking_score)


def check_pruner(pruner: Any) -> None:
    """TypeError unless `pruner` is something `resolve_pruner` takes."""
    if not isinstance(pruner, (str, Path)) and not callable(getattr(pruner, "prune", None)):
        raise TypeError(
            f"pruner must be a Pruner, a pruner's URL or an exported folder, got {type(pruner).__name__}"
        )


def resolve_pruner(pruner: Any) -> Any:
    """A pruner object (in-process `Pruner`, a Triton text model from `Pruner.connect`, an
    `HttpPruner`) as it is; an `http(s)://` URL: the HTTP API's `/v1/prune`; a path or
    'default': `Pruner.load` of that exported folder."""
    if isinstance(pruner, (str, Path)):
        text = str(pruner)
        if text.startswith(("http://", "https://")):
            from engine.remote.http_client import HttpPruner

            return HttpPruner(text)
        from engine.pruner import Pruner

        if text == "default":
            from engine.models.default_model import ensure_default_model

            return Pruner.load(ensure_default_model())
        return Pruner.load(text)
    check_pruner(pruner)
    return pruner


def skip_reason(content: Any) -> str | None:
    """Why a document's content is not pruned (passed through), or None."""
    if not isinstance(content, str):
        return f"content is {type(content).__name__}, not text"
    if not content.strip():
        return "empty"
    return None


def pruning_metadata(r: PruneResult, opts: PruneOptions) -> dict[str, Any]:
    """What a document's metadata gets under `metadata_key` (the module docstring)."""
    return {
        "original_text": r.context,
        "reranking_score": r.reranking_score,
        "compression_rate": r.compression_rate,
        "threshold": r.threshold,
        "highlighted": r.highlight(opts.pre, opts.post),
        "sentences": [
            {"text": s.text, "start": s.start, "end": s.end, "probability": s.probability, "kept": s.kept}
            for s in r.sentences
        ],
    }


@dataclass
class Outcome:
    """One document's fate: its input position, and the result (None: passed through)."""

    index: int
    result: PruneResult | None
    skipped: str | None = None

    def note(self, opts: PruneOptions) -> dict[str, Any]:
        """What the document's metadata gets under `metadata_key`: its pruning, or why it was
        passed through."""
        return {"skipped": self.skipped} if self.result is None else pruning_metadata(self.result, opts)


def _plan(contents: list[Any]) -> tuple[list[int], list[str], list[Outcome]]:
    run, texts, passed = [], [], []
    for i, c in enumerate(contents):
        why = skip_reason(c)
        if why:
            passed.append(Outcome(i, None, why))
        else:
            run.append(i)
            texts.append(c)
    return run, texts, passed


def _finish(
    run: list[int], results: list[PruneResult], passed: list[Outcome], opts: PruneOptions
) -> list[Outcome]:
    ranked = bool(opts.call.reorder or opts.call.top_k is not None)
    done = [Outcome(run[r.index], r) for r in results]  # r.index: position in the call; ranked already
    if not opts.keep_empty:
        done = [o for o in done if o.result and o.result.pruned_context.strip()]
    if ranked:
        return done + passed
    return sorted(done + passed, key=lambda o: o.index)


def prune_contents(pruner: Any, query: str, contents: list[Any], opts: PruneOptions) -> list[Outcome]:
    """The documents' fates for one query, in the order the framework gets them back."""
    run, texts, passed = _plan(contents)
    results = pruner.prune(query, texts, opts.call) if texts else []
    return _finish(run, results, passed, opts)


async def aprune_contents(pruner: Any, query: str, contents: list[Any], opts: PruneOptions) -> list[Outcome]:
    """`prune_contents` for asyncio code."""
    run, texts, passed = _plan(contents)
    results = await pruner.aprune(query, texts, opts.call) if texts else []
    return _finish(run, results, passed, opts)


class Adapter:
    """What each adapter's class adds to its framework's: the documents of one query pruned
    in one call, each then remade by the adapter's `_remade` from its Outcome, in the order
    the framework gets them back. The adapter holds the pruner as `_engine`."""

    def _contents(self, documents: Sequence[Any]) -> list[Any]:
        """Each document's content (what is not text is passed through)."""
        raise NotImplementedError

    def _remade(self, document: Any, outcome: Outcome, opts: PruneOptions) -> Any:
        """The document as the framework gets it back, from its outcome."""
        raise NotImplementedError

    def _pruned(self, query: str, documents: Sequence[Any], opts: PruneOptions) -> list[Any]:
        """The documents pruned for `query`, remade."""
        outcomes = prune_contents(self._engine, query, self._contents(documents), opts)
        return [self._remade(documents[o.index], o, opts) for o in outcomes]

    async def _apruned(self, query: str, documents: Sequence[Any], opts: PruneOptions) -> list[Any]:
        """`_pruned` for asyncio code."""
        outcomes = await aprune_contents(self._engine, query, self._contents(documents), opts)
        return [self._remade(documents[o.index], o, opts) for o in outcomes]
