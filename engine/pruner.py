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

from engine import lexical
from engine import text as textmod
from engine.backends.base import Backend
from engine.batching import BatchingConfig, ModelBatch, collate, plan
from engine.decide import PruneResult, build_result, gate_passages, keep_mask, order_results
from engine.encode import Block, Encoder, load_tokenizer, manifest_tokenizer
from engine.errors import BackendError, InputError, ModelLoadError, PruneError
from engine.families import Rules
from engine.inputs import CallOptions, Limits, check_call, check_sentences, check_windows, default_limits
from engine.settings import DEFAULTS
from engine.protocol import PrunerProtocol
from engine.spec import ModelSpec, read_manifest, spec_from_manifest

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


@dataclass
class Scored:
    """Per-passage model outputs after merging blocks."""
    probs: np.ndarray
    rerank: float | None
    blocks: int
    kept: np.ndarray | None = None    # token windows: the union of the windows' own decisions


class Pruner:
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
    def load(cls, path: str | Path, backend: str = "onnxruntime", *, family: str | None = None,
             threads: int | None = None, providers: list[str] | None = None,
             batching: BatchingConfig | None = None, graph: str | None = None,
             device: str = "cpu", options: dict[str, Any] | None = None,
             tensorrt: bool | str | Path = False, log: Any = None, dtype: str = "float32",
             attn: str = "eager") -> "Pruner":
        """Load an exported model folder (ONNX Runtime), or a checkpoint (backend="torch").

        `device="cuda"`: ONNX Runtime's CUDA provider with IO binding (onnxruntime-gpu), or
        torch on the GPU; `tensorrt` (cuda, ONNX Runtime): its TensorRT provider first, fp16,
        engines cached in the model folder's `trt-cache/` (or the folder given), falling
        back to CUDA with a message (`log`) where the provider is absent. For torch, `dtype`
        (float32, float16, bfloat16) and `attn` (eager, sdpa: the checkpoint's backbone must
        offer it; DeBERTa-v2/v3 does not) give the GPU reference most users run today.

        `threads` sets ONNX Runtime's intra-op threads (or torch's threads). `"default"`
        is the default model (all-MiniLM-L6-v2): its export (made on first use) for ONNX
        Runtime, its checkpoint for torch.
        """
        if str(path) == "default" and not Path("default").exists():
            from engine.default_model import default_checkpoint, ensure_default_model
            path = default_checkpoint() if backend == "torch" else ensure_default_model()
        path = Path(path)
        if backend == "onnxruntime":
            from engine.backends.onnxruntime import OnnxRuntimeBackend
            manifest = read_manifest(path)
            spec = spec_from_manifest(manifest, name=path.name)
            tokenizer = manifest_tokenizer(path, manifest, spec.family)
            trt = None
            if tensorrt:
                from engine.backends.onnxruntime import tensorrt_options
                trt = tensorrt_options(list(spec.input_names), list(manifest.get("buckets") or [spec.max_length]),
                                       (batching or BatchingConfig()).max_batch_size,
                                       Path(tensorrt) if isinstance(tensorrt, (str, Path)) else path / "trt-cache")
            core = OnnxRuntimeBackend(path / (graph or manifest["graph"]), intra_op_threads=threads,
                                      providers=providers, device=device, tensorrt=trt, log=log)
            missing = set(spec.input_names) - set(core.input_names)
            if missing:
                raise ModelLoadError(f"{path}: graph lacks inputs {sorted(missing)}")
            return cls(core, tokenizer, spec, batching)
        if backend == "torch":
            from engine.backends.torch import TorchBackend
            if dtype not in ("float32", "float16", "bfloat16"):
                raise InputError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
            if attn not in ("eager", "sdpa"):
                raise InputError(f"attn must be eager or sdpa, got {attn!r}")
            core, tokenizer, spec = TorchBackend.from_checkpoint(path, family=family, options=options, attn=attn,
                                                                 threads=threads, device=device, dtype=dtype)
            return cls(core, tokenizer, spec, batching)
        raise InputError(f"unknown backend {backend!r}: onnxruntime or torch "
                         "(Triton: Pruner.connect)")

    @classmethod
    def connect(cls, url: str | Sequence[str], model: str, *, protocol: str = "grpc",
                tokenizer: str | Path | None = None, batching: BatchingConfig | None = None,
                timeout: float = DEFAULTS.timeout, retries: int = 3, backoff: float = 0.5, concurrency: int = 8,
                ready_timeout: float = 10.0, replica_options: dict[str, Any] | None = None) -> PrunerProtocol:
        """The same API on a model of a Triton server (see `prune repository`).

        `url` is one server (`host:port`) or several replicas of it: a list of endpoints, a
        comma-separated string, or `dns:///name:port` (every address the name resolves to,
        re-resolved as it changes: a headless Kubernetes Service). Requests then go to the
        least busy ready replica and fail over to another on connection errors and
        timeouts (`engine.triton.replicas`; `replica_options`: try_timeout, health_interval,
        resolve_interval, log). Several replicas need gRPC.

        A text model (`<name>_text`) takes the question and passages as text and does
        everything on the server: the client needs no tokenizer (returns a
        `TritonTextPruner`). A core model takes token ids: the client splits and
        tokenizes, with the manifest from the model's config and the tokenizer from the
        text model beside it (or `tokenizer`: an export folder or a tokenizer.json).

        `timeout` is the deadline of one `prune()` call: every request carries what is
        left of it, and retries of connection errors (`retries`, exponential `backoff`)
        stop when it is spent, so a call ends in at most `timeout` seconds.
        """
        from engine.backends.triton import TritonBackend
        from engine.triton.client import Transport, TritonClient
        from engine.triton.replicas import ReplicaSet, is_replicated
        transport: Transport
        if is_replicated(url):
            transport = ReplicaSet(url, model, protocol=protocol, timeout=timeout, retries=retries, backoff=backoff,
                                   concurrency=concurrency, ready_timeout=ready_timeout, **(replica_options or {}))
        else:   # a single host:port (is_replicated takes every list)
            transport = TritonClient(str(url), model, protocol=protocol, timeout=timeout, retries=retries,
                                     backoff=backoff, concurrency=concurrency, ready_timeout=ready_timeout)
        if transport.is_text_model:
            from engine.triton.text_pruner import TritonTextPruner
            return TritonTextPruner(transport)
        try:
            core = TritonBackend(transport)
        except Exception:
            transport.close()
            raise
        manifest = core.manifest()
        spec = spec_from_manifest(manifest, name=model)
        if tokenizer is not None:
            path = Path(tokenizer)
            tok = load_tokenizer(path / "tokenizer.json" if path.is_dir() else path)
        else:
            text = core.tokenizer_json()
            if text is None:
                raise ModelLoadError(f"model {model!r} has no text model to fetch its tokenizer from: pass "
                                     "tokenizer= (the export folder)")
            from tokenizers import Tokenizer
            tok = Tokenizer.from_str(text)
            tok.no_padding()
            tok.no_truncation()
        missing = set(spec.input_names) - set(core.input_names)
        if missing:
            raise ModelLoadError(f"model {model!r} lacks inputs {sorted(missing)}")
        return cls(core, tok, spec, batching)

    def describe(self) -> str:
        return self.backend.describe()

    async def aprune(self, question: str, passages: str | Sequence[str], options: CallOptions | None = None,
                     **kwargs: Any) -> list[PruneResult]:
        """`prune` for asyncio code: runs in a worker thread (tokenization is CPU work and
        remote calls block), so the event loop stays free."""
        import asyncio
        return await asyncio.to_thread(self.prune, question, passages, options, **kwargs)

    @property
    def family(self):
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
        fam, rules = self.spec.family, call.rules
        scored = self.merge(call.passages, call.spans, call.blocks, per_block,
                            unweighted=self._fragment_tokens(rules.windows) is not None)
        per_window = (self._window_decisions(call.spans, call.blocks, per_block, rules.threshold, rules.alpha)
                      if self._token_windows(rules.windows) else None)
        if rules.lexical_weight:      # the in-passage lexical score fused with the model's (engine.lexical)
            w = rules.lexical_weight
            for p, sp, sc in zip(call.passages, call.spans, scored):
                sc.probs = lexical.fuse(sc.probs, lexical.sentence_scores(call.question, [p[a:b] for a, b in sp]), w)
                if sc.rerank is not None:
                    sc.rerank = float(lexical.fuse(sc.rerank, lexical.passage_score(call.question, p), w))
        results = []
        for i, (p, sp, sc) in enumerate(zip(call.passages, call.spans, scored)):
            if per_window is not None:
                sc.probs, kept = per_window[i]
            else:
                kept = keep_mask(sc.probs, fam, rules.threshold, rules.title, rules.alpha)
            rerank = 0.0 if fam.zero_rerank_when_empty and sc.rerank is not None and not kept.any() else sc.rerank
            results.append(build_result(i, p, sp, sc.probs, kept, rerank, rules.threshold, sc.blocks,
                                        windows=rules.windows, lexical_weight=rules.lexical_weight))
        return order_results(gate_passages(results, rules.passage_margin), call.options.reorder, call.options.top_k)

    def _window_decisions(self, spans: Sequence[Sequence[tuple[int, int]]], blocks: Sequence[Block],
                          per_block: Sequence[tuple[float, np.ndarray]], threshold: float,
                          alpha: float | None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per passage (probabilities, kept) the way token windows decide: each window keeps
        its own sentences (threshold, then backoff within the window); a sentence is kept
        when any window keeps it, and its probability is its best over the windows."""
        fam = self.spec.family
        probs = [np.zeros(len(sp)) for sp in spans]
        kept = [np.zeros(len(sp), dtype=bool) for sp in spans]
        for block, (_, p) in zip(blocks, per_block):
            sents = [u[0] for u in block.units]
            mine = keep_mask(p, fam, threshold, "none", alpha)
            i = block.passage
            for k, sent in enumerate(sents):
                probs[i][sent] = max(probs[i][sent], p[k])
                kept[i][sent] |= bool(mine[k])
        return list(zip(probs, kept))

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

    def merge(self, passages: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]],
              blocks: Sequence[Block], outputs: Sequence[tuple[float, np.ndarray]],
              unweighted: bool = False) -> list[Scored]:
        """Per passage: sentence probabilities (pieces merged token-weighted, or as a plain
        mean of the pieces with `unweighted`, OpenProvence's fragments) and the reranking
        score (first block, or the best block for the embedding family)."""
        weighted = [np.zeros(len(sp)) for sp in spans]
        tokens = [np.zeros(len(sp)) for sp in spans]
        rerank: list[float | None] = [None] * len(passages)
        n_blocks = [0] * len(passages)
        use_max = self.spec.family.rerank_merge == "max"
        sigmoid = self.spec.family.rerank_transform == "sigmoid"
        for block, (score, probs) in zip(blocks, outputs):
            i = block.passage
            n_blocks[i] += 1
            if sigmoid:
                score = float(1.0 / (1.0 + np.exp(-score)))
            if block.first and not use_max:
                rerank[i] = score
            elif use_max:
                rerank[i] = score if rerank[i] is None else max(rerank[i], score)
            for (sent, n_tok), p in zip(block.units, probs):
                w = 1 if unweighted else n_tok
                weighted[i][sent] += p * w
                tokens[i][sent] += w
        scored = []
        for i in range(len(passages)):
            probs = np.divide(weighted[i], tokens[i], out=np.zeros_like(weighted[i]),
                              where=tokens[i] > 0)
            scored.append(Scored(probs=probs, rerank=rerank[i], blocks=n_blocks[i]))
        return scored

    def score(self, question: str, passages: Sequence[str],
              spans: Sequence[Sequence[tuple[int, int]]], windows: str | None = None) -> list[Scored]:
        """Sentence probabilities and reranking score per passage, blocks merged. With
        token windows (`windows="reference"` where the family has them) the probability of
        a sentence is its best over the windows, and `kept` the windows' own decisions at
        the family's defaults."""
        windows = self.windows_mode(windows)
        blocks = self.encode(question, passages, spans, windows)
        outputs = self.run_blocks(blocks)
        scored = self.merge(passages, spans, blocks, outputs, unweighted=self._fragment_tokens(windows) is not None)
        if self._token_windows(windows):
            fam = self.spec.family
            decided = self._window_decisions(spans, blocks, outputs, fam.threshold, fam.backoff_alpha)
            for sc, (probs, kept) in zip(scored, decided):
                sc.probs, sc.kept = probs, kept
        return scored

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> "Pruner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
