"""The Pruner API against a Triton *text* model (`<name>_text`): no tokenizer, no
sentence splitter, no model on the client; text goes to the server, results come back.

    pruner = Pruner.connect("localhost:8001", model="default_text")
    results = pruner.prune(question, passages)

`Pruner.connect` returns this class when the model takes `question` and `passages`
(see `engine.triton.wire` for the contract). A call larger than the text model's per-request
limits (passages, characters) is sent as several requests, concurrently, and the
results are put back in input order; the passage gate (engine.pipeline.decide.gate_passages),
`reorder` and `top_k` are applied here again, over the whole call, so a cut call answers
exactly as a whole one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from engine.pipeline import budget
from engine.pipeline.decide import call_rules
from engine.pipeline.results import PruneResult
from engine.errors import BackendError, InputError, PruneError
from engine.pipeline.inputs import CallOptions, Limits, check_call, default_limits
from engine.protocol import FromSpec
from engine.pipeline.spec import Manifest, ModelSpec
from engine.triton.client import Transport
from engine.triton.wire import (
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_PASSAGES,
    TEXT_INPUTS,
    OPTIONAL_OUTPUTS,
    input_error,
    options_to_tensors,
    requested_outputs,
    tensors_to_results,
)


class TritonTextPruner(FromSpec):
    """The Pruner API on a Triton text model: the server tokenizes, runs and decides; this client sends text."""

    def __init__(self, transport: Transport, limits: Limits | None = None):
        self.transport = client = transport
        self.spec: ModelSpec = Manifest.from_dict(client.manifest(), where=client.model).spec(
            name=client.model
        )
        params = client.parameters()
        #: what one request to the text model may hold; a call is cut into such requests
        self.request_limits = Limits(
            max_passages=int(params.get("max_passages", DEFAULT_MAX_PASSAGES)),
            max_chars=int(params.get("max_chars", DEFAULT_MAX_CHARS)),
        )
        #: what one call may hold: as in-process (engine.pipeline.inputs)
        self.limits = limits or default_limits()
        self._many: ThreadPoolExecutor | None = None
        #: the outputs asked for: every one but an optional output the model lacks (an older repository's)
        self._outputs = requested_outputs(getattr(client, "metadata_outputs", None))

    def describe(self) -> str:
        """The server and model, in words."""
        return self.transport.describe() + " (text model)"

    # ------------------------------------------------------------------ requests
    def _chunks(self, question: str, passages: list[str]) -> list[tuple[int, int]]:
        """[start, end) ranges of passages, each within the text model's limits."""
        chunks, start, chars = [], 0, len(question)
        for i, p in enumerate(passages):
            if len(question) + len(p) > self.request_limits.max_chars:
                raise InputError(
                    f"passage {i} has {len(p)} characters; with the question, the text model "
                    f"{self.transport.model!r} accepts at most {self.request_limits.max_chars} "
                    "per request"
                )
            full = (
                i - start >= self.request_limits.max_passages
                or chars + len(p) > self.request_limits.max_chars
            )
            if i > start and full:
                chunks.append((start, i))
                start, chars = i, len(question)
            chars += len(p)
        chunks.append((start, len(passages)))
        return chunks

    def _inputs(self, question: str, passages: list[str], options: CallOptions):
        tc = self.transport.tc
        values = {
            "question": np.array([question.encode("utf-8")], dtype=np.object_),
            "passages": np.array([p.encode("utf-8") for p in passages], dtype=np.object_),
            **options_to_tensors(options),
        }
        inputs = []
        for name, arr in values.items():
            inp = tc.InferInput(name, list(arr.shape), TEXT_INPUTS[name][0])
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        return inputs, [tc.InferRequestedOutput(n) for n in self._outputs]

    def _send_all(
        self, question: str, parts: list[list[str]], options: CallOptions, deadline: float
    ) -> list[dict[str, np.ndarray]]:
        """One request per part (a range of the call's passages), sent concurrently."""
        c = self.transport
        try:
            raw = c.infer_all(c.model, [self._inputs(question, p, options) for p in parts], deadline)
        except Exception as exc:
            bad_input = input_error(str(exc))  # the server refused this input: as in-process
            if bad_input is not None:
                raise bad_input from None
            raise BackendError(f"Triton text model {c.model!r} on {c.url} failed: {exc}") from exc
        outs = []
        for res in raw:
            out = {n: res.as_numpy(n) for n in self._outputs}
            missing = [n for n, v in out.items() if v is None and n not in OPTIONAL_OUTPUTS]
            if missing:
                raise BackendError(f"Triton text model {c.model!r} returned no {missing}")
            outs.append(out)
        return outs

    # ------------------------------------------------------------------ API
    def prune(
        self,
        question: str,
        passages: str | Sequence[str],
        options: CallOptions | None = None,
        *,
        sentences: Any = None,
        **changes: Any,
    ) -> list[PruneResult]:
        """`Pruner.prune` on the server (see there). `sentences=` needs the client-side
        splitter: connect to the core model for it."""
        question, passages = check_call(question, passages, self.limits)
        options = CallOptions.of(options, **changes)
        if sentences is not None:
            raise InputError(
                "sentences= is not supported through a text model (the server splits); "
                "connect to the core model to pass your own sentences"
            )
        if not passages:
            return []
        rules = self.spec.family.rules.resolve(options)
        if rules.budget_tokens is not None:
            budget.counter(rules.budget_tokenizer)  # the model's tokenizer is the server's: say so now
        # the server orders nothing: order, top_k and the budget apply over the whole call, here
        sent = replace(options, reorder=False, top_k=None, budget_tokens=None, budget_tokenizer=None)
        chunks = self._chunks(question, passages)
        deadline = self.transport.deadline()  # one deadline for the whole call
        outs = self._send_all(question, [passages[s:e] for s, e in chunks], sent, deadline)
        results: list[PruneResult] = []
        for (s, e), out in zip(chunks, outs):
            results += tensors_to_results(
                passages[s:e],
                out,
                rules.threshold,
                offset=s,
                windows=rules.windows,
                lexical_weight=rules.lexical_weight,
                splitter=rules.splitter,
            )
        if len(results) != len(passages):
            raise BackendError(f"the text model returned {len(results)} results for {len(passages)} passages")
        return call_rules(results, rules)

    def prune_many(self, queries: Sequence[dict[str, Any]]) -> list[list[PruneResult] | Exception]:
        """Several calls at once (`Pruner.prune_many`): each query is sent as its own call,
        concurrently over gRPC (sequentially over HTTP, whose client belongs to one thread);
        each gets its results, or the InputError its own input raised, in order."""

        def one(q: dict[str, Any]) -> list[PruneResult] | Exception:
            try:
                q = dict(q)
                return self.prune(q.pop("question"), q.pop("passages"), **q)
            except PruneError as exc:
                return exc
            except (TypeError, KeyError) as exc:
                return InputError(f"bad query: {exc!r}")

        if self.transport.protocol != "grpc" or len(queries) < 2:
            return [one(q) for q in queries]
        if self._many is None:
            self._many = ThreadPoolExecutor(
                max_workers=self.transport.concurrency, thread_name_prefix="prune-many"
            )
        return list(self._many.map(one, queries))

    async def aprune(
        self, question: str, passages: str | Sequence[str], options: CallOptions | None = None, **kwargs: Any
    ) -> list[PruneResult]:
        """`prune` for asyncio code (runs in a worker thread)."""
        import asyncio

        return await asyncio.to_thread(self.prune, question, passages, options, **kwargs)

    def close(self) -> None:
        """Close the connection."""
        if self._many is not None:
            self._many.shutdown(wait=False)
        self.transport.close()

    def __enter__(self) -> "TritonTextPruner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
