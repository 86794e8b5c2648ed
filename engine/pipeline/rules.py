"""The decision rules: the one definition of the settings that decide what a call keeps.

A family gives the defaults (`Family.rules`, engine.pipeline.families), an export's manifest may
override them (its `defaults`, engine.pipeline.spec), and a call may override those
(engine.pipeline.inputs.CallOptions): `Rules.resolve` gives the rules one call runs with, computed
once and carried with the call (engine.pruner's `Call`). The names are the same on every
surface: the Python keywords, `prune run`'s flags, `/v1/prune`'s fields, the manifest's
`defaults`, `/info`'s `rules` and `defaults`, the text model's inputs.

The threshold comes in a pair, because the in-passage lexical fusion (engine.pipeline.lexical) makes
another score with a threshold of its own: `threshold` applies to the model's scores alone,
`lexical_threshold` (when not None) to the fused ones. A call's resolved rules hold the one
threshold it runs with in `threshold` (and `lexical_threshold` None): the threshold its
results report. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from engine.pipeline.inputs import (
    CallOptions,
    check_alpha,
    check_passage_margin,
    check_threshold,
    check_title,
    check_top_k,
    check_splitter,
    check_windows,
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
    windows: str = "sentences"  # how a long passage is cut (engine.pipeline.inputs.WINDOWS)
    splitter: str = "engine"  # who cuts passages into sentences (engine.pipeline.splitters)
    lexical_weight: float = 0.0  # the lexical score's share in the fused scores (0: the model alone)
    lexical_threshold: float | None = None  # the threshold when lexical_weight > 0; None: `threshold`
    passage_margin: float | None = None  # the passage gate's margin below the call's best; None: no gate
    top_k: int | None = None  # keep the k best passages by reranking score
    reorder: bool = False  # return the passages best first
    budget_tokens: int | None = None  # a call's: keep within this many tokens (engine.pipeline.budget)
    budget_tokenizer: str | None = None  # what counts them; None: the model's own tokenizer

    def __post_init__(self) -> None:
        """Each value checked as a call's option is (engine.pipeline.inputs: InputError, a ValueError)."""
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
#: its check (engine.pipeline.inputs: a negative number is the option's "off", written -1.0)
SWITCHABLE = {"alpha": check_alpha, "passage_margin": check_passage_margin}


def _switched(changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` with each SWITCHABLE value checked, and None for one turned off."""
    for name, check in SWITCHABLE.items():
        if changes.get(name) is not None:
            value = check(changes[name])
            changes[name] = None if value is None or value < 0 else float(value)
    return changes
