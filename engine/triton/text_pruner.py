"""The Pruner API against a Triton *text* model (`<name>_text`): no tokenizer, no
sentence splitter, no model on the client; text goes to the server, results come back.

    pruner = Pruner.connect("localhost:8001", model="default_text")
    results = pruner.prune(question, passages)

`Pruner.connect` returns this class when the model takes `question` and `passages`
(see `engine.triton.wire` for the contract). A call larger than the text model's per-request
limits (passages, characters) is sent as several requests, concurrently, and the
results are put back in input order; `reorder` and `top_k` are applied here, over the
whole call.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.triton.client import Transport
from engine.decide import TITLE_RULES, PruneResult, check_threshold, check_top_k, order_results
from engine.errors import BackendError, InputError
from engine.spec import ModelSpec, spec_from_manifest
from engine.text import check_unicode
from engine.families import WINDOWS
from engine.triton.wire import TEXT_INPUTS, TEXT_OUTPUTS, TextLimits, tensors_to_results


class TritonTextPruner:
    def __init__(self, transport: Transport):
        self.transport = client = transport
        self.spec: ModelSpec = spec_from_manifest(client.manifest(), name=client.model)
        params = client.parameters()
        self.limits = TextLimits(max_passages=int(params.get("max_passages", 1000)),
                                 max_chars=int(params.get("max_chars", 2_000_000)))

    @property
    def family(self):
        return self.spec.family

    def describe(self) -> str:
        return self.transport.describe() + " (text model)"

    # ------------------------------------------------------------------ requests
    def _chunks(self, question: str, passages: list[str]) -> list[tuple[int, int]]:
        """[start, end) ranges of passages, each within the text model's limits."""
        chunks, start, chars = [], 0, len(question)
        for i, p in enumerate(passages):
            if len(question) + len(p) > self.limits.max_chars:
                raise InputError(f"passage {i} has {len(p)} characters; with the question, the text model "
                                 f"{self.transport.model!r} accepts at most {self.limits.max_chars} per request")
            if i > start and (i - start >= self.limits.max_passages or chars + len(p) > self.limits.max_chars):
                chunks.append((start, i))
                start, chars = i, len(question)
            chars += len(p)
        chunks.append((start, len(passages)))
        return chunks

    def _inputs(self, question: str, passages: list[str], options: dict[str, Any]):
        tc = self.transport.tc
        values = {"question": np.array([question.encode("utf-8")], dtype=np.object_),
                  "passages": np.array([p.encode("utf-8") for p in passages], dtype=np.object_)}
        if options.get("threshold") is not None:
            values["threshold"] = np.array([options["threshold"]], dtype=np.float32)
        for name in ("title", "windows"):
            if options.get(name) is not None:
                values[name] = np.array([options[name].encode("utf-8")], dtype=np.object_)
        if options.get("alpha", ...) is not ...:
            a = options["alpha"]
            values["alpha"] = np.array([-1.0 if a is None else a], dtype=np.float32)
        inputs = []
        for name, arr in values.items():
            inp = tc.InferInput(name, list(arr.shape), TEXT_INPUTS[name][0])
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        return inputs, [tc.InferRequestedOutput(n) for n in TEXT_OUTPUTS]

    def _send_all(self, question: str, parts: list[list[str]], options: dict[str, Any],
                  deadline: float) -> list[dict[str, np.ndarray]]:
        """One request per part (a range of the call's passages), sent concurrently."""
        c = self.transport
        try:
            raw = c.infer_all(c.model, [self._inputs(question, p, options) for p in parts], deadline)
        except Exception as exc:
            raise BackendError(f"Triton text model {c.model!r} on {c.url} failed: {exc}") from exc
        outs = []
        for res in raw:
            out = {n: res.as_numpy(n) for n in TEXT_OUTPUTS}
            missing = [n for n, v in out.items() if v is None]
            if missing:
                raise BackendError(f"Triton text model {c.model!r} returned no {missing}")
            outs.append(out)
        return outs

    # ------------------------------------------------------------------ API
    def prune(self, question: str, passages: str | Sequence[str], *, threshold: float | None = None,
              title: str | None = None, alpha: float | None = ..., reorder: bool = False,  # type: ignore[assignment]
              top_k: int | None = None, sentences: Any = None, windows: str | None = None) -> list[PruneResult]:
        """`Pruner.prune` on the server (see there). `sentences=` needs the client-side
        splitter: connect to the core model for it."""
        if windows is not None and windows not in WINDOWS:
            raise InputError(f"windows must be one of {WINDOWS}, got {windows!r}")
        if sentences is not None:
            raise InputError("sentences= is not supported through a text model (the server splits); "
                             "connect to the core model to pass your own sentences")
        if not isinstance(question, str):
            raise InputError(f"question must be a str, got {type(question).__name__}")
        if not question.strip():
            raise InputError("question is empty")
        if isinstance(passages, str):
            passages = [passages]
        if not isinstance(passages, Sequence):
            raise InputError(f"passages must be a list of str, got {type(passages).__name__}")
        passages = list(passages)
        check_unicode(question, "the question")
        for i, p in enumerate(passages):
            if not isinstance(p, str):
                raise InputError(f"passage {i} must be a str, got {type(p).__name__}")
            check_unicode(p, f"passage {i}")
        if title is not None and title not in TITLE_RULES:
            raise InputError(f"title must be one of {TITLE_RULES}, got {title!r}")
        threshold = None if threshold is None else check_threshold(threshold)
        if alpha is not ... and alpha is not None:
            alpha = check_threshold(alpha, "alpha")
        check_top_k(top_k)
        if not passages:
            return []
        options = {"threshold": threshold, "title": title, "alpha": alpha, "windows": windows}
        used = self.spec.family.threshold if threshold is None else threshold
        ran = self.spec.family.windows if windows is None else windows
        chunks = self._chunks(question, passages)
        deadline = self.transport.deadline()      # one deadline for the whole call
        outs = self._send_all(question, [passages[s:e] for s, e in chunks], options, deadline)
        results: list[PruneResult] = []
        for (s, e), out in zip(chunks, outs):
            results += tensors_to_results(passages[s:e], out, used, offset=s, windows=ran)
        if len(results) != len(passages):
            raise BackendError(f"the text model returned {len(results)} results for {len(passages)} passages")
        return order_results(results, reorder, top_k)

    async def aprune(self, question: str, passages: str | Sequence[str], **kwargs) -> list[PruneResult]:
        import asyncio
        return await asyncio.to_thread(self.prune, question, passages, **kwargs)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> "TritonTextPruner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
