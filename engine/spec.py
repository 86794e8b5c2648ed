"""What the client must know about a model: family, window, special tokens, inputs.

An exported model folder carries it in `manifest.json`; a PyTorch checkpoint folder is
described by reading its config and tokenizer. Torch-free.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError
from engine.families import Family, get_family, with_threshold

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "prune-engine/1"
GRAPH_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "sentence_ids")
GRAPH_OUTPUTS = ("rerank_score", "sentence_probs")


@dataclass(frozen=True)
class ModelSpec:
    family: Family
    max_length: int
    cls_id: int
    sep_id: int
    pad_id: int
    name: str = "model"

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(n for n in GRAPH_INPUTS
                     if n != "token_type_ids" or self.family.uses_token_type_ids)

    def special_tokens(self) -> dict[str, int]:
        return {"cls_id": self.cls_id, "sep_id": self.sep_id, "pad_id": self.pad_id}


def special_ids(tokenizer: Any) -> dict[str, int]:
    """cls/sep/pad ids of a transformers tokenizer (RoBERTa's <s>/</s> count as cls/sep)."""
    cls_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep_id = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id
    if cls_id is None or sep_id is None or pad_id is None:
        raise ModelLoadError(f"tokenizer {type(tokenizer).__name__} lacks a cls/sep/pad token "
                             f"(cls={cls_id}, sep={sep_id}, pad={pad_id})")
    return {"cls_id": int(cls_id), "sep_id": int(sep_id), "pad_id": int(pad_id)}


def read_manifest(folder: str | Path) -> dict[str, Any]:
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.exists():
        raise ModelLoadError(f"{folder}: no such model folder")
    if not path.is_file():
        if (folder / "config.json").is_file():
            raise ModelLoadError(f"{folder} is a checkpoint, not an exported model (it has no {MANIFEST}): export "
                                 f"it first (prune export --model {folder} --out {folder.name}-onnx), or run it "
                                 "with PyTorch (--backend torch)")
        raise ModelLoadError(f"{folder}: no {MANIFEST}, so not an exported model; export a checkpoint into a "
                             "folder of its own first (prune export --model CHECKPOINT --out FOLDER)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path}: corrupted manifest ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ModelLoadError(f"{path}: not a {MANIFEST_FORMAT} manifest")
    for key in ("family", "max_length", "tokenizer", "graph"):
        if key not in manifest:
            raise ModelLoadError(f"{path}: manifest lacks {key!r}")
    return manifest


#: Bounds on a manifest's values (it may come from a server): a window past this, or a
#: bucket outside it, is refused before the client pads anything to it.
MAX_WINDOW = 32_768


def spec_from_manifest(manifest: dict[str, Any], name: str = "model") -> ModelSpec:
    try:
        tok = manifest["tokenizer"]
        defaults = manifest.get("defaults") or {}
        family = with_threshold(get_family(manifest["family"]), defaults.get("threshold"))  # the checkpoint's own
        if defaults.get("lexical_weight") is not None:
            family = replace(family, lexical_weight=float(defaults["lexical_weight"]))
        if defaults.get("lexical_threshold") is not None:
            family = replace(family, lexical_threshold=float(defaults["lexical_threshold"]))
        if "passage_margin" in defaults:      # null: no passage gate; absent: the family's
            margin = defaults["passage_margin"]
            family = replace(family, passage_margin=None if margin is None or margin < 0 else float(margin))
        if "seps_between" in tok and int(tok["seps_between"]) != family.seps_between:
            family = replace(family, seps_between=int(tok["seps_between"]))   # e.g. OpenProvence on ModernBERT
        spec = ModelSpec(family=family, max_length=int(manifest["max_length"]),
                         cls_id=int(tok["cls_id"]), sep_id=int(tok["sep_id"]), pad_id=int(tok["pad_id"]),
                         name=name)
        buckets = [int(b) for b in manifest.get("buckets", [])]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ModelLoadError(f"manifest is incomplete: {exc}") from exc
    if not 16 <= spec.max_length <= MAX_WINDOW:
        raise ModelLoadError(f"manifest max_length {spec.max_length} is outside 16..{MAX_WINDOW}")
    if min(spec.cls_id, spec.sep_id, spec.pad_id) < 0:
        raise ModelLoadError("manifest special token ids must be >= 0")
    if buckets and (buckets != sorted(set(buckets)) or buckets[0] < 1 or buckets[-1] > spec.max_length):
        raise ModelLoadError(f"manifest buckets {buckets[:6]}... are not increasing lengths within the window")
    return spec
