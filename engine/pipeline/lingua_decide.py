"""LLMLingua-2's decisions, as `PromptCompressor.compress_prompt_llmlingua2` (llmlingua 0.2.2) makes them.

From the words of each chunk (lingua_words.py) to the result: the threshold per chunk (each
word's probability repeated once per tiktoken gpt-3.5-turbo token of the word, the percentile
`int(100 * (1 - rate) + 1)`, kept if strictly above, or equal when the threshold is 1.0),
`rate` or `target_token`, `drop_consecutive`, the context-level filter, and the reference's
result fields, plus what it cannot give: the kept words' character spans in the original text.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from engine.errors import InputError
from engine.pipeline.lingua_words import (
    Chunk,
    LinguaTokenizer,
    Words,
    chunk_context,
    force_map,
    replace_mapped,
)

#: what the reference's output cost line prices (GPT-4 at $0.06 per 1k tokens)
_PRICE = 0.06 / 1000


@dataclass(frozen=True)
class CompressOptions:
    """compress_prompt's arguments for LLMLingua-2, by its names and with its defaults. Those of
    compress_prompt, the door users call, not of compress_prompt_llmlingua2 behind it: there
    use_context_level_filter is True, so a list of several contexts loses some by default
    (rate 0.5 makes the context rate 0.75: the lowest quarter of the contexts goes)."""

    rate: float = 0.5
    target_token: int = -1
    use_context_level_filter: bool = True
    use_token_level_filter: bool = True
    target_context: int = -1
    context_level_rate: float = 1.0
    context_level_target_token: int = -1
    force_context_ids: tuple[int, ...] = ()
    return_word_label: bool = False
    word_sep: str = "\t\t|\t\t"
    label_sep: str = " "
    token_to_word: str = "mean"
    force_tokens: tuple[str, ...] = ()
    force_reserve_digit: bool = False
    drop_consecutive: bool = False
    chunk_end_tokens: tuple[str, ...] = (".", "\n")

    @classmethod
    def of(cls, **options: Any) -> "CompressOptions":
        """From compress_prompt's argument names; one it does not take is an InputError naming them."""
        try:
            return cls(**options)
        except TypeError as exc:
            raise InputError(f"{exc}; compress takes {', '.join(cls.__dataclass_fields__)}") from None

    def __post_init__(self) -> None:
        for name in ("rate", "context_level_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise InputError(f"{name} must be a number in (0, 1], got {value!r}")
        for name in ("target_token", "target_context", "context_level_target_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value == 0 or value < -1:
                raise InputError(f"{name} must be a positive integer, or -1 for none, got {value!r}")
        if self.token_to_word not in ("mean", "first"):
            raise InputError(f"token_to_word must be mean or first, got {self.token_to_word!r}")
        for name in ("force_tokens", "chunk_end_tokens"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(t, str) and t for t in value):
                raise InputError(f"{name} must be a list of non-empty strings, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        ids = self.force_context_ids
        if ids is None:
            ids = ()
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise InputError(f"force_context_ids must be a list of integers, got {ids!r}")
        object.__setattr__(self, "force_context_ids", tuple(ids))


@dataclass
class CompressResult:
    """The reference's result fields (`saving` too), each context's kept words as character
    spans of the original text (`kept_spans`, one list per context), and which contexts
    compressed_prompt_list's entries are (`kept_contexts`: their indices, in order; the
    context-level filter drops some)."""

    compressed_prompt: str
    compressed_prompt_list: list[str]
    origin_tokens: int
    compressed_tokens: int
    ratio: str
    rate: str
    saving: str
    fn_labeled_original_prompt: str | None = None
    kept_spans: list[list[tuple[int, int]]] = field(default_factory=list)
    kept_contexts: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The reference's dict (fn_labeled_original_prompt only when asked), with kept_spans and
        kept_contexts."""
        out = asdict(self)
        if out["fn_labeled_original_prompt"] is None:
            del out["fn_labeled_original_prompt"]
        return out


@dataclass
class Plan:
    """A call before its model: the contexts' chunks and what the decisions need of the text."""

    contexts: list[str]
    token_map: dict[str, str]
    chunks: list[list[Chunk]]
    maps: list[tuple[np.ndarray, np.ndarray]]  # each context's replaced text to original characters
    origin_tokens: int


class WordCounter:
    """tiktoken's count of a word (gpt-3.5-turbo: cl100k_base), each distinct word once."""

    def __init__(self, encoding: Any):
        self.encoding, self.cache = encoding, {}

    def __call__(self, texts: list[str]) -> np.ndarray:
        """The counts of `texts` (the reference's `len(encode(text))`; a text with a special token's
        string is counted as ordinary text where the reference raises)."""
        new = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if new:
            self.cache.update(zip(new, map(len, self.encoding.encode_ordinary_batch(new, num_threads=1))))
        return np.array([self.cache[t] for t in texts], dtype=np.int64)


def plan(tok: LinguaTokenizer, contexts: list[str], options: CompressOptions, count: WordCounter) -> Plan:
    """The contexts' force-token map, chunks and token count (the first half of the reference)."""
    token_map = force_map(tok, list(options.force_tokens))
    ends = set(options.chunk_end_tokens) | {token_map[c] for c in options.chunk_end_tokens if c in token_map}
    chunks, maps = [], []
    for text in contexts:
        replaced, starts, stops = replace_mapped(text, token_map)
        chunks.append(chunk_context(tok, replaced, ends))
        maps.append((starts, stops))
    return Plan(list(contexts), token_map, chunks, maps, int(count(list(contexts)).sum()))


def _resolve_context_rate(options: CompressOptions, n_contexts: int, origin_tokens: int) -> float:
    """The context-level rate, as the reference derives it from the call's arguments."""
    rate, target = options.context_level_rate, options.context_level_target_token
    if options.target_context <= 0 and rate >= 1.0 and target <= 0:
        if options.target_token < 0 and options.rate < 1.0:
            rate = (options.rate + 1.0) / 2 if options.use_token_level_filter else options.rate
        if options.target_token >= 0:
            target = options.target_token * 2 if options.use_token_level_filter else options.target_token
    if options.target_context >= 0:
        rate = min(options.target_context / n_contexts, 1.0)
    if target >= 0:
        rate = min(target / origin_tokens, 1.0)
    return rate


def context_filter(plan: Plan, words: list[list[Words]], options: CompressOptions) -> list[bool]:
    """Which contexts the context-level filter keeps: the mean of the words' probabilities (their
    first tokens', see merge_words) at or above the percentile, or named in force_context_ids."""
    rate = _resolve_context_rate(options, len(plan.contexts), plan.origin_tokens)
    probs = []
    for ws in words:
        values = np.concatenate([w.probs_no_force for w in ws]) if ws else np.zeros(0)
        probs.append(float(np.cumsum(values)[-1] / values.size) if values.size else 0.0)  # a sum in order
    threshold = np.percentile(probs, int(100 * (1 - rate)))
    return [p >= threshold or i in options.force_context_ids for i, p in enumerate(probs)]


def chunk_labels(tok: LinguaTokenizer, words: Words, reduce_rate: float, options: CompressOptions,
                 count: WordCounter) -> np.ndarray:  # fmt: skip
    """prompt_compressor.__compress for one chunk: which of its words are kept."""
    if not words.words:  # the reference's percentile of nothing raises; nothing is kept
        return np.zeros(0, dtype=bool)
    probs = words.probs.copy()
    force = set(options.force_tokens)
    is_force = np.array([w in force for w in words.words], dtype=bool)
    if options.drop_consecutive:
        threshold = np.percentile(probs, int(100 * reduce_rate))
        between, prev = False, None
        for i in range(len(probs)):
            if is_force[i]:
                if between:
                    between = False
                elif words.words[i] == prev:
                    probs[i] = 0.0
                prev = words.words[i]
            else:
                between |= bool(probs[i] > threshold)
    expanded = np.repeat(probs, count(words.words))
    threshold = np.percentile(expanded, int(100 * reduce_rate + 1))
    keep = (probs > threshold) | ((threshold == 1.0) & (probs == threshold))
    if options.drop_consecutive:  # a force token equal to the last kept word is dropped
        kept = np.flatnonzero(keep)
        names = np.array(words.words, dtype=object)[kept]
        same = np.zeros(kept.size, dtype=bool)
        same[1:] = names[1:] == names[:-1]
        keep[kept[same & is_force[kept]]] = False
    return keep


def _bare(tok: LinguaTokenizer, word: str) -> str:
    return word.lstrip("▁") if tok.kind == "sentencepiece" else word


_WORDS = re.compile(r'\b\w+\b|[<>=/!@#$%^&*()?":{}|\\`~;_+-]')


def decide(
    tok: LinguaTokenizer,
    plan: Plan,
    words: list[list[Words]],
    spans: list[list[list[tuple[int, int] | None]]],
    options: CompressOptions,
    count: WordCounter,
) -> CompressResult:
    """The result of compress_prompt_llmlingua2 from each chunk's words (the second half)."""
    rate, n = options.rate, len(plan.contexts)
    use_filter = options.use_context_level_filter and n > 1
    reserved = context_filter(plan, words, options) if use_filter else [True] * n
    if use_filter and options.target_token >= 0:
        reserved_tokens = int(count([c.text for i in range(n) if reserved[i] for c in plan.chunks[i]]).sum())
        rate = min(options.target_token / reserved_tokens, 1.0)
    elif not use_filter and options.target_token > 0:
        rate = min(options.target_token / plan.origin_tokens, 1.0)
    reduce_rate = max(0, 1 - rate) if options.use_token_level_filter else 0
    texts, labels_out, kept_spans = [], [], []
    for i in range(n):
        if not reserved[i]:
            kept_spans.append([])
            labels_out += [(_bare(tok, w), 0) for ws in words[i] for w in ws.words]
            continue
        if reduce_rate <= 0:  # everything kept: the chunks' strings, words split by a regex
            pieces = []
            for c in plan.chunks[i]:
                piece = c.text
                for ori, new in plan.token_map.items():
                    piece = piece.replace(new, ori)
                pieces.append(piece)
                labels_out += [(w, 1) for w in _WORDS.findall(piece)]
            texts.append("".join(pieces))
            kept_spans.append([s for chunk in spans[i] for s in chunk if s is not None])
            continue
        parts, context_spans = [], []
        for ws, chunk_spans in zip(words[i], spans[i]):
            keep = chunk_labels(tok, ws, reduce_rate, options, count)
            parts.append(tok.to_string([w for w, k in zip(ws.words, keep) if k]))
            labels_out += [(_bare(tok, w), int(k)) for w, k in zip(ws.words, keep)]
            context_spans += [s for s, k in zip(chunk_spans, keep) if k and s is not None]
        texts.append("".join(parts))  # the reference joins a context's chunks with ""
        kept_spans.append(context_spans)
    kept = [i for i in range(n) if reserved[i]]
    return _result(plan, texts, labels_out, (kept_spans, kept), options, count)


def _result(plan: Plan, texts: list[str], labels: list[tuple[str, int]], kept, options, count):
    compressed = int(count(texts).sum()) if texts else 0
    ratio = 1 if compressed == 0 else plan.origin_tokens / compressed
    return CompressResult(
        compressed_prompt="\n\n".join(texts),
        compressed_prompt_list=texts,
        origin_tokens=plan.origin_tokens,
        compressed_tokens=compressed,
        ratio=f"{ratio:.1f}x",
        rate=f"{1 / ratio * 100:.1f}%" if ratio else "0.0%",
        saving=f", Saving ${(plan.origin_tokens - compressed) * _PRICE:.1f} in GPT-4.",
        fn_labeled_original_prompt=(
            options.word_sep.join(f"{w}{options.label_sep}{k}" for w, k in labels)
            if options.return_word_label
            else None
        ),
        kept_spans=kept[0],
        kept_contexts=kept[1],
    )
