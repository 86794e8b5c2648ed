"""What a call returns: a `PruneResult` per passage, with its `Sentence`s, and its views
(highlights, tagged text, Milvus's fragments, JSON). Made by engine.pipeline.decide."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Sentence:
    """One sentence of a passage: text, character span, keep probability, decision."""

    text: str
    start: int
    end: int
    probability: float
    kept: bool


@dataclass
class PruneResult:
    """One passage's answer: its pruned text, sentences, reranking score and compression."""

    index: int  # position of the passage in the call's input
    context: str  # the passage, untouched
    pruned_context: str  # kept sentences in order, original text and separators
    reranking_score: float | None  # raw rerank logit (0.0 for families without a rerank head;
    # None for an empty passage, which is not run)
    sentences: list[Sentence]
    compression_rate: float  # share of characters removed, 0..1
    threshold: float
    blocks: int = 1  # model windows the passage needed
    windows: str = "sentences"  # how the passage was cut: "sentences" or "reference"
    # who cut it into sentences: "engine", "reference" (the family's own splitter), "caller" (sentences=)
    splitter: str = "engine"
    lexical_weight: float = 0.0  # the lexical score's share in the probabilities (engine.pipeline.decide)
    budget: Any = None  # engine.pipeline.budget.Budget when the call set budget_tokens
    # share of the passage's non-space characters the model does not see as written ([UNK], dropped,
    # a mark stripped; engine.pipeline.encode); None: not measured (a Triton text model's client)
    unknown_share: float | None = None
    # the kept text compressed by the token compressor (engine.pipeline.token_compress), when the
    # call set compress_rate or compress_target_token: its text, and its words as passage spans
    compressed_context: str | None = None
    compressed_spans: list[tuple[int, int]] | None = None

    @property
    def highlights(self) -> list[dict[str, Any]]:
        """Kept sentences as OpenSearch-style `{text, start, end, probability}` spans."""
        return [
            {"text": s.text, "start": s.start, "end": s.end, "probability": s.probability}
            for s in self.sentences
            if s.kept
        ]

    def highlight(self, pre: str | Sequence[str] = "<em>", post: str | Sequence[str] = "</em>") -> str:
        """The passage with every kept sentence wrapped in `pre` ... `post`; lists of tags
        rotate by match (the k-th kept sentence takes pre[k % len(pre)], as Milvus's
        pre_tags and post_tags do)."""
        out, pos = [], 0
        for k, s in enumerate(s for s in self.sentences if s.kept):
            out += [self.context[pos : s.start], _tag(pre, k), self.context[s.start : s.end], _tag(post, k)]
            pos = s.end
        out.append(self.context[pos:])
        return "".join(out)

    def fragments(
        self, pre: str | Sequence[str] = "<em>", post: str | Sequence[str] = "</em>", whole: bool = False
    ) -> tuple[list[str], list[float]]:
        """Milvus's semantic-highlight fragments and their scores: each kept sentence tagged,
        with its probability; `whole`: one fragment, the passage as `highlight` tags it,
        scored by its best kept sentence. Nothing kept: no fragments."""
        kept = [s for s in self.sentences if s.kept]
        if not kept:
            return [], []
        if whole:
            return [self.highlight(pre, post)], [max(float(s.probability) for s in kept)]
        return (
            [_tag(pre, k) + self.context[s.start : s.end] + _tag(post, k) for k, s in enumerate(kept)],
            [float(s.probability) for s in kept],
        )

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready values (what `prune run --json` prints); `budget` and the
        compressed text only when the call had them, `unknown_share` only where it was measured."""
        out = asdict(self)
        for name in ("budget", "unknown_share", "compressed_context", "compressed_spans"):
            if out[name] is None:
                del out[name]
        return out


def _tag(tags: str | Sequence[str], k: int) -> str:
    """The tag of the k-th match: `tags` itself, or its items in rotation."""
    return tags if isinstance(tags, str) else tags[k % len(tags)]
