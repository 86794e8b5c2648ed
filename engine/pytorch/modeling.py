"""PyTorch modules for the four families, with the real checkpoints' state-dict names.

These are the fp32 reference: the torch backend runs them, the exporter traces them.
Every module has the engine's contract as its forward:

    forward(input_ids, attention_mask, sentence_ids, token_type_ids=None)
        -> rerank_score float32 [B], sentence_probs float32 [B, S]

with S = max(sentence_ids) + 1 and sentence_ids = -1 outside the context. Softmax and
the per-sentence mean always run in float32, whatever dtype the encoder runs in.

Loading never runs code from the model folder (no trust_remote_code): the family is
read from config.json and the weights from safetensors, or from a PyTorch pickle with
`torch.load(weights_only=True)`.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.errors import ModelLoadError
from engine.families import Family, detect_family, get_family, read_config

_CONFIG_ONLY_KEYS = {"model_type", "architectures", "auto_map", "transformers_version",
                     "_name_or_path", "torch_dtype", "dtype"}


def _sentence_onehot(sentence_ids: torch.Tensor) -> torch.Tensor:
    """[B, L] sentence ids (-1 outside the context) -> float32 one-hot [B, L, S].

    S is bounded by L in the graph itself (every sentence has at least one token), so a
    hostile id cannot make any target (CPU, CUDA, TensorRT) allocate more than B x L x L;
    ids >= L then match no column."""
    length = torch.ones_like(sentence_ids[0]).sum()          # L as a tensor: dynamic in the graph
    n_sent = torch.minimum((sentence_ids.max() + 1).clamp(min=0), length)
    idx = torch.arange(n_sent, device=sentence_ids.device, dtype=sentence_ids.dtype)
    return (sentence_ids.unsqueeze(-1) == idx.view(1, 1, -1)).to(torch.float32)


def pool_token_probs(token_logits: torch.Tensor, sentence_ids: torch.Tensor) -> torch.Tensor:
    """Mean keep probability of each sentence's tokens (softmax column 1), in float32."""
    keep = torch.softmax(token_logits.to(torch.float32), dim=-1)[..., 1]          # [B, L]
    onehot = _sentence_onehot(sentence_ids)                                       # [B, L, S]
    sums = torch.bmm(keep.unsqueeze(1), onehot).squeeze(1)                        # [B, S]
    counts = onehot.sum(dim=1)
    return sums / counts.clamp(min=1.0)


def pool_hidden(hidden: torch.Tensor, sentence_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean hidden state of each sentence's tokens, in float32: ([B, S, H], counts [B, S])."""
    onehot = _sentence_onehot(sentence_ids)
    sums = torch.bmm(onehot.transpose(1, 2), hidden.to(torch.float32))           # [B, S, H]
    counts = onehot.sum(dim=1)
    return sums / counts.clamp(min=1.0).unsqueeze(-1), counts


class ProvenceModel(nn.Module):
    """naver/provence-reranker-debertav3-v1: `deberta.*`, `pooler.dense.*`,
    `classifier.*` (rerank logit = column 0), `token_classifier.*` (Linear(h, 2))."""

    def __init__(self, config: Any):
        super().__init__()
        from transformers.models.deberta_v2.modeling_deberta_v2 import ContextPooler, DebertaV2Model
        self.config = config
        self.deberta = DebertaV2Model(config)
        self.pooler = ContextPooler(config)
        self.classifier = nn.Linear(self.pooler.output_dim, getattr(config, "num_labels", 1))
        self.token_classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, input_ids, attention_mask, sentence_ids, token_type_ids=None):
        hidden = self.deberta(input_ids=input_ids, attention_mask=attention_mask)[0]
        rerank = self.classifier(self.pooler(hidden))[:, 0].to(torch.float32)
        return rerank, pool_token_probs(self.token_classifier(hidden), sentence_ids)


