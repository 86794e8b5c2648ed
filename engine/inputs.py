"""One set of input rules for every way into the engine.

The in-process `Pruner`, the text-model client (`engine.triton.text_pruner`) and the text
model's own decoding (`engine.triton.wire.read_request`, on the server) check a call with
these functions, so the same bad input gets the same `InputError` and message wherever it
is sent. Torch-free.

The rules:
- the question is a non-empty str (not only whitespace) of valid Unicode (no lone
  surrogate: it cannot be encoded as UTF-8);
- passages are a str (one passage) or a sequence of str, each valid Unicode; an empty or
  whitespace-only passage is accepted and comes back with no sentences, no reranking score
  (None) and an empty pruned text: a retriever's empty chunk does not fail the call;
- at most `Limits.max_passages` passages and `Limits.max_chars` characters (code points
  of the question and every passage together) in one call;
- options: threshold, alpha and lexical_weight in [0, 1], title and windows from their
  lists, top_k a positive integer, passage_margin a finite number (negative: no gate).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import InputError
from engine.settings import DEFAULTS, setting

TITLE_RULES = ("first_sentence", "none")
WINDOWS = ("reference", "sentences")


@dataclass(frozen=True)
class Limits:
    """What one call may hold (docs/limits.md). A Triton text model has its own per-request
    limits; its client cuts a call into requests within them."""
    max_passages: int = DEFAULTS.max_passages
    max_chars: int = DEFAULTS.max_call_chars

    def to_dict(self) -> dict[str, int]:
        return {"max_passages": self.max_passages, "max_chars": self.max_chars}


def default_limits() -> Limits:
    """The call limits in force: PRUNE_MAX_PASSAGES and PRUNE_MAX_CALL_CHARS, else the defaults."""
    return Limits(max_passages=setting("max_passages"), max_chars=setting("max_call_chars"))


def check_unicode(text: str, what: str) -> None:
    """Refuse a lone surrogate (it cannot be encoded as UTF-8), naming where it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{what} is not valid Unicode: a lone surrogate {text[exc.start]!r} at character "
                         f"{exc.start}") from None


def check_question(question: Any) -> str:
    if not isinstance(question, str):
        raise InputError(f"question must be a str, got {type(question).__name__}")
    if not question.strip():
        raise InputError("question is empty")
    check_unicode(question, "the question")
    return question


def check_call(question: Any, passages: Any, limits: Limits = Limits()) -> tuple[str, list[str]]:
    """(question, passages as a list) of a valid call; InputError otherwise."""
    question = check_question(question)
    if isinstance(passages, str):
        passages = [passages]
    if not isinstance(passages, Sequence):
        raise InputError(f"passages must be a list of str, got {type(passages).__name__}")
    passages = list(passages)
    if len(passages) > limits.max_passages:
        raise InputError(f"{len(passages)} passages in one call; the limit is {limits.max_passages}")
    total = len(question)
    for i, p in enumerate(passages):
        if not isinstance(p, str):
            raise InputError(f"passage {i} must be a str, got {type(p).__name__}")
        total += len(p)
        if total > limits.max_chars:
            raise InputError(f"the call holds more than {limits.max_chars} characters (question and passages "
                             f"together, passed at passage {i}); split it into several calls")
        check_unicode(p, f"passage {i}")
    return question, passages


def check_threshold(value: Any, name: str = "threshold") -> float:
    # numbers.Real: int, float and numpy's scalars (np.float32 included)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise InputError(f"{name} must be a finite number in [0, 1], got {value!r}")
    if not 0.0 <= float(value) <= 1.0:
        raise InputError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


def check_top_k(top_k: Any) -> int | None:
    if top_k is None:
        return None
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
        raise InputError(f"top_k must be a positive integer, got {top_k!r}")
    return int(top_k)


def check_title(title: Any) -> str | None:
    if title is not None and title not in TITLE_RULES:
        raise InputError(f"title must be one of {TITLE_RULES}, got {title!r}")
    return title


def check_windows(windows: Any) -> str | None:
    if windows is not None and windows not in WINDOWS:
        raise InputError(f"windows must be one of {WINDOWS}, got {windows!r}")
    return windows


def check_alpha(alpha: Any) -> Any:
    """`...` (the family's default) and None (backoff off) pass; a number must be in [0, 1]."""
    return alpha if alpha is ... or alpha is None else check_threshold(alpha, "alpha")


def check_lexical_weight(weight: Any) -> float | None:
    """None (the family's default) passes; a number must be in [0, 1] (engine.lexical)."""
    return None if weight is None else check_threshold(weight, "lexical_weight")


def check_passage_margin(margin: Any) -> float | None:
    """None (the family's default) passes; a finite number: the passage gate's margin, a
    negative one turning the gate off (engine.decide.gate_passages)."""
    if margin is None:
        return None
    if isinstance(margin, bool) or not isinstance(margin, numbers.Real) or not math.isfinite(margin):
        raise InputError(f"passage_margin must be a finite number (negative: no passage gate), got {margin!r}")
    return float(margin)


def check_options(*, threshold: Any = None, title: Any = None, alpha: Any = ..., top_k: Any = None,
                  windows: Any = None, sentences: Any = None, n_passages: int = 0,
                  lexical_weight: Any = None, passage_margin: Any = None) -> dict[str, Any]:
    """The call's options, checked; None / `...` stay (the family's defaults)."""
    if sentences is not None:
        if not isinstance(sentences, Sequence) or len(sentences) != n_passages:
            raise InputError("sentences must hold one list of sentences per passage")
        for i, sent in enumerate(sentences):
            if isinstance(sent, str) or not isinstance(sent, Sequence):
                raise InputError(f"sentences[{i}] must be a list of sentences (str or (start, end)), "
                                 f"got {type(sent).__name__}")
    return {"threshold": None if threshold is None else check_threshold(threshold),
            "title": check_title(title), "alpha": check_alpha(alpha), "top_k": check_top_k(top_k),
            "windows": check_windows(windows), "lexical_weight": check_lexical_weight(lexical_weight),
            "passage_margin": check_passage_margin(passage_margin)}
