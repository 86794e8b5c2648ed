"""Compressor: LLMLingua-2 in the engine, the same words kept as llmlingua 0.2.2's own code.

    from engine import Compressor
    compressor = Compressor.load("path/to/llmlingua-2-checkpoint")
    result = compressor.compress(prompt, rate=0.33, force_tokens=["\\n", "?"])
    result.compressed_prompt, result.origin_tokens, result.compressed_tokens, result.kept_spans

`Compressor.load` opens a checkpoint (PyTorch) or its export (`prune export`: fp32, the gated INT8,
fp16, auto's pick), through the one loader a pruner's export goes through
(engine.models.loading.open_model: the same LoadOptions, the same rule for the backend). `compress` takes
`PromptCompressor.compress_prompt(use_llmlingua2=True)`'s argument names and
returns its fields (`CompressResult.to_dict()` is its dict). The text side and the decisions are
engine.pipeline's (lingua_words.py, lingua_decide.py); the model runs once per chunk, chunks
sorted by length and padded to the longest of their batch (the reference pads each to 512).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np

from engine.backends.base import TokenCore
from engine.errors import InputError
from engine.cancellation import check_cancelled
from engine.pipeline.budget import tiktoken_encoding
from engine.pipeline.inputs import Limits, check_unicode, default_limits
from engine.pipeline.lingua_decide import CompressOptions, CompressResult, WordCounter, decide, plan
from engine.pipeline.lingua_words import (
    Chunk,
    LinguaTokenizer,
    merge_words,
    word_spans,
)

#: chunks per model batch on a GPU (and through Triton's GPU core): one padded batch keeps it busy.
#: On a CPU each chunk runs alone at its own length (`batch_chunks` 1): with XLM-R large on 2 cores
#: (AMD EPYC, AVX-512) a 2,154-token prompt took 23.7-24.0 s one chunk at a time against 28.3-29.7 s
#: in padded batches of 16, and 32 separate short prompts took as long as one call of all of them
#: (0.95-1.00x): a CPU is busy with one sequence, so batching only adds padding.
BATCH_CHUNKS = 16


class Compressor:
    """An LLMLingua-2 token classifier with llmlingua's decisions around it."""

    def __init__(
        self,
        tokenizer: LinguaTokenizer,
        core: TokenCore,
        encoding: Any,
        limits: Limits | None = None,
        batch_chunks: int | None = None,
    ):
        self.tokenizer, self.core = tokenizer, core
        #: chunks per model run (BATCH_CHUNKS): the core's own (1 on a CPU), else BATCH_CHUNKS
        self.batch_chunks = batch_chunks or core.batch_chunks or BATCH_CHUNKS
        self.count = WordCounter(encoding)
        #: a call's limits (contexts, characters): the pruner's, PRUNE_MAX_PASSAGES and PRUNE_MAX_CALL_CHARS
        self.limits = limits or default_limits()
        tok = tokenizer.tok
        self.pad_id = next((i for t in ("[PAD]", "<pad>") if (i := tok.token_to_id(t)) is not None), 0)

    @classmethod
    def load(
        cls,
        model: str | Path,
        backend: Any = None,
        options: Any = None,
        *,
        log: Any = None,
        **shortcuts: Any,
    ) -> "Compressor":
        """An LLMLingua-2 checkpoint folder (config.json, safetensors, tokenizer.json), run in
        PyTorch on the CPU, or its export (manifest.json, model.onnx, tokenizer.json: `prune
        export`), opened as `Pruner.load` opens a pruner's (engine.models.loading.open_model): the
        same `options` (an engine.models.loading.LoadOptions, also taken as the second argument)
        and keyword shortcuts (`threads=2`, `device="cuda"`, `backend="openvino"`,
        `precision="bf16"`, `providers=`, `tensorrt=True` or a cache folder, ...), over the
        `PRUNE_*` variables in force (PRUNE_INTRA_OP_THREADS, PRUNE_ORT_ARENA,
        PRUNE_ORT_DENORMALS, ...). With no backend, an export runs on the runtime its manifest
        prefers where this machine has it (`prune export --precision auto`'s pick: OpenVINO bf16),
        else ONNX Runtime, saying why (to `log`, else as a warning). On device cuda (ONNX Runtime's
        CUDA provider: pip install 'prune-engine[gpu]') an fp16 export runs as the GPU graph
        (engine.backends.gpu_token_probs.GpuTokenProbs: one copy of the weights, batches of chunks
        padded to 64-512 tokens and captured as CUDA graphs, at most PRUNE_GPU_GRAPHS shapes), any
        other on the process's GPU thread; the CPU runs an fp16 export too, slowly."""
        from engine.models.loading import LoadOptions, ModelKind, open_model

        options = LoadOptions.given(backend, options, **shortcuts)
        core, tokenizer, _ = open_model(model, options, log, ModelKind.COMPRESSOR)
        return cls(tokenizer, cast(TokenCore, core), tiktoken_encoding("gpt-3.5-turbo"))

    @classmethod
    def connect(cls, url: str, model: str, **kwargs: Any) -> Any:
        """The same API on a compressor's text model (`<name>_text`) of a Triton server (`prune
        repository` on the export): a TritonCompressor (engine.remote.connect.connect_compressor;
        keywords protocol, timeout, retries, backoff, ready_timeout)."""
        from engine.remote.connect import connect_compressor  # the public doors' import upward (test_layout)

        return connect_compressor(url, model, **kwargs)

    def kept_words(
        self, texts: list[str], rate: float | None, target_token: int | None
    ) -> list[list[tuple[int, int]]]:
        """The kept words of each text as spans of it, each text a context of its own (the
        context-level filter off: none dropped), at `rate` or `target_token`: what a pruner's call
        with compress_rate / compress_target_token runs on its pruned texts
        (engine.pipeline.token_compress)."""
        arguments: dict[str, Any] = {"use_context_level_filter": False}
        if target_token is not None:
            arguments["target_token"] = target_token
        else:
            arguments["rate"] = rate
        return self.compress(texts, **arguments).kept_spans

    def compress(self, context: str | list[str], **arguments: Any) -> CompressResult:
        """compress_prompt_llmlingua2 on `context` (a string or a list of them), with its argument
        names (rate, target_token, force_tokens, force_reserve_digit, drop_consecutive,
        use_context_level_filter, context_level_rate, force_context_ids, return_word_label, ...)."""
        contexts = [context] if isinstance(context, str) else context
        if not isinstance(contexts, list) or not contexts or not all(isinstance(c, str) for c in contexts):
            raise InputError("context must be a string or a non-empty list of strings")
        self._check_size(contexts)
        opts = CompressOptions.of(**arguments)
        tok = self.tokenizer
        if opts.target_token > 0 and not any(contexts) or not any(c.strip() for c in contexts):
            raise InputError("context is empty: nothing to compress")
        p = plan(tok, contexts, opts, self.count)
        needs_model = (opts.use_context_level_filter and len(contexts) > 1) or (
            opts.use_token_level_filter and opts.rate < 1.0 or opts.target_token > 0
        )
        flat = [c for chunks in p.chunks for c in chunks]
        probs = self._token_probs(flat) if needs_model else [np.zeros(sum(c.mask)) for c in flat]
        words, spans, k = [], [], 0
        for i, chunks in enumerate(p.chunks):
            words.append([])
            spans.append([])
            for c in chunks:
                w = merge_words(tok, c, probs[k], list(opts.force_tokens), p.token_map,
                                opts.force_reserve_digit, opts.token_to_word)  # fmt: skip
                words[-1].append(w)
                spans[-1].append(word_spans(tok, c, w, *p.maps[i], contexts[i]))
                k += 1
        return decide(tok, p, words, spans, opts, self.count)

    def _check_size(self, contexts: list[str]) -> None:
        """InputError past the call limits (contexts, characters: the pruner's) or on a lone surrogate."""
        self.limits.check_count(len(contexts), "contexts in one call")
        total = 0
        for i, c in enumerate(contexts):
            check_unicode(c, f"context {i}")
            total += len(c)
            if total > self.limits.max_chars:
                raise InputError(
                    f"the call holds more than {self.limits.max_chars} characters (passed at context {i}); "
                    "split it into several calls"
                )

    def _token_probs(self, chunks: list[Chunk]) -> list[np.ndarray]:
        """Each chunk's active tokens' probability of label 1: chunks sorted by length, in batches of
        `batch_chunks` padded to the longest of their batch (on a CPU, each alone: no padding)."""
        order = sorted(range(len(chunks)), key=lambda i: len(chunks[i].ids))
        out: list[np.ndarray] = [np.zeros(0)] * len(chunks)
        for at in range(0, len(order), self.batch_chunks):
            check_cancelled()  # a caller that gave up (the API past its deadline) stops the call here
            batch = order[at : at + self.batch_chunks]
            length = max(len(chunks[i].ids) for i in batch)
            ids = np.full((len(batch), length), self.pad_id, dtype=np.int64)
            mask = np.zeros((len(batch), length), dtype=np.int64)
            for row, i in enumerate(batch):
                ids[row, : len(chunks[i].ids)] = chunks[i].ids
                mask[row, : len(chunks[i].ids)] = chunks[i].mask
            probs = self.core.token_probs(ids, mask)
            for row, i in enumerate(batch):
                out[i] = probs[row][mask[row].astype(bool)]
        return out

    @property
    def tokenizer_kind(self) -> str:
        """wordpiece (BERT's layout) or sentencepiece (XLM-R's): what /info says."""
        return self.tokenizer.kind

    def close(self) -> None:
        """Release what the core holds (the GPU graph's sessions, device weights and thread; an ONNX
        Runtime or PyTorch session goes with the object); as Pruner.close."""
        self.core.close()

    def describe(self) -> str:
        """The model's runtime and tokenizer, in words."""
        return f"LLMLingua-2 ({self.tokenizer.kind}) on {self.core.describe()}"