class XProvenceModel(nn.Module):
    """naver/xprovence-reranker-bgem3: `roberta.*` (with pooler), `classifier.*` on the
    pooled output (rerank logit = column 0), `token_classifier.*` (Linear(h, 2))."""

    def __init__(self, config: Any):
        super().__init__()
        from transformers import XLMRobertaModel
        self.config = config
        self.roberta = XLMRobertaModel(config)
        self.classifier = nn.Linear(config.hidden_size, getattr(config, "num_labels", 1))
        self.token_classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, input_ids, attention_mask, sentence_ids, token_type_ids=None):
        out = self.roberta(input_ids=input_ids, attention_mask=attention_mask)
        rerank = self.classifier(out.pooler_output)[:, 0].to(torch.float32)
        return rerank, pool_token_probs(self.token_classifier(out.last_hidden_state), sentence_ids)


class _PruningHead(nn.Module):
    """OpenProvence's pruning head. With `use_weighted_pooling` checkpoints also carry
    `pooling_weights` (Linear(h, 1)); the original head creates it and its forward never
    uses it, so it is loaded (no tensor is unexpected) and, as there, not applied."""

    def __init__(self, hidden_size: int, num_labels: int = 2, weighted_pooling: bool = False):
        super().__init__()
        self.classifier = nn.Linear(hidden_size, num_labels)
        if weighted_pooling:
            self.pooling_weights = nn.Linear(hidden_size, 1)


OPEN_PROVENCE_BACKBONES = ("xlm-roberta", "roberta", "modernbert")


class OpenProvenceModel(nn.Module):
    """OpenProvence / zilliz semantic-highlight: `ranking_model.*` (a whole
    XLMRobertaForSequenceClassification or ModernBertForSequenceClassification, one label =
    rerank logit) and `pruning_head.classifier.*` (Linear(h, 2)). The encoder runs once
    for both heads.

    The pruning head reads the original code's `hidden_states[-1]`. For ModernBERT, under
    the transformers 4.x that the original code runs on, that is the last layer's output
    *before* ModernBERT's final LayerNorm (transformers 5 returns it after), so the state is
    taken at the final norm's input. Attention is eager (global and sliding-window masks),
    which exports to ONNX."""

    def __init__(self, base_config: Any, pruning_hidden: int | None = None, weighted_pooling: bool = False):
        super().__init__()
        from transformers import AutoModelForSequenceClassification
        if base_config.model_type not in OPEN_PROVENCE_BACKBONES:
            raise ModelLoadError(f"open_provence checkpoints on a {base_config.model_type!r} "
                                 f"backbone are not supported ({', '.join(OPEN_PROVENCE_BACKBONES)} are)")
        self.config = base_config
        self.ranking_model = AutoModelForSequenceClassification.from_config(base_config)
        self.pruning_head = _PruningHead(pruning_hidden or base_config.hidden_size, weighted_pooling=weighted_pooling)
        self.modernbert = base_config.model_type == "modernbert"
        if self.modernbert:
            self._pre_norm: list[torch.Tensor] = []
            self.ranking_model.model.final_norm.register_forward_pre_hook(
                lambda module, args: self._pre_norm.append(args[0]))

    def forward(self, input_ids, attention_mask, sentence_ids, token_type_ids=None):
        if self.modernbert:
            self._pre_norm.clear()
            rerank = self.ranking_model(input_ids=input_ids, attention_mask=attention_mask).logits
            hidden = self._pre_norm.pop()
            return rerank[:, 0].to(torch.float32), pool_token_probs(self.pruning_head.classifier(hidden), sentence_ids)
        hidden = self.ranking_model.base_model(input_ids=input_ids, attention_mask=attention_mask)[0]
        rerank = self.ranking_model.classifier(hidden)[:, 0].to(torch.float32)
        return rerank, pool_token_probs(self.pruning_head.classifier(hidden), sentence_ids)


