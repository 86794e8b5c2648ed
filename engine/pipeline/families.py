"""The model families the engine serves, and how to recognise them from a checkpoint.

Torch-free: the client, the exporter and the Triton tooling all read this module.
A family fixes the input template, how sentence scores are made (mean of token keep
probabilities, or a classifier over mean-pooled sentence states), the sentence decision
rule and its defaults. See docs/families.md for the sources.

`Rules`, beside them, is the one definition of the settings that decide what a call keeps.
A family gives the defaults (`Family.rules`), an export's manifest may
override them (its `defaults`, engine.pipeline.spec), and a call may override those
(engine.pipeline.inputs.CallOptions): `Rules.resolve` gives the rules one call runs with, computed
once and carried with the call (engine.pruner's `Call`). The names are the same on every
surface: the Python keywords, `prune run`'s flags, `/v1/prune`'s fields, the manifest's
`defaults`, `/info`'s `rules` and `defaults`, the text model's inputs.

The threshold comes in a pair, because the in-passage lexical fusion (engine.pipeline.lexical) makes
another score with a threshold of its own: `threshold` applies to the model's scores alone,
`lexical_threshold` (when not None) to the fused ones. A call's resolved rules hold the one
threshold it runs with in `threshold` (and `lexical_threshold` None): the threshold its
results report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError
from engine.pipeline.inputs import (
    CallOptions,
    check_alpha,
    check_passage_margin,
    check_splitter,
    check_threshold,
    check_title,
    check_top_k,
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
    splitter: str = "engine"  # who cuts passages into sentences (engine.pipeline.text)
    lexical_weight: float = 0.0  # the lexical score's share in the fused scores (0: the model alone)
    lexical_threshold: float | None = None  # the threshold when lexical_weight > 0; None: `threshold`
    passage_margin: float | None = None  # the passage gate's margin below the call's best; None: no gate
    top_k: int | None = None  # keep the k best passages by reranking score
    reorder: bool = False  # return the passages best first
    budget_tokens: int | None = None  # a call's: keep within this many tokens (engine.pipeline.budget)
    budget_tokenizer: str | None = None  # what counts them; None: the model's own tokenizer
    compress_rate: float | None = None  # a call's: LLMLingua-2 over what it keeps (engine.pipeline.squeeze)
    compress_target_token: int | None = None  # a call's: LLMLingua-2 to about this many tokens

    @property
    def compresses(self) -> bool:
        """Whether the call compresses what it keeps (compress_rate < 1 or compress_target_token)."""
        return self.compress_target_token is not None or (
            self.compress_rate is not None and self.compress_rate < 1
        )

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


@dataclass(frozen=True)
class Family:
    """A model family: input template, sentence scoring, decision rule and defaults."""

    name: str
    backbone: str  # transformers model_type of the encoder
    sentence_pooling: str  # "token_probs": mean keep prob of tokens; "hidden": classifier on mean state
    has_rerank_head: bool
    uses_token_type_ids: bool
    seps_between: int  # separator tokens between question and context
    rules: Rules  # the decision rules' defaults (engine.pipeline.families)
    description: str
    sentence_specials: bool = False  # each sentence wrapped in its own [CLS] ... [SEP]
    rerank_merge: str = "first"  # passage score from the "first" block, or the "max" over blocks
    rerank_transform: str = "logit"  # the score as the head gives it, or its "sigmoid"
    zero_rerank_when_empty: bool = False  # a passage with nothing kept scores 0.0
    # How a passage longer than the window is cut (`rules.windows`): "sentences", blocks of
    # whole sentences, one decision per passage; "reference", as the family's own code.
    # Families whose code cuts at sentences have window_tokens 0 and both values mean the
    # same; the OpenSearch pipeline runs token windows of `window_tokens` (special tokens
    # included) overlapping by `window_stride`, decides per window (threshold and backoff)
    # and keeps the union.
    window_tokens: int = 0
    window_stride: int = 0
    # With windows="reference", a sentence longer than max_length // fragment_divisor tokens
    # (at least 16) is cut into fragments of that many tokens whose probabilities are
    # averaged without weights, as OpenProvence's process() does; 0: the engine's way (a
    # long sentence fills blocks, its pieces merged weighted by their token counts).
    fragment_divisor: int = 0
    # The tokenizer this family's published checkpoints use, named when a checkpoint's own
    # is missing or degenerate (prune export --tokenizer).
    usual_tokenizer: str = ""
    # What the reranking score is, which fixes what the HTTP API's `score` and
    # `relevance_score` mean (rank_score): "logit", the rerank head's logit; "probability",
    # already its sigmoid; "cosine", a cosine in [-1, 1]; "none", no rerank head (0.0).
    score_kind: str = "logit"
    # What `splitter="reference"` runs (engine.pipeline.text): "punkt", NLTK's English punkt
    # as nltk.sent_tokenize; "open_provence", OpenProvence's process() splitter (fast-bunkai for
    # text with kana, else its English punkt blocks); "spacy_xx", spaCy's xx_sent_ud_sm (not run
    # by the engine: refused); "none", no code of the family's own that splits (refused).
    reference_splitter: str = "punkt"

    def rank_score(self, reranking_score: float | None, raw: bool = False) -> float:
        """The passage's ranking score as the HTTP API reports it: in [0, 1] (`raw=False`:
        a logit's sigmoid, a probability as it is, a cosine mapped as (1 + c) / 2) or on the
        model's own scale (`raw=True`: the logit, a probability's logit, the cosine).
        Sorting by it gives the engine's reranking order. A passage that was not run (None:
        no text) ranks last: 0.0, or a very low logit on a logit scale."""
        kind = self.score_kind
        if reranking_score is None:
            return -1e9 if raw and kind in ("logit", "probability") else 0.0
        s = float(reranking_score)
        if kind == "logit":
            return s if raw else 1.0 / (1.0 + math.exp(-s))
        if kind == "probability":
            if not raw:
                return s
            p = min(max(s, 1e-12), 1 - 1e-12)
            return math.log(p / (1 - p))
        if kind == "cosine":
            return s if raw else (1.0 + s) / 2.0
        return s

    def token_windows(self, windows: str) -> bool:
        """Whether `windows` means token windows for this family (decided per window)."""
        return windows == "reference" and self.window_tokens > 0

    def to_dict(self) -> dict[str, Any]:
        """Every field, as JSON-ready values."""
        return asdict(self)


_PROVENCE = Family(
    name="provence",
    backbone="deberta-v2",
    sentence_pooling="token_probs",
    has_rerank_head=True,
    uses_token_type_ids=False,
    seps_between=1,
    rules=Rules(threshold=0.1, keep_rule="gt", title="first_sentence"),
    description="naver/provence-reranker-debertav3-v1: DeBERTa-v3 + rerank and token heads",
    usual_tokenizer="naver/provence-reranker-debertav3-v1 (DeBERTa-v3's, microsoft/deberta-v3-large)",
)

FAMILIES: dict[str, Family] = {
    "provence": _PROVENCE,
    # Provence's heads and rules on XLM-RoBERTa
    "xprovence": replace(
        _PROVENCE,
        name="xprovence",
        backbone="xlm-roberta",
        description="naver/xprovence-reranker-bgem3: XLM-RoBERTa + rerank and token heads",
        usual_tokenizer="BAAI/bge-reranker-v2-m3 (XLM-RoBERTa's)",
        reference_splitter="spacy_xx",
    ),
    "open_provence": Family(
        name="open_provence",
        backbone="xlm-roberta",
        sentence_pooling="token_probs",
        has_rerank_head=True,
        uses_token_type_ids=False,
        seps_between=2,
        # as OpenProvenceModel.process(): the config's `default_threadshold` (sic) or 0.1; the
        # reranking score is the sigmoid of the logit, the best over the passage's blocks,
        # and 0.0 when no sentence is kept
        rules=Rules(threshold=0.1, keep_rule="gt", windows="reference"),
        description="zilliz/semantic-highlight-bilingual-v1 and OpenProvence checkpoints",
        rerank_merge="max",
        rerank_transform="sigmoid",
        zero_rerank_when_empty=True,
        score_kind="probability",
        fragment_divisor=2,
        usual_tokenizer="the base model's (BAAI/bge-m3 for zilliz/semantic-highlight-bilingual-v1)",
        reference_splitter="open_provence",
    ),
    "opensearch": Family(
        name="opensearch",
        backbone="bert",
        sentence_pooling="hidden",
        has_rerank_head=False,
        uses_token_type_ids=True,
        seps_between=1,
        rules=Rules(threshold=0.5, keep_rule="ge", alpha=0.05, windows="reference"),
        description="opensearch-project/opensearch-semantic-highlighter-v1: BERT sentence tagger",
        window_tokens=510,
        window_stride=128,
        score_kind="none",
        usual_tokenizer="bert-base-uncased",
    ),
    "embedding": Family(
        name="embedding",
        backbone="auto",
        sentence_pooling="embedding",
        # threshold 0.87 (cosine 0.74 with the default mapping) and keep-the-best backoff:
        # chosen on the first half of squad-dev-prune, F1 73.3 on the other half (docs/families.md).
        # Fused half and half with the in-passage lexical score (engine.pipeline.lexical), kept above
        # 0.83: chosen on squad-dev-prune and kept on coqa-dev's seven domains
        # (docs/quality.md); lexical_weight=0 turns it off. The passage gate's margin 0.1:
        # chosen on squad-dev-rag and a RAG-shaped coqa-dev (docs/quality.md), so that the
        # passages of a call that do not answer come back empty.
        has_rerank_head=True,
        uses_token_type_ids=False,
        seps_between=1,
        rules=Rules(
            threshold=0.87,
            keep_rule="gt",
            alpha=0.0,
            lexical_weight=0.5,
            lexical_threshold=0.83,
            passage_margin=0.1,
        ),
        description="any sentence-embedding encoder (e.g. all-MiniLM-L6-v2): cosine of "
        "question and sentence embeddings, mapped to a probability",
        sentence_specials=True,
        rerank_merge="max",
        score_kind="cosine",
        usual_tokenizer="the encoder's own (e.g. sentence-transformers/all-MiniLM-L6-v2)",
        reference_splitter="none",
    ),
}

# Names seen in config.json "architectures" of the real checkpoints.
_ARCHITECTURES = {
    "Provence": "provence",
    "XProvence": "xprovence",
    "XLMRobertaForCompressionAndRanking": "xprovence",
    "XProvenceForSequenceClassification": "xprovence",
    "DebertaV2ForCompressionAndRanking": "provence",
    "OpenProvenceModel": "open_provence",
    "OpenProvenceForPruning": "open_provence",
    "BertTaggerForSentenceExtractionWithBackoff": "opensearch",
}


def with_threshold(fam: Family, value: Any) -> Family:
    """The family with `value` as its default threshold when it is a number in [0, 1]
    (a checkpoint's own default); otherwise the family as it is."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
        return replace(fam, rules=replace(fam.rules, threshold=float(value)))
    return fam


def checkpoint_family(fam: Family, config: dict[str, Any]) -> Family:
    """The family with the defaults a checkpoint's config sets: OpenProvence configs carry
    `default_threadshold` (sic, as its code reads it) or `default_threshold`, and their
    backbone: on ModernBERT the template is `[CLS] q [SEP] context [SEP]` (one separator,
    what its tokenizer builds), on XLM-R `<s> q </s></s> context </s>`."""
    if fam.name != "open_provence":
        return fam
    if (config.get("base_model_config") or {}).get("model_type") == "modernbert":
        fam = replace(fam, backbone="modernbert", seps_between=1)
    return with_threshold(
        fam,
        next(
            (config[k] for k in ("default_threadshold", "default_threshold") if config.get(k) is not None),
            None,
        ),
    )


def get_family(name: str) -> Family:
    """The family called `name`; ModelLoadError naming the known ones."""
    key = name.strip().lower().replace("-", "_")
    if key in ("zilliz", "openprovence"):
        key = "open_provence"
    if key not in FAMILIES:
        raise ModelLoadError(f"unknown family {name!r}; known families: {', '.join(FAMILIES)}")
    return FAMILIES[key]


def read_config(folder: str | Path) -> dict[str, Any]:
    """A checkpoint folder's config.json; ModelLoadError when it is missing or broken."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder}: no config.json (is this a checkpoint folder?)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got a JSON {type(config).__name__}")
    return config


# Plain encoders without a task head: used as sentence-embedding models.
_ENCODER_ARCHITECTURES = {
    "BertModel",
    "RobertaModel",
    "XLMRobertaModel",
    "MPNetModel",
    "DistilBertModel",
    "DebertaV2Model",
    "ElectraModel",
    "NomicBertModel",
}


def detect_family(
    config: dict[str, Any], weight_names: list[str] | None = None, folder: str | Path | None = None
) -> Family:
    """Family of a checkpoint from its config.json (and, failing that, its tensor names)."""
    model_type = str(config.get("model_type", "")).lower()
    archs = [str(a) for a in (config.get("architectures") or [])]
    if model_type == "open_provence" or "pruning_config" in config:
        return FAMILIES["open_provence"]
    for arch in archs:
        if arch in _ARCHITECTURES:
            return FAMILIES[_ARCHITECTURES[arch]]
    if model_type == "provence":
        return FAMILIES["provence"]
    if any(a in _ENCODER_ARCHITECTURES for a in archs) or (
        folder is not None and (Path(folder) / "modules.json").is_file()
    ):
        return FAMILIES["embedding"]
    if weight_names:
        names = set(weight_names)

        def has(prefix: str) -> bool:
            return any(n.startswith(prefix) for n in names)

        if has("pruning_head."):
            return FAMILIES["open_provence"]
        if has("token_classifier.") and has("deberta."):
            return FAMILIES["provence"]
        if has("token_classifier.") and has("roberta."):
            return FAMILIES["xprovence"]
        if has("bert.") and "classifier.weight" in names and not has("token_classifier."):
            return FAMILIES["opensearch"]
    raise ModelLoadError(
        "cannot tell the model family: config.json has model_type="
        f"{config.get('model_type')!r}, architectures={archs!r}"
        + (f", tensors like {sorted(weight_names)[:4]!r}" if weight_names else "")
        + f". Known families: {', '.join(FAMILIES)}; pass --family to choose one."
    )
