"""Loading a checkpoint for PyTorch: a folder (or hub id) -> module, tokenizer, spec."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError
from engine.pipeline.spec import ModelSpec, check_vocabulary, special_ids


def load_hf_tokenizer(folder: str | Path) -> Any:
    """The checkpoint's transformers tokenizer, never running code from the folder."""
    import transformers
    from transformers import AutoTokenizer

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # custom model_type in config.json is expected
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as exc:
        raise ModelLoadError(
            f"{folder}: cannot load a tokenizer ({type(exc).__name__}: {exc}); "
            "pass --tokenizer with a folder that has one"
        ) from exc
    finally:
        transformers.logging.set_verbosity(verbosity)
    if getattr(tok, "backend_tokenizer", None) is None:
        raise ModelLoadError(f"{folder}: the tokenizer has no fast (tokenizers) backend")
    return tok


def checkpoint_tokenizer(folder: str | Path) -> Any:
    """The folder's own tokenizer.json exactly as written (None without one).

    transformers 5 rebuilds some tokenizers instead of reading the file: its
    DebertaV2Tokenizer drops the checkpoint's SentencePiece normalizer (a precompiled
    character map that turns "…" into "..." and folds full-width forms) for NFC and
    whitespace rules, so Provence would tokenize such text differently from its own code
    (transformers 4, which loads the file). The file is what the model was trained with."""
    path = Path(str(folder)) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:
        raise ModelLoadError(f"{path}: cannot be read by the tokenizers library ({exc})") from exc


def embedding_rows(model: Any) -> int:
    """The word-embedding rows (input_ids must stay below this); 0 if none is found."""
    return next(
        (
            int(v.shape[0])
            for k, v in model.state_dict().items()
            if k.endswith(("word_embeddings.weight", "tok_embeddings.weight"))
        ),
        0,
    )


@dataclass
class TorchModel:
    """A checkpoint loaded for PyTorch: what the torch backend runs and export traces."""

    module: Any  # the family's torch.nn.Module (engine.pytorch.modeling)
    tokenizer: Any  # tokenizers.Tokenizer the engine encodes with
    spec: ModelSpec
    checkpoint: Any  # engine.pytorch.modeling.Checkpoint: config, folder, hashes
    hf_tokenizer: Any  # the transformers tokenizer (its special tokens, save_pretrained)


def load_torch_model(
    path: str | Path,
    family: str | None = None,
    tokenizer: str | Path | None = None,
    max_length: int | None = None,
    options: dict[str, Any] | None = None,
    attn: str = "eager",
) -> TorchModel:
    """A checkpoint folder (or hub id) loaded for PyTorch, its tokenizer checked against it.

    `options`: family options (the embedding family's mode, scale, shift, rerank)."""
    from engine.pytorch.modeling import load_checkpoint

    ck = load_checkpoint(path, family=family, options=options, attn=attn)
    hf_tok = load_hf_tokenizer(tokenizer or ck.folder)
    backend_tok = checkpoint_tokenizer(tokenizer or ck.folder) or hf_tok.backend_tokenizer
    backend_tok.no_padding()
    backend_tok.no_truncation()
    # a degenerate tokenizer (none in the checkpoint) would export "fine" and prune garbage
    check_vocabulary(backend_tok, embedding_rows(ck.model), ck.family, str(tokenizer or ck.folder))
    limit = max(ck.max_length, ck.max_positions)
    if max_length is not None and not 16 <= int(max_length) <= limit:
        raise ModelLoadError(
            f"max_length {max_length} is outside 16..{limit}, the window "
            "this checkpoint's position embeddings allow"
        )
    spec = ModelSpec(
        family=ck.family,
        max_length=int(max_length or ck.max_length),
        name=Path(str(path)).name,
        **special_ids(hf_tok),
    )
    return TorchModel(ck.model, backend_tok, spec, ck, hf_tok)
