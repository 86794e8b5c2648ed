"""Thin clients of the HTTP API: `/v1/prune` (the Pruner API on a URL) and `/v1/compress` (the
Compressor's `compress` on a URL).

    from engine.remote.http_client import HttpCompressor, HttpPruner
    with HttpPruner("http://127.0.0.1:8080", api_key=None) as pruner:
        results = pruner.prune(question, passages)      # list[PruneResult], as in-process
    result = HttpCompressor("http://127.0.0.1:8080").compress(context, rate=0.33)  # a CompressResult

Only the standard library: a framework adapter (engine.integrations) can point at a
server without installing FastAPI. The input is checked here with the same validator as
in-process (engine.pipeline.inputs), against the server's limits (from `/info`), so a bad call
gets the same InputError before it is sent; an error the server answers is raised as
InputError (4xx) or BackendError (5xx, unreachable), with the server's message. A compressor's
options are checked here as in-process too (engine.pipeline.lingua_decide.CompressOptions)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from engine.errors import BackendError, InputError
from engine.pipeline.budget import Budget
from engine.pipeline.results import PruneResult, Sentence
from engine.pipeline.families import Family, get_family
from engine.pipeline.inputs import CallOptions, Limits, Rules, check_call
from engine.pipeline.lingua_decide import CompressOptions, CompressResult


def result_from_dict(d: dict[str, Any]) -> PruneResult:
    """A PruneResult from its `to_dict()` form (what `/v1/prune` and `prune run --json` give)."""
    return PruneResult(
        index=d["index"],
        context=d["context"],
        pruned_context=d["pruned_context"],
        reranking_score=d["reranking_score"],
        sentences=[Sentence(**s) for s in d["sentences"]],
        compression_rate=d["compression_rate"],
        threshold=d["threshold"],
        blocks=d.get("blocks", 1),
        windows=d.get("windows", "sentences"),
        splitter=d.get("splitter", "engine"),
        lexical_weight=d.get("lexical_weight", 0.0),
        budget=Budget(**d["budget"]) if d.get("budget") else None,
        unknown_share=d.get("unknown_share"),
    )


class _HttpClient:
    """One server's URL, its API key, and a JSON request to it (errors as the engine's)."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = 60.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._info: dict[str, Any] | None = None

    def _request(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, headers=self._headers, method="GET" if body is None else "POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.load(r)
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", "")
            except (ValueError, AttributeError):
                message = ""
            text = f"{self.url}{path}: {exc.code} {message or exc.reason}"
            raise (InputError if exc.code in (400, 413, 422) else BackendError)(text) from None
        except (urllib.error.URLError, OSError) as exc:
            raise BackendError(f"{self.url}{path}: {getattr(exc, 'reason', exc)}") from None

    @property
    def info(self) -> dict[str, Any]:
        """The server's `/info` (model, family, limits, version), asked once."""
        if self._info is None:
            self._info = self._request("/info")
        return self._info

    @property
    def limits(self) -> Limits:
        """The server's input limits (from /info)."""
        return Limits(**self.info["limits"])

    def describe(self) -> str:
        """The server's URL and model, in words."""
        return f"HTTP API {self.url} ({self.info.get('engine', '?')})"

    def close(self) -> None:
        """Nothing to release (one connection per request)."""
        pass

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class HttpPruner(_HttpClient):
    """`prune`, `aprune`, `prune_many` on a server's `/v1/prune` (`prune api`, `prune serve`)."""

    @property
    def family(self) -> Family:
        """The server's family with the defaults its model runs with (from `/info`)."""
        fam = get_family(self.info["family"])
        rules = self.info.get("rules")  # a server before `rules` was sent: the family's defaults
        return replace(fam, rules=Rules.from_dict(rules)) if rules else fam

    @property
    def max_length(self) -> int:
        """The server's model window in tokens (from `/info`)."""
        return int(self.info["max_length"])

    def prune(
        self,
        question: str,
        passages: str | Sequence[str],
        options: CallOptions | None = None,
        *,
        sentences: Any = None,
        **changes: Any,
    ) -> list[PruneResult]:
        """`Pruner.prune` through the server's `/v1/prune` (one request: one call)."""
        if sentences is not None:
            raise InputError(
                "sentences: given sentence lists are an in-process option; /v1/prune splits itself"
            )
        question, texts = check_call(question, passages, self.limits)
        options = CallOptions.of(options, **changes)
        body: dict[str, Any] = {"question": question, "passages": texts, **options.given()}
        return [result_from_dict(d) for d in self._request("/v1/prune", body)["results"]]

    async def aprune(
        self, question: str, passages: str | Sequence[str], options: CallOptions | None = None, **kwargs: Any
    ) -> list[PruneResult]:
        """`prune` for asyncio code (runs in a worker thread)."""
        return await asyncio.to_thread(self.prune, question, passages, options, **kwargs)

    def prune_many(self, queries: Sequence[dict[str, Any]]) -> list[list[PruneResult] | Exception]:
        """Several calls, each {question, passages, options...}: results or the exception, per call."""
        out: list[list[PruneResult] | Exception] = []
        for q in queries:
            try:
                out.append(self.prune(**q))
            except InputError as exc:
                out.append(exc)
        return out


class HttpCompressor(_HttpClient):
    """`compress` and `acompress` on a server's `/v1/compress` (`prune api --model` on an LLMLingua-2
    checkpoint or export): engine.compressor.Compressor's on a URL."""

    @property
    def tokenizer_kind(self) -> str:
        """The server's word rule, wordpiece or sentencepiece (from /info)."""
        return str(self.info["tokenizer"])

    def compress(self, context: str | list[str], **arguments: Any) -> CompressResult:
        """`Compressor.compress` through the server's `/v1/compress` (one request: one call)."""
        CompressOptions.of(**arguments)  # the same InputError as in-process, before anything is sent
        d = self._request("/v1/compress", {"context": context, **arguments})
        d["kept_spans"] = [[tuple(s) for s in spans] for spans in d["kept_spans"]]
        return CompressResult(**d)

    async def acompress(self, context: str | list[str], **arguments: Any) -> CompressResult:
        """`compress` for asyncio code (runs in a worker thread)."""
        return await asyncio.to_thread(self.compress, context, **arguments)
