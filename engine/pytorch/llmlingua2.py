"""LLMLingua-2's model: a token classifier (XLMRobertaForTokenClassification or
BertForTokenClassification, two labels), loaded as llmlingua 0.2.2 loads and changes it.

`PromptCompressor.init_llmlingua2` adds 100 special tokens `[NEW0]..[NEW99]` to the tokenizer
and calls `model.resize_token_embeddings(len(tokenizer))` right after `seed_everything(42)`:
transformers draws the new rows from a normal distribution with the old rows' mean and
covariance, from torch's global generator. A force token that is not one token becomes one of
those rows, so the engine makes them the same way (the same seed, the same call, on a forked
generator so that the caller's random state is left alone); an export carries them as they are.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from engine.errors import ModelLoadError
from engine.pipeline.lingua_words import check_folder

#: llmlingua's seed before it resizes the embeddings (utils.seed_everything(42))
SEED = 42


def load_classifier(folder: str | Path, vocabulary: int, attn: str | None = None) -> torch.nn.Module:
    """The checkpoint's token classifier in float32, its embeddings resized to `vocabulary` (the
    tokenizer with llmlingua's added tokens) as llmlingua resizes them. `attn`: transformers'
    attention implementation (the export traces "eager", the one ONNX Runtime's optimizer fuses;
    None: transformers' default, as llmlingua loads it)."""
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    check_folder(folder)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # transformers' "Loading weights" bar, on every load
    try:
        model = AutoModelForTokenClassification.from_pretrained(
            str(folder),
            dtype=torch.float32,
            use_safetensors=True,
            trust_remote_code=False,
            **({"attn_implementation": attn} if attn else {}),
        )
    except Exception as exc:
        raise ModelLoadError(f"{folder}: the token classifier does not load ({exc})") from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    # transformers warns that the added rows are drawn from the old rows' mean and covariance:
    # that is llmlingua's own resize, wanted here, so its warning is not passed on
    resize_log = logging.getLogger("transformers.modeling_utils")
    level = resize_log.level
    resize_log.setLevel(logging.ERROR)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            model.resize_token_embeddings(vocabulary)
    finally:
        resize_log.setLevel(level)
    return model.eval()
