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
- options: threshold, alpha and lexical_weight in [0, 1], title, windows and splitter from
  their lists, top_k a positive integer, passage_margin a finite number (negative: no gate).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import numpy as np

from engine.errors import InputError
from engine.settings import DEFAULTS, setting

TITLE_RULES = ("first_sentence", "none")
WINDOWS = ("reference", "sentences")
SPLITTERS = ("engine", "reference")


@dataclass(frozen=True)
class Limits:
    """What one call may hold (docs/limits.md). A Triton text model has its own per-request
    limits; its client cuts a call into requests within them."""

    max_passages: int = DEFAULTS.max_passages
    max_chars: int = DEFAULTS.max_call_chars

    def to_dict(self) -> dict[str, int]:
        """The limits by name."""
        return {"max_passages": self.max_passages, "max_chars": self.max_chars}

    def check_count(self, count: int, what: str = "passages in one call") -> None:
        """InputError unless `count` items (passages of a call, documents or texts of a
        request) are within `max_passages`: the one check of that limit."""
        if count > self.max_passages:
            raise InputError(f"{count} {what}; the limit is {self.max_passages}")


def default_limits() -> Limits:
    """The call limits in force: PRUNE_MAX_PASSAGES and PRUNE_MAX_CALL_CHARS, else the defaults."""
    return Limits(max_passages=setting("max_passages"), max_chars=setting("max_call_chars"))


def check_unicode(text: str, what: str) -> None:
    """Refuse a lone surrogate (it cannot be encoded as UTF-8), naming where it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(
            f"{what} is not valid Unicode: a lone surrogate {text[exc.start]!r} at character {exc.start}"
        ) from None


def check_question(question: Any) -> str:
    """The question, checked: a non-empty str."""
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
    limits.check_count(len(passages))
    total = len(question)
    for i, p in enumerate(passages):
        if not isinstance(p, str):
            raise InputError(f"passage {i} must be a str, got {type(p).__name__}")
        total += len(p)
        if total > limits.max_chars:
            raise InputError(
                f"the call holds more than {limits.max_chars} characters (question and passages "
                f"together, passed at passage {i}); split it into several calls"
            )
        check_unicode(p, f"passage {i}")
    return question, passages


def check_threshold(value: Any, name: str = "threshold") -> float:
    # numbers.Real: int, float and numpy's scalars (np.float32 included)
    """A number in [0, 1]; InputError naming `name` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise InputError(f"{name} must be a finite number in [0, 1], got {value!r}")
    if not 0.0 <= float(value) <= 1.0:
        raise InputError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