class OpenSearchHighlighterModel(nn.Module):
    """opensearch-semantic-highlighter-v1: `bert.*` and `classifier.*` (Linear(h, 2))
    over mean-pooled sentence states. No rerank head: rerank_score is 0."""

    def __init__(self, config: Any, with_pooler: bool = False):
        super().__init__()
        from transformers import BertModel
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=with_pooler)
        self.classifier = nn.Linear(config.hidden_size, getattr(config, "num_labels", 2))

    def forward(self, input_ids, attention_mask, sentence_ids, token_type_ids=None):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                           token_type_ids=token_type_ids)[0]
        pooled, counts = pool_hidden(hidden, sentence_ids)
        logits = self.classifier(pooled.to(self.classifier.weight.dtype)).to(torch.float32)
        probs = torch.softmax(logits, dim=-1)[..., 1] * (counts > 0).to(torch.float32)
        rerank = torch.zeros(input_ids.shape[0], dtype=torch.float32, device=input_ids.device)
        return rerank, probs


EMBEDDING_MODES = ("isolated", "passage", "full")
#: Similarity -> probability: p = sigmoid(scale * (cosine - shift)). Monotonic, so any
#: cosine threshold t maps to the probability threshold sigmoid(scale * (t - shift)).
EMBEDDING_DEFAULTS = {"mode": "isolated", "scale": 8.0, "shift": 0.5, "rerank": "max"}
_ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert")


class EmbeddingHighlighterModel(nn.Module):
    """A sentence-embedding encoder (sentence-transformers layout: the backbone's own
    tensor names) scoring each sentence by its cosine with the question, in one pass.

    The block is `[CLS] q [SEP] [CLS] s0 [SEP] [CLS] s1 [SEP] ...`; `mode` sets what each
    token may attend to, through an additive attention mask built from `sentence_ids`:
      - "isolated": only its own segment, with positions restarting at 0 per segment:
        exactly the embedding each sentence (and the question) would get alone;
      - "passage": sentences see the whole passage (not the question), question alone;
      - "full": everything sees everything (one ordinary forward pass).
    Embeddings are mean-pooled (or CLS) per segment; sentence_probs =
    sigmoid(scale * (cos(q, s) - shift)); rerank_score = max over sentences of
    cos(q, s) ("max") or cos(q, mean of the context tokens) ("mean").
    """

    def __init__(self, config: Any, *, mode: str = "isolated", pooling: str = "mean",
                 scale: float = 8.0, shift: float = 0.5, rerank: str = "max"):
        super().__init__()
        from transformers import AutoModel
        if mode not in EMBEDDING_MODES:
            raise ModelLoadError(f"embedding mode must be one of {EMBEDDING_MODES}, got {mode!r}")
        if pooling not in ("mean", "cls"):
            raise ModelLoadError(f"embedding pooling {pooling!r} is not supported (mean, cls)")
        if rerank not in ("max", "mean"):
            raise ModelLoadError(f"embedding rerank must be max or mean, got {rerank!r}")
        self.config = config
        self.encoder = AutoModel.from_config(config)
        self.mode, self.pooling, self.scale, self.shift, self.rerank = mode, pooling, float(scale), float(shift), rerank
        self.position_offset = (int(config.pad_token_id) + 1) if config.model_type in _ROBERTA_LIKE else 0

    def forward(self, input_ids, attention_mask, sentence_ids, token_type_ids=None):
        bsz, length = input_ids.shape
        valid = attention_mask > 0
        ctx = sentence_ids >= 0
        question = valid & ~ctx
        key = torch.where(valid, sentence_ids, torch.full_like(sentence_ids, -2))
        same = key.unsqueeze(2) == key.unsqueeze(1)
        if self.mode == "isolated":
            allowed = same
        elif self.mode == "passage":
            allowed = same | (ctx.unsqueeze(2) & ctx.unsqueeze(1))
        else:
            allowed = same | (valid.unsqueeze(2) & valid.unsqueeze(1))
        neg = torch.finfo(torch.float32).min
        mask = torch.zeros(allowed.shape, dtype=torch.float32, device=input_ids.device)
        mask = mask.masked_fill(~allowed, neg).unsqueeze(1)                      # [B, 1, L, L]

        onehot = _sentence_onehot(sentence_ids)                                    # [B, L, S]
        steps = torch.arange(length, device=input_ids.device).unsqueeze(0).expand(bsz, length)
        starts = torch.argmax(onehot, dim=1)                                       # first token of each sentence
        if self.mode == "isolated":
            tok_start = torch.bmm(onehot, starts.to(torch.float32).unsqueeze(-1)).squeeze(-1)
            positions = steps - tok_start.to(steps.dtype)
        elif self.mode == "passage":
            first_ctx = torch.argmax(ctx.to(torch.int32), dim=1, keepdim=True)
            positions = torch.where(ctx, steps - first_ctx, steps)
        else:
            positions = steps
        positions = positions + self.position_offset
        hidden = self.encoder(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                              token_type_ids=torch.zeros_like(input_ids))[0].to(torch.float32)

        if self.pooling == "mean":
            sent, counts = pool_hidden(hidden, sentence_ids)
            qw = question.to(torch.float32)
            q = (hidden * qw.unsqueeze(-1)).sum(1) / qw.sum(1, keepdim=True).clamp(min=1.0)
        else:
            counts = onehot.sum(dim=1)
            sent = torch.gather(hidden, 1, starts.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
            q = hidden[:, 0]
        q = torch.nn.functional.normalize(q, dim=-1)
        sent = torch.nn.functional.normalize(sent, dim=-1)
        present = (counts > 0).to(torch.float32)
        cos = torch.bmm(sent, q.unsqueeze(-1)).squeeze(-1)                         # [B, S]
        probs = torch.sigmoid(self.scale * (cos - self.shift)) * present
        if self.rerank == "max":
            rerank = (cos * present + (present - 1.0) * 2.0).max(dim=1).values
        else:
            cw = ctx.to(torch.float32)
            passage = (hidden * cw.unsqueeze(-1)).sum(1) / cw.sum(1, keepdim=True).clamp(min=1.0)
            rerank = (torch.nn.functional.normalize(passage, dim=-1) * q).sum(-1)
        return rerank, probs


# --------------------------------------------------------------------------- loading

@dataclass
class LoadedCheckpoint:
    model: nn.Module
    family: Family
    folder: Path
    config: dict[str, Any]
    max_length: int               # the default window (what the published models were trained at)
    weights_sha256: str
    max_positions: int = 0        # the longest window the position embeddings allow (--max-length)


def resolve_checkpoint(name_or_path: str | Path) -> Path:
    """A local folder, or a hub id downloaded (config, weights, tokenizer files only)."""
    path = Path(name_or_path)
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{path} is a file; expected a checkpoint folder")
        return path
    text = str(name_or_path)
    if text.count("/") != 1 or text.startswith((".", "/")):
        raise ModelLoadError(f"{text}: no such folder (and not a hub id like 'org/name')")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(
            text, allow_patterns=["*.json", "*.safetensors", "*.bin", "*.model", "*.txt"]))
    except Exception as exc:  # offline, unknown repo, auth...
        raise ModelLoadError(f"{text}: not a local folder and the hub download failed: {exc}") from exc


