"""Checkpoints for PyTorch: read a folder of any family into its module, strictly.

One module per family holds its PyTorch module and how a checkpoint becomes it
(engine/pytorch/<family>.py: `build`, and where the family needs them `remap`, `positions`,
`max_length`, `optional_keys`); this module reads folders and dispatches to them. The
modules are the fp32 reference: the torch backend runs them, the exporter traces them.

Loading never runs code from the model folder (no trust_remote_code): the family is
read from config.json and the weights from safetensors, or from a PyTorch pickle with
`torch.load(weights_only=True)`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from engine.errors import ModelLoadError
from engine.pipeline.families import Family, detect_family, get_family, read_config
from engine.pytorch import embedding, open_provence, opensearch, provence, xprovence
from engine.pytorch.embedding import EmbeddingHighlighterModel

#: family name -> its module
FAMILY_MODULES: dict[str, ModuleType] = {
    "provence": provence,
    "xprovence": xprovence,
    "open_provence": open_provence,
    "opensearch": opensearch,
    "embedding": embedding,
}


def family_module(family: Family) -> ModuleType:
    """The module that builds `family`'s models."""
    try:
        return FAMILY_MODULES[family.name]
    except KeyError:
        raise ModelLoadError(f"no PyTorch module for family {family.name!r}") from None


# --------------------------------------------------------------------------- loading


@dataclass
class LoadedCheckpoint:
    """A checkpoint loaded for PyTorch: the module, its tokenizer, family and spec."""

    model: nn.Module
    family: Family
    folder: Path
    config: dict[str, Any]
    max_length: int  # the default window (what the published models were trained at)
    weights_sha256: str
    max_positions: int = 0  # the longest window the position embeddings allow (--max-length)


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

        return Path(
            snapshot_download(text, allow_patterns=["*.json", "*.safetensors", "*.bin", "*.model", "*.txt"])
        )
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
    """The weight names of a checkpoint folder (safetensors, or a weights-only torch file)."""
    names: list[str] = []
    for f in _weight_files(folder):
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            try:
                with safe_open(str(f), framework="pt") as fh:
                    names.extend(fh.keys())
            except Exception as exc:
                raise ModelLoadError(f"{f}: unreadable safetensors file ({exc})") from exc
        else:  # a PyTorch pickle: names only, never code (weights_only), memory-mapped
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


def build_model(
    family: Family,
    raw: dict[str, Any],
    state_names: set[str],
    attn: str = "eager",
    options: dict[str, Any] | None = None,
    folder: Path | None = None,
) -> nn.Module:
    """The family's module for a checkpoint, its weights not yet loaded."""
    return family_module(family).build(raw, state_names, attn, options or {}, folder)


def checkpoint_positions(family: Family, raw: dict[str, Any]) -> int:
    """The longest window the checkpoint's position embeddings allow."""
    own = getattr(family_module(family), "positions", None)
    return own(raw) if own else int(raw.get("max_position_embeddings", 512))


def checkpoint_max_length(family: Family, raw: dict[str, Any]) -> int:
    """The default window: the family's own rule, else 512 within the positions. The
    published models were trained at 512 (XProvence's card says 8192, but it was trained at
    512): a longer window is an explicit --max-length choice."""
    own = getattr(family_module(family), "max_length", None)
    return own(raw) if own else min(checkpoint_positions(family, raw), 512)


def load_checkpoint(
    name_or_path: str | Path,
    family: str | None = None,
    attn: str = "eager",
    options: dict[str, Any] | None = None,
) -> LoadedCheckpoint:
    """Load a checkpoint of any family into its reference module, strictly: a missing or
    unexpected tensor is an error naming them."""
    folder = resolve_checkpoint(name_or_path)
    raw = read_config(folder)
    names = weight_names(folder)
    fam = get_family(family) if family else detect_family(raw, names, folder)
    module = family_module(fam)
    state, sha = load_state_dict(folder)
    if hasattr(module, "remap"):
        state = module.remap(state)

    def build(device: str) -> nn.Module:
        try:
            with torch.device(device):
                return build_model(fam, raw, set(state), attn, options, folder)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(
                f"{folder}: config.json does not build a {fam.name} model ({type(exc).__name__}: {exc})"
            ) from exc

    # The config's sizes are checked against the weights on a "meta" model first (no
    # memory): a small checkpoint with a huge config.json fails here, before allocation.
    expected = build("meta").state_dict()
    # Non-persistent or derived buffers that some checkpoints carry and some do not.
    optional = {k for k in expected if k.endswith(("position_ids", "token_type_ids"))}
    if hasattr(module, "optional_keys"):
        optional |= module.optional_keys(set(expected))
    missing = sorted(set(expected) - set(state) - optional)
    unexpected = sorted(k for k in set(state) - set(expected) if not k.endswith("position_ids"))
    if missing or unexpected:
        raise ModelLoadError(
            f"{folder}: weights do not match the {fam.name} layout: "
            f"missing {missing[:8]}{'...' if len(missing) > 8 else ''} ({len(missing)}), "
            f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''} ({len(unexpected)})"
        )
    bad_shape = [k for k in state if k in expected and state[k].shape != expected[k].shape]
    if bad_shape:
        k = bad_shape[0]
        raise ModelLoadError(
            f"{folder}: tensor {k} has shape {tuple(state[k].shape)}, the config "
            f"implies {tuple(expected[k].shape)}"
        )
    model = build("cpu")
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    model.eval().to(torch.float32)
    from engine.pipeline.families import checkpoint_family

    return LoadedCheckpoint(
        model=model,
        family=checkpoint_family(fam, raw),
        folder=folder,
        config=raw,
        max_length=checkpoint_max_length(fam, raw),
        weights_sha256=sha,
        max_positions=checkpoint_positions(fam, raw),
    )


def save_checkpoint(model: nn.Module, folder: Path, config: dict[str, Any]) -> None:
    """Write config.json and model.safetensors (used by the test-checkpoint maker)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {
        k.removeprefix("encoder.") if isinstance(model, EmbeddingHighlighterModel) else k: v.contiguous()
        for k, v in model.state_dict().items()
        if not k.endswith(("position_ids", "embeddings.token_type_ids"))
    }
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
