"""`Pruner`: the user-facing API around an accelerated core.

    pruner = Pruner.load("build/provence")            # ONNX Runtime in-process
    results = pruner.prune(question, [p1, p2, ...], threshold=0.1)

Pipeline (engine.pipeline's modules): split sentences (text) -> tokenize once, build blocks, sort
and pack them by a token budget (encode) -> backend.infer, the call's cancellation checked between
batches (engine.cancellation) -> merge blocks and decide (decide).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backends.base import Backend
from engine.cancellation import infer_batches
from engine.errors import BackendError, InputError, PruneError
from engine.pipeline import text as textmod
from engine.pipeline.decide import Scored, decide_passages, merge_blocks, window_decisions
from engine.pipeline.results import PruneResult
from engine.pipeline.encode import BatchingConfig, Block, Encoder, ModelBatch, collate, plan, unknown_shares
from engine.pipeline.inputs import (
    CallOptions,
    Limits,
    Rules,
    check_call,
    check_sentences,
    default_limits,
    token_windows,
)
from engine.pipeline.spec import ModelSpec
from engine.pipeline.token_compress import check_compressor
from engine.protocol import FromSpec, PrunerProtocol

if TYPE_CHECKING:
    from engine.compressor import Compressor
    from engine.models.loading import LoadOptions


@dataclass
class Call:
    """One prepared `prune` call: the checked inputs, the rules it runs with (its options
    resolved once, engine.pipeline.inputs.Rules) and how its passages are cut, the sentence spans of every
    passage, its blocks and the padded batches the core must run."""

    passages: list[str]
    spans: list[list[tuple[int, int]]]
    blocks: list[Block]
    batches: list[ModelBatch]
    rules: Rules
    question: str = ""
    token_windows: bool = False  # decided per token window (the family's reference windows)
    fragment: int | None = None  # OpenProvence's fragment tokens under its reference windows
    splitter: str = "engine"  # who cut the passages: the rules' splitter, or "caller" (sentences=)
    unknown: list[float] | None = None  # each passage's unknown_share (engine.pipeline.encode)


class Pruner(FromSpec):
    """Context pruning in-process: tokenization, batching, a core (ONNX Runtime, PyTorch,
    Triton) and the family's decisions."""

    def __init__(
        self,
        backend: Backend,
        tokenizer: Any,
        spec: ModelSpec,
        batching: BatchingConfig | None = None,
        min_context_tokens: int = 64,
        limits: Limits | None = None,
        compressor: Compressor | None = None,
    ):
        self.backend = backend
        #: the token compressor beside the pruner (engine.compressor.Compressor, LLMLingua-2) that a
        #: call's compress_rate / compress_target_token runs on what it keeps; None: none
        self.compressor = compressor
        self.spec = spec
        self.limits = limits or default_limits()
        self.encoder = Encoder(tokenizer, spec, min_context_tokens)
        self.batching = backend.batching(batching or BatchingConfig())

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(
        cls,
        path: str | Path,
        backend: "str | LoadOptions | None" = None,
        options: "LoadOptions | None" = None,
        *,
        log: Any = None,
        compressor: Compressor | None = None,
        **shortcuts: Any,
    ) -> "Pruner":
        """Load an exported model folder (ONNX Runtime, or OpenVINO), or a checkpoint
        (backend="torch"); `"default"` is the default model (all-MiniLM-L6-v2: its export,
        made on first use, or its checkpoint for torch). With no backend, an export runs on
        the runtime its manifest prefers (`prune export --precision auto`'s pick) where this
        machine has it, else on ONNX Runtime, saying why (to `log`, else as a warning).

        How it is opened is `options` (also taken as the second argument), an
        `engine.models.loading.LoadOptions` (backend, precision, threads, device, providers,
        tensorrt, arena, graph, shape_cache, batching; for torch family, module_options,
        dtype, attn: each field says what it does). Its field names are keyword shortcuts
        here (`threads=2`, `device="cuda"`, `tensorrt=True` or a cache folder), over
        `options` or, without it, over the `PRUNE_*` variables in force
        (`LoadOptions.from_env`). `compressor`: a token compressor beside the pruner (an
        engine.Compressor: `Compressor.load(DIR)` of an LLMLingua-2 checkpoint or export) that a
        call's `compress_rate` / `compress_target_token` runs on what it keeps."""
        from engine.models.loading import LoadOptions, ModelKind, open_model

        options = LoadOptions.given(backend, options, **shortcuts)
        core, tokenizer, spec = open_model(path, options, log, ModelKind.PRUNER)
        pruner = cls(core, tokenizer, spec, options.batching)
        if compressor is not None:
            if not callable(getattr(compressor, "kept_words", None)):
                raise InputError(
                    f"compressor must be an engine.Compressor (Compressor.load(DIR)), got {type(compressor).__name__}"
                )
            pruner.compressor = compressor
        return pruner

    @classmethod
    def connect(cls, url: str | Sequence[str], model: str, **kwargs: Any) -> PrunerProtocol:
        """The same API on a model of a Triton server: `engine.remote.connect.connect` (see
        there for the keywords: protocol, tokenizer, batching, timeout, retries, backoff,
        concurrency, ready_timeout, replica_options). A text model gives a
        `TritonTextPruner`, a core model a `Pruner` that tokenizes here."""
        from engine.remote.connect import connect  # the public doors' import upward (test_layout)

        return connect(url, model, **kwargs)

    def describe(self) -> str:
        """What runs the model, in words: the runtime, and the export's precision (and
        whether `prune export --precision auto` picked it)."""
        picked = " (auto's pick)" if self.spec.auto_pick else ""
        return f"{self.backend.describe()}, {self.spec.precision} export{picked}"

    async def aprune(
        self, question: str, passages: str | Sequence[str], options: CallOptions | None = None, **kwargs: Any
    ) -> list[PruneResult]:
        """`prune` for asyncio code: runs in a worker thread (tokenization is CPU work and
        remote calls block), so the event loop stays free."""
        import asyncio

        return await asyncio.to_thread(self.prune, question, passages, options, **kwargs)

    # ------------------------------------------------------------------ prune
    def prune(
        self,
        question: str,
        passages: str | Sequence[str],
        options: CallOptions | None = None,
        *,
        sentences: Sequence[Sequence[str | tuple[int, int]]] | None = None,
        **changes: Any,
    ) -> list[PruneResult]:
        """Prune each passage for `question`; one PruneResult per passage, in input order
        (or by reranking score with `reorder` / `top_k`).

        The call's options are `options` and CallOptions' keywords (engine.pipeline.inputs: each
        says what it means; None is the model's default). `sentences`: per passage, the caller's
        own sentences (strings found in order, or (start, end) spans) instead of the splitter.
        """
        call = self.prepare(question, passages, options, sentences=sentences, **changes)
        return self.finish(call, infer_batches(self.backend, call.batches) if call.batches else [])

    def prepare(
        self,
        question: str,
        passages: str | Sequence[str],
        options: CallOptions | None = None,
        *,
        sentences: Sequence[Sequence[str | tuple[int, int]]] | None = None,
        **changes: Any,
    ) -> "Call":
        """Everything before the model: checks, sentences, blocks and padded batches.

        `prune` is `finish(prepare(...), infer_batches(backend, call.batches))`; a caller that
        runs the core itself (the Triton text model, over BLS) uses the two halves."""
        question, passages = check_call(question, passages, self.limits)
        check_sentences(sentences, len(passages))
        return self._prepare(question, passages, CallOptions.of(options, **changes), sentences)

    def _prepare(
        self,
        question: str,
        passages: list[str],
        options: CallOptions,
        sentences: Sequence[Sequence[str | tuple[int, int]]] | None = None,
        batched: bool = True,
    ) -> "Call":
        """`prepare` of a checked call; without `batched`, no batches (`prune_many` packs the
        blocks of several calls together)."""
        rules = self.spec.family.rules.resolve(options)
        if rules.compresses:
            check_compressor(rules, self.compressor.kept_words if self.compressor is not None else None)
        windowed = token_windows(rules.windows, self.spec.family.window_tokens)
        if rules.lexical_weight and windowed:
            raise InputError(
                "lexical_weight applies to sentence windows; windows='reference' decides per "
                "token window as the family's own code does (pass windows='sentences')"
            )
        if sentences is not None and options.splitter is not None:
            raise InputError(
                "sentences= gives the passages' sentences, splitter chooses who cuts them when they are "
                "not given: pass one of the two"
            )
        fam = self.spec.family
        spans = [
            textmod.spans_from_sentences(p, sentences[i])
            if sentences is not None
            else textmod.split_passage(p, rules.splitter, fam.reference_splitter, fam.name)
            for i, p in enumerate(passages)
        ]

        call = Call(
            passages=passages,
            spans=spans,
            blocks=[],
            batches=[],
            rules=rules,
            question=question,
            token_windows=windowed,
            fragment=self._fragment_tokens(rules.windows),
            splitter="caller" if sentences is not None else rules.splitter,
        )
        if passages:
            call.blocks = self._blocks(call)
            call.batches = self._batches(call.blocks) if batched else []
        return call

    def finish(self, call: "Call", outputs: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[PruneResult]:
        """Everything after the model: merge blocks, decide, build and order results.
        `outputs` holds (rerank_score [B], sentence_probs [B, S]) per batch of the call."""
        return self._finish_blocks(call, block_outputs(call.blocks, call.batches, outputs))

    def _finish_blocks(
        self, call: "Call", per_block: Sequence[tuple[float, np.ndarray]]
    ) -> list[PruneResult]:
        """`finish` from the outputs of each block of the call (rerank score, slot probabilities)."""
        return decide_passages(
            self.spec.family,
            call.rules,
            call.question,
            call.passages,
            call.spans,
            self._scores(call, per_block),
            self.encoder.tokenizer,
            splitter=call.splitter,
            unknown=call.unknown,
            compress=self.compressor.kept_words if self.compressor is not None else None,
        )

    def _scores(self, call: "Call", per_block: Sequence[tuple[float, np.ndarray]]) -> list[Scored]:
        """The call's per-passage model scores (engine.pipeline.decide: blocks merged; with token
        windows, each window's own decisions at the call's threshold and backoff)."""
        fam, rules = self.spec.family, call.rules
        scored = merge_blocks(
            fam, len(call.passages), call.spans, call.blocks, per_block, unweighted=call.fragment is not None
        )
        if call.token_windows:
            scored = window_decisions(fam, scored, call.blocks, per_block, rules.threshold, rules.alpha)
        return scored

    def prune_many(self, queries: Sequence[dict[str, Any]]) -> list[list[PruneResult] | Exception]:
        """Several calls at once: `queries` holds `prune` keyword arguments (`question`,
        `passages`, options). Blocks of every query are packed into batches together
        (fuller batches, one model pass for all); each query gets its results, or the
        InputError that its own input raised, in order."""
        calls: list[Call | Exception] = []
        for q in queries:
            try:
                q = dict(q)
                question, passages = check_call(q.pop("question"), q.pop("passages"), self.limits)
                sentences = q.pop("sentences", None)
                check_sentences(sentences, len(passages))
                calls.append(
                    self._prepare(
                        question,
                        passages,
                        CallOptions.of(q.pop("options", None), **q),
                        sentences,
                        batched=False,
                    )
                )
            except (PruneError, TypeError, KeyError) as exc:
                calls.append(exc if isinstance(exc, PruneError) else InputError(f"bad query: {exc!r}"))
        good = [c for c in calls if isinstance(c, Call)]
        blocks = [b for c in good for b in c.blocks]
        per_block = self._run_blocks(blocks) if blocks else []
        out: list[list[PruneResult] | Exception] = []
        pos = 0
        for c in calls:
            if isinstance(c, Exception):
                out.append(c)
                continue
            out.append(self._finish_blocks(c, per_block[pos : pos + len(c.blocks)]))
            pos += len(c.blocks)
        return out

    # ------------------------------------------------------------------ model
    def _blocks(self, call: "Call") -> list[Block]:
        """All blocks of a call (sentences of every passage tokenized in one batch), cut
        as the call's rules say; each passage's unknown_share measured on the way (`call.unknown`)."""
        q_ids = self.encoder.question_ids(call.question)
        flat = [p[s:e] for p, sp in zip(call.passages, call.spans) for s, e in sp]
        counts: list[tuple[int, int]] = []
        tokenize = self.encoder.tokenize_words if call.token_windows else self.encoder.tokenize
        ids = tokenize(flat, counts)
        call.unknown = unknown_shares(counts, [len(sp) for sp in call.spans])
        blocks: list[Block] = []
        pos = 0
        for i, sp in enumerate(call.spans):
            part = ids[pos : pos + len(sp)]
            blocks.extend(
                self.encoder.windows(q_ids, i, part)
                if call.token_windows
                else self.encoder.blocks(q_ids, i, part, call.fragment)
            )
            pos += len(sp)
        return blocks

    def _fragment_tokens(self, windows: str) -> int | None:
        """OpenProvence's fragment size under its reference windows (None: the engine's way)."""
        div = self.spec.family.fragment_divisor
        return max(16, self.spec.max_length // div) if windows == "reference" and div else None

    def _batches(self, blocks: Sequence[Block]) -> list[ModelBatch]:
        """The padded batches the blocks are run in (lengths bucketed, within the token budget)."""
        lengths = [len(b) for b in blocks]
        return [
            collate(blocks, idx, length, self.spec.pad_id)
            for length, idx in plan(lengths, self.batching, self.spec.max_length)
        ]

    def _run_blocks(self, blocks: Sequence[Block]) -> list[tuple[float, np.ndarray]]:
        """Model outputs per block: (rerank score, probabilities of its sentence slots)."""
        batches = self._batches(blocks)
        return block_outputs(blocks, batches, infer_batches(self.backend, batches))

    def close(self) -> None:
        """Release the core's sessions or connections."""
        self.backend.close()

    def __enter__(self) -> "Pruner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def block_outputs(
    blocks: Sequence[Block], batches: Sequence[ModelBatch], outputs: Sequence[tuple[np.ndarray, np.ndarray]]
) -> list[tuple[float, np.ndarray]]:
    """Model outputs per block: (rerank score, probabilities of its sentence slots),
    after checking that the core answered every row of every batch."""
    if len(outputs) != len(batches):
        raise BackendError(f"backend returned {len(outputs)} results for {len(batches)} batches")
    out: list[tuple[float, np.ndarray] | None] = [None] * len(blocks)
    for batch, (rerank, probs) in zip(batches, outputs):
        rerank = np.asarray(rerank).reshape(-1)
        probs = np.asarray(probs)
        if rerank.shape[0] != len(batch.blocks) or probs.ndim != 2 or probs.shape[0] != len(batch.blocks):
            raise BackendError(f"backend returned {rerank.shape[0]} rows for a batch of {len(batch.blocks)}")
        for row, b in enumerate(batch.blocks):
            n_slots = len(blocks[b].units)
            if probs.shape[1] < n_slots:
                raise BackendError(
                    f"backend returned {probs.shape[1]} sentence columns, block needs {n_slots}"
                )
            out[b] = (float(rerank[row]), np.asarray(probs[row, :n_slots], dtype=np.float64))
    return out  # type: ignore[return-value]