def _positive_int(value: Any, name: str, unit: str = "") -> int | None:
    """None, or `value` as a positive int (InputError naming `name` otherwise)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InputError(f"{name} must be a positive integer{unit}, got {value!r}")
    return int(value)


def check_top_k(top_k: Any) -> int | None:
    """keep only the k best passages by reranking score, best first"""
    # checked: None or a positive int.
    return _positive_int(top_k, "top_k")


def check_title(title: Any) -> str | None:
    """first_sentence: the first sentence is a title, kept when it passes the threshold itself or
    when another sentence is kept; none: no title rule"""
    # checked: None or one of TITLE_RULES.
    if title is not None and title not in TITLE_RULES:
        raise InputError(f"title must be one of {TITLE_RULES}, got {title!r}")
    return title


def check_windows(windows: Any) -> str | None:
    """how a long passage is cut: reference, as the family's own code (OpenSearch's 510-token
    windows with a decision per window, OpenProvence's fragments); sentences, blocks of whole
    sentences with one decision per passage"""
    # checked: None or one of WINDOWS.
    if windows is not None and windows not in WINDOWS:
        raise InputError(f"windows must be one of {WINDOWS}, got {windows!r}")
    return windows


def check_splitter(splitter: Any) -> str | None:
    """who cuts a passage into sentences: engine, the engine's multilingual splitter; reference, the
    family's own code's (NLTK's English punkt; OpenProvence: fast-bunkai for Japanese text)"""
    # checked: None or one of SPLITTERS (engine.pipeline.text runs them).
    if splitter is not None and splitter not in SPLITTERS:
        raise InputError(f"splitter must be one of {SPLITTERS}, got {splitter!r}")
    return splitter


def check_alpha(alpha: Any) -> float | None:
    """backoff: when no sentence passes, keep the best one if its probability is at least alpha, in
    [0, 1]; negative: no backoff"""
    # checked: None (the family's default) passes; a number in [0, 1] is the backoff alpha; a
    # negative number turns the backoff off (-1.0)
    if alpha is None:
        return None
    if _off(alpha, "alpha", "no backoff"):
        return -1.0
    return check_threshold(alpha, "alpha")


def _off(value: Any, name: str, what: str) -> bool:
    """Whether a finite number is negative (the option's "off"); InputError for a non-number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise InputError(f"{name} must be a finite number (negative: {what}), got {value!r}")
    return value < 0


def check_lexical_weight(weight: Any) -> float | None:
    """the in-passage lexical score's share in the sentence and reranking scores, in [0, 1]; 0: the
    model alone"""
    # checked: None (the family's default) passes; a number must be in [0, 1]
    # (engine.pipeline.lexical).
    return None if weight is None else check_threshold(weight, "lexical_weight")


def check_passage_margin(margin: Any) -> float | None:
    """the passage gate: a passage whose reranking score is below the call's best minus this margin
    keeps nothing; negative: no gate"""
    # checked: None (the family's default) passes; a finite number: the passage gate's margin, a
    # negative one (-1.0) turning the gate off (engine.pipeline.decide.gate_passages).
    if margin is None:
        return None
    return -1.0 if _off(margin, "passage_margin", "no passage gate") else float(margin)


def check_reorder(reorder: Any) -> bool:
    """return the passages by reranking score, best first"""
    # checked: A bool.
    if not isinstance(reorder, (bool, np.bool_)):
        raise InputError(f"reorder must be true or false, got {reorder!r}")
    return bool(reorder)


def check_budget_tokens(value: Any) -> int | None:
    """keep the call's most probable kept sentences, across its passages, within this many tokens of
    the reader's tokenizer (after the threshold and the gate)"""
    # checked: None (no budget) passes; else a positive integer (a budget of 0 or less could keep
    # nothing: refused).
    return _positive_int(value, "budget_tokens", " (tokens)")


def check_budget_tokenizer(value: Any) -> str | None:
    """what budget_tokens counts: the model's own tokenizer (default), a tiktoken encoding
    (cl100k_base, o200k_base) or a tokenizer.json path"""
    # checked: None (the model's tokenizer) passes; else a non-empty name or path
    # (engine.pipeline.budget loads it when a call uses it).
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InputError(
            f"budget_tokenizer must be a tiktoken encoding's name or a tokenizer.json path, got {value!r}"
        )
    return value.strip()


def check_compress_rate(value: Any) -> float | None:
    """compress what the call keeps with the token compressor beside the pruner (LLMLingua-2): the
    share of its tokens to keep, in (0, 1]"""
    # checked: None (no compression) passes; else a number in (0, 1].
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise InputError(f"compress_rate must be a number in (0, 1], got {value!r}")
    return float(value)


def check_compress_target_token(value: Any) -> int | None:
    """compress what the call keeps with the token compressor beside the pruner to about this many
    tokens in all (tiktoken gpt-3.5-turbo's count, as LLMLingua-2's target_token); overrides
    compress_rate"""
    # checked: None (no target) passes; else a positive integer.
    return _positive_int(value, "compress_target_token", " (tokens)")


def _option(default: Any, check: Any) -> Any:
    """A CallOptions field: its default and its check, whose docstring says what the option
    means (the one text the CLI, the HTTP schema and the docs use)."""
    return field(default=default, metadata={"check": check, "help": " ".join(inspect.getdoc(check).split())})


def _threshold_or_none(value: Any) -> float | None:
    """keep a sentence whose probability passes this, in [0, 1]"""
    return None if value is None else check_threshold(value)


@dataclass(frozen=True)
class CallOptions:
    """The options of one `prune` call, the one definition every surface uses: the Python
    API's keywords, `prune run`'s flags, `/v1/prune`'s fields, the text model's inputs,
    batch-file fields and the adapters' fields are these names with these meanings.

    None is the model's default for each (its family's, or its manifest's); for `alpha` and
    `passage_margin` a negative number turns the rule off. Values are checked when the
    object is made (InputError, naming the option)."""

    threshold: float | None = _option(None, _threshold_or_none)
    title: str | None = _option(None, check_title)
    alpha: float | None = _option(None, check_alpha)
    top_k: int | None = _option(None, check_top_k)
    reorder: bool = _option(False, check_reorder)
    windows: str | None = _option(None, check_windows)
    splitter: str | None = _option(None, check_splitter)
    lexical_weight: float | None = _option(None, check_lexical_weight)
    passage_margin: float | None = _option(None, check_passage_margin)
    budget_tokens: int | None = _option(None, check_budget_tokens)
    budget_tokenizer: str | None = _option(None, check_budget_tokenizer)
    compress_rate: float | None = _option(None, check_compress_rate)
    compress_target_token: int | None = _option(None, check_compress_target_token)

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, f.metadata["check"](getattr(self, f.name)))

    @classmethod
    def of(cls, options: "CallOptions | None" = None, **changes: Any) -> "CallOptions":
        """`options` (or the defaults) with `changes` (option names), checked; an unknown
        name is an InputError that lists the known ones."""
        unknown = sorted(set(changes) - set(OPTION_NAMES))
        if unknown:
            raise InputError(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                f"the options are {', '.join(OPTION_NAMES)}"
            )
        return replace(options or cls(), **changes) if changes else (options or cls())

    @classmethod
    def of_attributes(cls, source: Any) -> "CallOptions":
        """The options `source` carries as attributes named as the options (a request body's
        fields, parsed command-line flags), checked: the one way a surface's request becomes
        a call's options. An absent or None attribute (a switch's False) is the model's default."""
        return cls.of(
            **{
                name: value
                for name in OPTION_NAMES
                if (value := getattr(source, name, None)) is not None and value is not False
            }
        )

    def given(self) -> dict[str, Any]:
        """The options set to something other than their default, by name (what a request
        carries: an absent option is the model's default)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}


#: the option names, in CallOptions' order
OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(CallOptions))


def option_help(name: str) -> str:
    """What option `name` means (the one text the CLI, the HTTP schema and the docs use)."""
    return next(f.metadata["help"] for f in fields(CallOptions) if f.name == name)


def option_type(name: str) -> type:
    """The Python type an option takes when set: float, int, bool or str."""
    f = next(f for f in fields(CallOptions) if f.name == name)
    return {
        "reorder": bool,
        "top_k": int,
        "title": str,
        "windows": str,
        "splitter": str,
        "budget_tokens": int,
        "budget_tokenizer": str,
        "compress_target_token": int,
    }.get(f.name, float)


def option_choices(name: str) -> tuple[str, ...] | None:
    """The values a text option takes (title, windows, splitter), None for the others."""
    return {"title": TITLE_RULES, "windows": WINDOWS, "splitter": SPLITTERS}.get(name)


def option_fields(rename: dict[str, str] | None = None) -> dict[str, tuple[Any, Any]]:
    """Every option as a pydantic field definition (`create_model`'s `(type, Field)`): its
    type (a Literal of its choices), None (reorder: false) the default, its help the
    description. `rename` gives an option a framework's own name (`{"top_k": "top_n"}`).
    The HTTP request model and the LangChain and LlamaIndex adapters are made of these."""
    from pydantic import Field

    out: dict[str, tuple[Any, Any]] = {}
    for name in OPTION_NAMES:
        choices = option_choices(name)
        kind = Literal[choices] if choices else option_type(name)  # type: ignore[valid-type]
        spec = (
            (bool, Field(False, description=option_help(name)))
            if name == "reorder"
            else (kind | None, Field(None, description=option_help(name)))
        )
        out[(rename or {}).get(name, name)] = spec
    return out


def unknown_name(name: str, known: Sequence[str], what: str = "field") -> str:
    """What a misspelt `name` is told: that it is unknown, the nearest of `known` if one is
    close ("did you mean threshold?"), else every known one."""
    import difflib

    near = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"unknown {what} {name!r}; " + (
        f"did you mean {near[0]!r}?" if near else f"the {what}s are {', '.join(known)}"
    )


def check_tags(pre: str | None, post: str | None, names: tuple[str, str] = ("pre", "post")) -> bool:
    """Whether a call asks for tagged text: both tags, or neither (False); one without the
    other is an InputError (a tag left open, or closing nothing, is never sent back)."""
    if (pre is None) != (post is None):
        given, missing = names if post is None else names[::-1]
        raise InputError(
            f"{given} without {missing}: tags come in pairs (give both {names[0]} and {names[1]})"
        )
    return pre is not None


def check_sentences(sentences: Any, n_passages: int) -> None:
    """The caller's own sentences: one list (of str or (start, end)) per passage."""
    if sentences is None:
        return
    if not isinstance(sentences, Sequence) or len(sentences) != n_passages:
        raise InputError("sentences must hold one list of sentences per passage")
    for i, sent in enumerate(sentences):
        if isinstance(sent, str) or not isinstance(sent, Sequence):
            raise InputError(
                f"sentences[{i}] must be a list of sentences (str or (start, end)), got {type(sent).__name__}"
            )
