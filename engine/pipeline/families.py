"""The model families the engine serves, and how to recognise them from a checkpoint.

Torch-free: the client, the exporter and the Triton tooling all read this module.
A family fixes the input template, how sentence scores are made (mean of token keep
probabilities, or a classifier over mean-pooled sentence states), the sentence decision
rule and its defaults. See docs/families.md for the sources.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError
from engine.pipeline.inputs import Rules


@dataclass(frozen=True)
class Family:
    """A model family: input template, sentence scoring, decision rule and defaults."""

    name: str
    backbone: str  # transformers model_type of the encoder
    sentence_pooling: str  # "token_probs": mean keep prob of tokens; "hidden": classifier on mean state
    has_rerank_head: bool
    uses_token_type_ids: bool
    seps_between: int  # separator tokens between question and context
    rules: Rules  # the decision rules' defaults (engine.pipeline.inputs)
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
    # Provence's heads and rule on XLM-RoBERTa (naver/xprovence-reranker-bgem3-v2, and v1: one
    # layout); the threshold is the training code's default, 0.1, as Provence's (the v2 card's
    # examples call process() with 0.3, or 0.7 to prune more: a call's threshold)
    "xprovence": replace(
        _PROVENCE,
        name="xprovence",
        backbone="xlm-roberta",
        description="naver/xprovence-reranker-bgem3-v2 (and v1): XLM-RoBERTa + rerank and token heads",
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
        # Fused half and half with the in-passage lexical score (engine.pipeline.decide), kept above
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
    # XProvence's hub code names its classes XProvence* (v1 XProvenceForSequenceClassification, v2
    # XProvence, both in modeling_xprovence_hf.py): any of them, or a model_type of that name
    if model_type == "xprovence" or any("xprovence" in a.lower() for a in archs):
        return FAMILIES["xprovence"]
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
