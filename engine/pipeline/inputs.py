"""One set of input checks for every way into the engine, and the rules a call resolves to.

The in-process `Pruner`, the text-model client (`engine.remote.text_pruner`) and the text
model's own decoding (`engine.triton.wire.read_request`, on the server) check a call with
these functions, so the same bad input gets the same `InputError` and message wherever it
is sent. Torch-free.

The checks:
- the question is a non-empty str (not only whitespace) of valid Unicode (no lone
  surrogate: it cannot be encoded as UTF-8);
- passages are a str (one passage) or a sequence of str, each valid Unicode; an empty or
  whitespace-only passage is accepted and comes back with no sentences, no reranking score
  (None) and an empty pruned text: a retriever's empty chunk does not fail the call;
- at most `Limits.max_passages` passages and `Limits.max_chars` characters (code points
  of the question and every passage together) in one call;
- options: threshold, alpha and lexical_weight in [0, 1], title, windows and splitter from
  their lists, top_k a positive integer, passage_margin a finite number (negative: no gate).

`Rules`, at the end, is the one definition of the settings that decide what a call keeps.
A family gives the defaults (`Family.rules`), an export's manifest may
override them (its `defaults`, engine.pipeline.spec), and a call may override those
(`CallOptions`): `Rules.resolve` gives the rules one call runs with, computed
once and carried with the call (engine.pruner's `Call`). The names are the same on every
surface: the Python keywords, `prune run`'s flags, `/v1/prune`'s fields, the manifest's
`defaults`, `/info`'s `rules` and `defaults`, the text model's inputs.

The threshold comes in a pair, because the in-passage lexical fusion (engine.pipeline.decide) makes
another score with a threshold of its own: `threshold` applies to the model's scores alone,
`lexical_threshold` (when not None) to the fused ones. A call's resolved rules hold the one
threshold it runs with in `threshold` (and `lexical_threshold` None): the threshold its
results report.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from engine.errors import InputError
from engine.settings import DEFAULTS, setting

TITLE_RULES = ("first_sentence", "none")
WINDOWS = ("reference", "sentences")
SPLITTERS = ("engine", "reference")


def token_windows(windows: str, window_tokens: int) -> bool:
    """Whether `windows` means token windows, decided per window, for a family whose own code
    cuts windows of `window_tokens` (0: its code cuts at sentences, and both values mean that)."""
    return windows == "reference" and window_tokens > 0


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
    # (engine.pipeline.decide).
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


KEEP_RULES = ("gt", "ge")

#: what an export records in its manifest's `defaults` (a call's own: top_k, reorder)
RECORDED = (
    "threshold",
    "keep_rule",
    "title",
    "alpha",
    "windows",
    "lexical_weight",
    "lexical_threshold",
    "passage_margin",
)


@dataclass(frozen=True)
class Rules:
    """The decision settings (engine.pipeline.decide's rules): a family's defaults, or one call's."""

    threshold: float  # keep a sentence whose probability passes this
    keep_rule: str = "gt"  # "gt": probability > threshold; "ge": >=
    title: str = "none"  # "first_sentence": the first sentence is a title
    alpha: float | None = None  # backoff: keep the best sentence when it reaches this; None: off
    windows: str = "sentences"  # how a long passage is cut (WINDOWS)
    splitter: str = "engine"  # who cuts passages into sentences (engine.pipeline.text)
    lexical_weight: float = 0.0  # the lexical score's share in the fused scores (0: the model alone)
    lexical_threshold: float | None = None  # the threshold when lexical_weight > 0; None: `threshold`
    passage_margin: float | None = None  # the passage gate's margin below the call's best; None: no gate
    top_k: int | None = None  # keep the k best passages by reranking score
    reorder: bool = False  # return the passages best first
    budget_tokens: int | None = None  # a call's: keep within this many tokens (engine.pipeline.budget)
    budget_tokenizer: str | None = None  # what counts them; None: the model's own tokenizer
    compress_rate: float | None = None  # a call's: LLMLingua-2 over what it keeps (token_compress.py)
    compress_target_token: int | None = None  # a call's: LLMLingua-2 to about this many tokens

    @property
    def compresses(self) -> bool:
        """Whether the call compresses what it keeps (compress_rate < 1 or compress_target_token)."""
        return self.compress_target_token is not None or (
            self.compress_rate is not None and self.compress_rate < 1
        )

    def __post_init__(self) -> None:
        """Each value checked as a call's option is (the checks above: InputError, a ValueError)."""
        for name in ("threshold", "lexical_weight", "lexical_threshold", "alpha"):
            if getattr(self, name) is not None:
                check_threshold(getattr(self, name), name)
        check_passage_margin(self.passage_margin)
        if self.keep_rule not in KEEP_RULES:
            raise ValueError(f"keep_rule must be one of {KEEP_RULES}, got {self.keep_rule!r}")
        check_windows(self.windows)
        check_splitter(self.splitter)
        check_title(self.title)
        check_top_k(self.top_k)

    def threshold_at(self, lexical_weight: float) -> float:
        """The keep threshold of a call that sets no threshold, at `lexical_weight`."""
        if lexical_weight and self.lexical_threshold is not None:
            return self.lexical_threshold
        return self.threshold

    def resolve(self, options: CallOptions) -> Rules:
        """The rules a call with `options` runs with: each option it sets over these
        (a negative alpha or passage_margin turns that rule off), its threshold the one it
        set or the one for its lexical weight."""
        given = _switched(options.given())
        rules = replace(self, **given)
        return replace(
            rules,
            threshold=given.get("threshold", self.threshold_at(rules.lexical_weight)),
            lexical_threshold=None,
        )

    def overridden(self, values: Mapping[str, Any]) -> Rules:
        """These rules with a manifest's `defaults` over them: the recorded names present
        (others are left alone), each checked (ValueError).
        A null alpha or passage_margin turns that rule off (a negative one too); any other
        null is the family's value (earlier exports wrote null for a value they left to it)."""
        changes = {k: v for k, v in values.items() if k in RECORDED}
        changes = {k: v for k, v in changes.items() if v is not None or k in SWITCHABLE}
        return replace(self, **_switched(changes))

    def recorded(self) -> dict[str, Any]:
        """What an export writes in its manifest's `defaults`."""
        return {name: getattr(self, name) for name in RECORDED}

    def to_dict(self) -> dict[str, Any]:
        """Every setting by name (what `/info`'s `rules` holds)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rules:
        """Rules from `to_dict`'s form (names it does not know are left out)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


#: the rules a negative value turns off (None in Rules: no backoff, no passage gate), each with
#: its check (the checks above: a negative number is the option's "off", written -1.0)
SWITCHABLE = {"alpha": check_alpha, "passage_margin": check_passage_margin}


def _switched(changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` with each SWITCHABLE value checked, and None for one turned off."""
    for name, check in SWITCHABLE.items():
        if changes.get(name) is not None:
            value = check(changes[name])
            changes[name] = None if value is None or value < 0 else float(value)
    return changes
