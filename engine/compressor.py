"""Compressor: LLMLingua-2 in the engine, the same words kept as llmlingua 0.2.2's own code.

    from engine import Compressor
    compressor = Compressor.load("path/to/llmlingua-2-checkpoint")
    result = compressor.compress(prompt, rate=0.33, force_tokens=["\\n", "?"])
    result.compressed_prompt, result.origin_tokens, result.compressed_tokens, result.kept_spans

`compress` takes `PromptCompressor.compress_prompt(use_llmlingua2=True)`'s argument names and
returns its fields (`CompressResult.to_dict()` is its dict). The text side and the decisions are
engine.pipeline's (lingua_words.py, lingua_decide.py); the model runs once per chunk, chunks
sorted by length and padded to the longest of their batch (the reference pads each to 512).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InputError
from engine.pipeline.budget import tiktoken_encoding
from engine.pipeline.lingua_decide import CompressOptions, CompressResult, WordCounter, decide, plan
from engine.pipeline.lingua_words import Chunk, LinguaTokenizer, check_folder, merge_words, word_spans

#: chunks per model batch
BATCH_CHUNKS = 16


class Compressor:
    """An LLMLingua-2 token classifier with llmlingua's decisions around it."""

    def __init__(self, tokenizer: LinguaTokenizer, core: Any, encoding: Any):
        self.tokenizer, self.core = tokenizer, core
        self.count = WordCounter(encoding)
        tok = tokenizer.tok
        self.pad_id = next((i for t in ("[PAD]", "<pad>") if (i := tok.token_to_id(t)) is not None), 0)

    @classmethod
    def load(cls, model: str | Path, *, threads: int | None = None) -> "Compressor":
        """An LLMLingua-2 checkpoint folder (config.json, safetensors, tokenizer.json), run in PyTorch."""
        from engine.backends.torch import TorchTokenProbs

        check_folder(model)
        tokenizer = LinguaTokenizer.from_folder(model)
        core = TorchTokenProbs(model, tokenizer.size, threads=threads)
        return cls(tokenizer, core, tiktoken_encoding("gpt-3.5-turbo"))

    def compress(self, context: str | list[str], **options: Any) -> CompressResult:
        """compress_prompt_llmlingua2 on `context` (a string or a list of them), with its argument
        names (rate, target_token, force_tokens, force_reserve_digit, drop_consecutive,
        use_context_level_filter, context_level_rate, force_context_ids, return_word_label, ...)."""
        contexts = [context] if isinstance(context, str) else context
        if not isinstance(contexts, list) or not contexts or not all(isinstance(c, str) for c in contexts):
            raise InputError("context must be a string or a non-empty list of strings")
        try:
            opts = CompressOptions(**options)
        except TypeError as exc:
            names = ", ".join(CompressOptions.__dataclass_fields__)
            raise InputError(f"{exc}; compress takes {names}") from None
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

    def _token_probs(self, chunks: list[Chunk]) -> list[np.ndarray]:
        """Each chunk's active tokens' probability of label 1: chunks sorted by length, batched,
        padded to the longest of their batch."""
        order = sorted(range(len(chunks)), key=lambda i: len(chunks[i].ids))
        out: list[np.ndarray] = [np.zeros(0)] * len(chunks)
        for at in range(0, len(order), BATCH_CHUNKS):
            batch = order[at : at + BATCH_CHUNKS]
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

    def describe(self) -> str:
        """The model's runtime and tokenizer, in words."""
        return f"LLMLingua-2 ({self.tokenizer.kind}) on {self.core.describe()}"