def _weight_files(folder: Path) -> list[Path]:
    st = sorted(folder.glob("*.safetensors"))
    if st:
        return st
    bins = sorted(p for p in folder.glob("*.bin") if p.name.startswith("pytorch_model"))
    if bins:
        return bins
    raise ModelLoadError(f"{folder}: no weights (*.safetensors or pytorch_model*.bin)")


def weight_names(folder: Path) -> list[str]:
    names: list[str] = []
    for f in _weight_files(folder):
        if f.suffix == ".safetensors":
            from safetensors import safe_open
            try:
                with safe_open(str(f), framework="pt") as fh:
                    names.extend(fh.keys())
            except Exception as exc:
                raise ModelLoadError(f"{f}: unreadable safetensors file ({exc})") from exc
        else:   # a PyTorch pickle: names only, never code (weights_only), memory-mapped
            try:
                names.extend(torch.load(str(f), map_location="cpu", weights_only=True, mmap=True).keys())
            except Exception as exc:
                raise ModelLoadError(f"{f}: cannot read weights ({type(exc).__name__}: {exc})") from exc
    return names


def load_state_dict(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """All tensors of a checkpoint, and a sha256 over the weight files."""
    state: dict[str, torch.Tensor] = {}
    digest = hashlib.sha256()
    for f in _weight_files(folder):
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                digest.update(chunk)
        try:
            if f.suffix == ".safetensors":
                from safetensors.torch import load_file
                state.update(load_file(str(f)))
            else:
                state.update(torch.load(str(f), map_location="cpu", weights_only=True))
        except Exception as exc:
            raise ModelLoadError(f"{f}: cannot read weights ({type(exc).__name__}: {exc})") from exc
    return state, digest.hexdigest()


def _backbone_config(kind: str, raw: dict[str, Any], attn: str):
    from transformers import AutoConfig
    cfg = AutoConfig.for_model(kind, **{k: v for k, v in raw.items() if k not in _CONFIG_ONLY_KEYS})
    cfg._attn_implementation = attn
    return cfg


def _embedding_pooling(folder: Path | None) -> str:
    """sentence-transformers' pooling mode from 1_Pooling/config.json (mean if absent)."""
    if folder is None:
        return "mean"
    for cfg in sorted(folder.glob("*Pooling*/config.json")):
        conf = json.loads(cfg.read_text())
        if conf.get("pooling_mode_cls_token"):
            return "cls"
        if conf.get("pooling_mode_mean_tokens", True):
            return "mean"
        raise ModelLoadError(f"{cfg}: only mean or CLS pooling is supported")
    return "mean"


def build_model(family: Family, raw: dict[str, Any], state_names: set[str], attn: str = "eager",
                options: dict[str, Any] | None = None, folder: Path | None = None) -> nn.Module:
    options = options or {}
    if family.name == "embedding":
        kind = raw.get("model_type")
        if not kind:
            raise ModelLoadError("config.json has no model_type for the embedding encoder")
        opts = {**EMBEDDING_DEFAULTS, **{k: v for k, v in options.items() if v is not None}}
        return EmbeddingHighlighterModel(_backbone_config(kind, raw, attn), mode=opts["mode"],
                                         pooling=opts.get("pooling") or _embedding_pooling(folder),
                                         scale=opts["scale"], shift=opts["shift"], rerank=opts["rerank"])
    if family.name == "provence":
        return ProvenceModel(_backbone_config("deberta-v2", raw, attn))
    if family.name == "xprovence":
        return XProvenceModel(_backbone_config("xlm-roberta", raw, attn))
    if family.name == "opensearch":
        with_pooler = any(n.startswith("bert.pooler.") for n in state_names)
        return OpenSearchHighlighterModel(_backbone_config("bert", raw, attn), with_pooler)
    if family.name == "open_provence":
        base = dict(raw.get("base_model_config") or {})
        if not base:
            raise ModelLoadError("open_provence config.json has no base_model_config")
        kind = base.get("model_type", "xlm-roberta")
        base.setdefault("num_labels", 1)
        cfg = _backbone_config(kind, base, attn)
        cfg.model_type = kind
        pruning = raw.get("pruning_config") or {}
        weighted = bool(pruning.get("use_weighted_pooling")) or "pruning_head.pooling_weights.weight" in state_names
        return OpenProvenceModel(cfg, pruning.get("hidden_size"), weighted_pooling=weighted)
    raise ModelLoadError(f"no PyTorch module for family {family.name!r}")


def _remap_keys(family: Family, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if family.name == "embedding":
        # sentence-transformers stores the bare backbone (sometimes under a model prefix)
        prefixes = {k.split(".", 1)[0] for k in state}
        strip = next((p + "." for p in ("bert", "roberta", "model") if prefixes == {p}), "")
        return {"encoder." + k.removeprefix(strip): v for k, v in state.items()}
    if family.name == "open_provence" and not any(k.startswith("ranking_model.") for k in state):
        # Older OpenProvence checkpoints store the backbone without the prefix.
        return {(k if k.startswith("pruning_head.") else "ranking_model." + k): v
                for k, v in state.items()}
    return state


def _open_provence_offset(raw: dict[str, Any]) -> int:
    """Positions XLM-R reserves before the first token (ModernBERT's rotary ones: none)."""
    return 0 if (raw.get("base_model_config") or {}).get("model_type") == "modernbert" else 2


def checkpoint_positions(family: Family, raw: dict[str, Any]) -> int:
    """The longest window the checkpoint's position embeddings allow."""
    if family.name == "open_provence":
        base = raw.get("base_model_config") or {}
        return int(base.get("max_position_embeddings", 514)) - _open_provence_offset(raw)
    positions = int(raw.get("max_position_embeddings", 512))
    return positions - 2 if family.backbone == "xlm-roberta" else positions


def checkpoint_max_length(family: Family, raw: dict[str, Any]) -> int:
    if family.name == "open_provence":
        base = raw.get("base_model_config") or {}
        positions = int(base.get("max_position_embeddings", 514)) - _open_provence_offset(raw)
        return min(int(raw.get("max_length") or min(positions, 512)), positions)
    positions = int(raw.get("max_position_embeddings", 512))
    if family.backbone == "xlm-roberta":
        positions -= 2  # positions start after padding_idx + 1
    # The published models were trained at 512 (XProvence's card says 8192, but it was
    # trained at 512): a longer window is an explicit --max-length choice.
    return min(positions, 512)


def load_checkpoint(name_or_path: str | Path, family: str | None = None,
                    attn: str = "eager", options: dict[str, Any] | None = None) -> LoadedCheckpoint:
    """Load a checkpoint of any family into its reference module, strictly: a missing or
    unexpected tensor is an error naming them."""
    folder = resolve_checkpoint(name_or_path)
    raw = read_config(folder)
    names = weight_names(folder)
    fam = get_family(family) if family else detect_family(raw, names, folder)
    state, sha = load_state_dict(folder)
    state = _remap_keys(fam, state)
    def build(device: str) -> nn.Module:
        try:
            with torch.device(device):
                return build_model(fam, raw, set(state), attn, options, folder)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"{folder}: config.json does not build a {fam.name} model "
                                 f"({type(exc).__name__}: {exc})") from exc

    # The config's sizes are checked against the weights on a "meta" model first (no
    # memory): a small checkpoint with a huge config.json fails here, before allocation.
    expected = build("meta").state_dict()
    # Non-persistent or derived buffers that some checkpoints carry and some do not.
    optional = {k for k in expected if k.endswith(("position_ids", "token_type_ids"))}
    if fam.name == "embedding":  # an embedding checkpoint may omit the unused BERT pooler
        optional |= {k for k in expected if k.startswith("encoder.pooler.")}
    missing = sorted(set(expected) - set(state) - optional)
    unexpected = sorted(k for k in set(state) - set(expected) if not k.endswith("position_ids"))
    if missing or unexpected:
        raise ModelLoadError(
            f"{folder}: weights do not match the {fam.name} layout: "
            f"missing {missing[:8]}{'...' if len(missing) > 8 else ''} ({len(missing)}), "
            f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''} ({len(unexpected)})")
    bad_shape = [k for k in state if k in expected and state[k].shape != expected[k].shape]
    if bad_shape:
        k = bad_shape[0]
        raise ModelLoadError(f"{folder}: tensor {k} has shape {tuple(state[k].shape)}, the config "
                             f"implies {tuple(expected[k].shape)}")
    model = build("cpu")
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    model.eval().to(torch.float32)
    from engine.families import checkpoint_family
    return LoadedCheckpoint(model=model, family=checkpoint_family(fam, raw), folder=folder, config=raw,
                            max_length=checkpoint_max_length(fam, raw), weights_sha256=sha,
                            max_positions=checkpoint_positions(fam, raw))


def save_checkpoint(model: nn.Module, folder: Path, config: dict[str, Any]) -> None:
    """Write config.json and model.safetensors (used by the test-checkpoint maker)."""
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k.removeprefix("encoder.") if isinstance(model, EmbeddingHighlighterModel) else k:
             v.contiguous() for k, v in model.state_dict().items()
             if not k.endswith(("position_ids", "embeddings.token_type_ids"))}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
