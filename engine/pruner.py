"""`Pruner`: the user-facing API around an accelerated core.

    pruner = Pruner.load("build/provence")            # ONNX Runtime in-process
    results = pruner.prune(question, [p1, p2, ...], threshold=0.1)

Pipeline: split sentences (engine.text) -> tokenize once, build blocks (engine.encode)
-> sort and pack by a token budget (engine.batching) -> backend.infer -> merge blocks
and decide (engine.decide).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine import text as textmod
from engine.backends.base import Backend
from engine.batching import BatchingConfig, ModelBatch, collate, plan
from engine.decide import PruneResult, Scored, decide_passages, merge_blocks, window_decisions
from engine.encode import Block, Encoder
from engine.errors import BackendError, InputError, PruneError
from engine.families import Rules
from engine.inputs import CallOptions, Limits, check_call, check_sentences, check_windows, default_limits
from engine.settings import DEFAULTS
from engine.protocol import PrunerProtocol
from engine.spec import ModelSpec

log = logging.getLogger(__name__)

#: what one call may hold by default (engine.settings; PRUNE_MAX_PASSAGES, PRUNE_MAX_CALL_CHARS):
#: one call at the character limit peaks at 0.6 GB (many passages) to 1.4 GB (one passage)
#: of RSS (docs/limits.md)
MAX_PASSAGES = DEFAULTS.max_passages
MAX_CALL_CHARS = DEFAULTS.max_call_chars


@dataclass
class Call:
    """One prepared `prune` call: the checked inputs, its options and the rules they give,
    the sentence spans of every passage, its blocks and the padded batches the core must run."""
    passages: list[str]
    spans: list[list[tuple[int, int]]]
    blocks: list[Block]
    batches: list[ModelBatch]
    options: CallOptions
    rules: Rules
    question: str = ""


class Pruner:
    """Context pruning in-process: tokenization, batching, a core (ONNX Runtime, PyTorch,
    Triton) and the family's decisions."""

    def __init__(self, backend: Backend, tokenizer: Any, spec: ModelSpec,
                 batching: BatchingConfig | None = None, min_context_tokens: int = 64,
                 limits: Limits | None = None):
        self.backend = backend
        self.spec = spec
        self.limits = limits or default_limits()
        self.encoder = Encoder(tokenizer, spec, min_context_tokens)
        self.batching = batching or BatchingConfig()
        if backend.max_batch_size and backend.max_batch_size < self.batching.max_batch_size:
            self.batching = BatchingConfig(self.batching.max_batch_tokens, backend.max_batch_size,
                                           self.batching.buckets, self.batching.strategy)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path, backend: str | None = None, *, batching: BatchingConfig | None = None,
             **kwargs: Any) -> "Pruner":
        """Load an exported model folder (ONNX Runtime, or OpenVINO: backend="openvino"), or a
        checkpoint (backend="torch"). An `ov-int8` export (OpenVINO IR) runs on OpenVINO; with
        no `backend`, an export runs on the runtime its manifest prefers (`prune export
        --precision auto` may pick OpenVINO's bf16 inference of the fp32 graph) where this
        machine has it, else on ONNX Runtime (saying why, to `log` or as a warning).

        Keywords (engine.loading.open_model): `threads` (ONNX Runtime's intra-op threads, or
        torch's), `device="cuda"` (ONNX Runtime's CUDA provider with IO binding, from
        onnxruntime-gpu, or torch on the GPU), `tensorrt` (cuda, ONNX Runtime: its TensorRT
        provider first, fp16, engines cached in the model folder's `trt-cache/` or the folder
        given, falling back to CUDA with a message to `log` where the provider is absent),
        `providers`, `graph` (another graph of the folder), and for torch `family`, `options`,
        `dtype` (float32, float16, bfloat16) and `attn` (eager, sdpa: the checkpoint's
        backbone must offer it; DeBERTa-v2/v3 does not); for openvino `precision` ("fp32", or
        "bf16" inference where the CPU has it) and `shape_cache` (compiled shapes kept; 0:
        none, memory stays flat). `"default"` is the default model
        (all-MiniLM-L6-v2): its export (made on first use) for ONNX Runtime, its checkpoint
        for torch.
        """
        from engine.loading import open_model
        core, tokenizer, spec = open_model(path, backend, batching=batching, **kwargs)
        return cls(core, tokenizer, spec, batching)

    @classmethod
    def connect(cls, url: str | Sequence[str], model: str, **kwargs: Any) -> PrunerProtocol:
        """The same API on a model of a Triton server: `engine.triton.connect.connect` (see
        there for the keywords: protocol, tokenizer, batching, timeout, retries, backoff,
        concurrency, ready_timeout, replica_options). A text model gives a
        `TritonTextPruner`, a core model a `Pruner` that tokenizes here."""
        from engine.triton.connect import connect     # the public door's one import upward (test_layout)
        return connect(url, model, **kwargs)

    def describe(self) -> str:
        """What runs the model, in words: the runtime, and the export's precision (and
        whether `prune export --precision auto` picked it)."""
        picked = " (auto's pick)" if self.spec.auto_pick else ""
        return f"{self.backend.describe()}, {self.spec.precision} export{picked}"

    async def aprune(self, question: str, passages: str | Sequence[str], options: CallOptions | None = None,
                     **kwargs: Any) -> list[PruneResult]:
        """`prune` for asyncio code: runs in a worker thread (tokenization is CPU work and
        remote calls block), so the event loop stays free."""
        import asyncio
        return await asyncio.to_thread(self.prune, question, passages, options, **kwargs)

    @property
    def family(self):
        """The model's family with the defaults it runs with."""
        return self.spec.family

    # ------------------------------------------------------------------ prune
    def prune(self, question: str, passages: str | Sequence[str], options: CallOptions | None = None, *,
              sentences: Sequence[Sequence[str | tuple[int, int]]] | None = None,
              **changes: Any) -> list[PruneResult]:
        """Prune each passage for `question`; one PruneResult per passage, in input order
        (or by reranking score with `reorder` / `top_k`).

        The call's options are `options` and the keywords of `engine.inputs.CallOptions`
        (threshold, title, alpha, top_k, reorder, windows, lexical_weight, passage_margin;
        None is the model's default, a negative alpha or passage_margin turns that rule off).
        sentences: per passage, the caller's own sentences (strings found in order in the
        passage, or (start, end) spans) instead of the built-in splitter.
        """
        call = self.prepare(question, passages, options, sentences=sentences, **changes)
        return self.finish(call, self.backend.infer_many(call.batches) if call.batches else [])

    def prepare(self, question: str, passages: str | Sequence[str], options: CallOptions | None = None, *,
                sentences: Sequence[Sequence[str | tuple[int, int]]] | None = None, **changes: Any) -> "Call":
        """Everything before the model: checks, sentences, blocks and padded batches.

        `prune` is `finish(prepare(...), backend.infer_many(call.batches))`; a caller that
        runs the core itself (the Triton text model, over BLS) uses the two halves."""
        question, passages = check_call(question, passages, self.limits)
        options = CallOptions.of(options, **changes)
        check_sentences(sentences, len(passages))
        rules = self.spec.family.rules(options)
        spans = [textmod.spans_from_sentences(p, sentences[i]) if sentences is not None
                 else textmod.split_sentences(p) for i, p in enumerate(passages)]
        if rules.lexical_weight and self._token_windows(rules.windows):
            raise InputError("lexical_weight applies to sentence windows; windows='reference' decides per "
                             "token window as the family's own code does (pass windows='sentences')")
        blocks = self.encode(question, passages, spans, rules.windows) if passages else []
        return Call(passages=passages, spans=spans, blocks=blocks, batches=self.batches(blocks),
                    options=options, rules=rules, question=question)

    def windows_mode(self, windows: str | None) -> str:
        """The windowing a call runs: the family's default, or `windows` when valid."""
        return self.spec.family.windows if windows is None else str(check_windows(windows))

    def _token_windows(self, windows: str) -> bool:
        return windows == "reference" and self.spec.family.window_tokens > 0

    def finish(self, call: "Call", outputs: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[PruneResult]:
        """Everything after the model: merge blocks, decide, build and order results.
        `outputs` holds (rerank_score [B], sentence_probs [B, S]) per batch of the call."""
        return self.finish_blocks(call, self.block_outputs(call.blocks, call.batches, outputs))

    def finish_blocks(self, call: "Call", per_block: Sequence[tuple[float, np.ndarray]]) -> list[PruneResult]:
        """`finish` from the outputs of each block of the call (rerank score, slot probabilities)."""
        return decide_passages(self.spec.family, call.rules, call.options, call.question, call.passages, call.spans,
                               self.scores(call, per_block))

    def scores(self, call: "Call", per_block: Sequence[tuple[float, np.ndarray]]) -> list[Scored]:
        """The call's per-passage model scores (engine.decide: blocks merged; with token
        windows, each window's own decisions at the call's threshold and backoff)."""
        fam, rules = self.spec.family, call.rules
        scored = merge_blocks(fam, len(call.passages), call.spans, call.blocks, per_block,
                              unweighted=self._fragment_tokens(rules.windows) is not None)
        if self._token_windows(rules.windows):
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
                calls.append(self.prepare(q.pop("question"), q.pop("passages"), **q))
            except (PruneError, TypeError, KeyError) as exc:
                calls.append(exc if isinstance(exc, PruneError) else InputError(f"bad query: {exc!r}"))
        good = [c for c in calls if isinstance(c, Call)]
        blocks = [b for c in good for b in c.blocks]
        per_block = self.run_blocks(blocks) if blocks else []
        out: list[list[PruneResult] | Exception] = []
        pos = 0
        for c in calls:
            if isinstance(c, Exception):
                out.append(c)
                continue
            out.append(self.finish_blocks(c, per_block[pos:pos + len(c.blocks)]))
            pos += len(c.blocks)
        return out

    # ------------------------------------------------------------------ model
    def encode(self, question: str, passages: Sequence[str],
               spans: Sequence[Sequence[tuple[int, int]]], windows: str | None = None) -> list[Block]:
        """All blocks of a call (sentences of every passage tokenized in one batch), cut
        the way `windows` says (the family's default if None)."""
        windows = self.windows_mode(windows)
        q_ids = self.encoder.question_ids(question)
        flat = [p[s:e] for p, sp in zip(passages, spans) for s, e in sp]
        token_windows = self._token_windows(windows)
        ids = self.encoder.tokenize_words(flat) if token_windows else self.encoder.tokenize(flat)
        fragment = self._fragment_tokens(windows)
        blocks: list[Block] = []
        pos = 0
        for i, sp in enumerate(spans):
            part = ids[pos:pos + len(sp)]
            blocks.extend(self.encoder.windows(q_ids, i, part) if token_windows
                          else self.encoder.blocks(q_ids, i, part, fragment))
            pos += len(sp)
        return blocks

    def _fragment_tokens(self, windows: str) -> int | None:
        """OpenProvence's fragment size under its reference windows (None: the engine's way)."""
        div = self.spec.family.fragment_divisor
        return max(16, self.spec.max_length // div) if windows == "reference" and div else None

    def batches(self, blocks: Sequence[Block]) -> list[ModelBatch]:
        """The padded batches the blocks are run in (lengths bucketed, within the token budget)."""
        lengths = [len(b) for b in blocks]
        return [collate(blocks, idx, length, self.spec.pad_id)
                for length, idx in plan(lengths, self.batching, self.spec.max_length)]

    @staticmethod
    def block_outputs(blocks: Sequence[Block], batches: Sequence[ModelBatch],
                      outputs: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[tuple[float, np.ndarray]]:
        """Model outputs per block: (rerank score, probabilities of its sentence slots),
        after checking that the core answered every row of every batch."""
        if len(outputs) != len(batches):
            raise BackendError(f"backend returned {len(outputs)} results for {len(batches)} batches")
        out: list[tuple[float, np.ndarray] | None] = [None] * len(blocks)
        for batch, (rerank, probs) in zip(batches, outputs):
            rerank = np.asarray(rerank).reshape(-1)
            probs = np.asarray(probs)
            if rerank.shape[0] != len(batch.blocks) or probs.ndim != 2 or probs.shape[0] != len(batch.blocks):
                raise BackendError(f"backend returned {rerank.shape[0]} rows for a batch of "
                                   f"{len(batch.blocks)}")
            for row, b in enumerate(batch.blocks):
                n_slots = len(blocks[b].units)
                if probs.shape[1] < n_slots:
                    raise BackendError(f"backend returned {probs.shape[1]} sentence columns, "
                                       f"block needs {n_slots}")
                out[b] = (float(rerank[row]), np.asarray(probs[row, :n_slots], dtype=np.float64))
        return out  # type: ignore[return-value]

    def run_blocks(self, blocks: Sequence[Block]) -> list[tuple[float, np.ndarray]]:
        """Model outputs per block: (rerank score, probabilities of its sentence slots)."""
        batches = self.batches(blocks)
        return self.block_outputs(blocks, batches, self.backend.infer_many(batches))

    def score(self, question: str, passages: Sequence[str],
              spans: Sequence[Sequence[tuple[int, int]]], windows: str | None = None) -> list[Scored]:
        """The model's own scores per passage on the given sentence spans (no lexical
        fusion, no decision but the token windows' own at the family's defaults): what
        `prune eval` and `prune fidelity` measure. `prepare` and the model, then
        `scores`: the same route as `prune`."""
        call = self.prepare(question, passages, sentences=spans, windows=windows, lexical_weight=0.0)
        return self.scores(call, self.block_outputs(call.blocks, call.batches, self.backend.infer_many(call.batches)))

    def close(self) -> None:
        """Release the core's sessions or connections."""
        self.backend.close()

    def __enter__(self) -> "Pruner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
