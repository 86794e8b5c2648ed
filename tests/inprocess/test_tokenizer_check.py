"""A tokenizer that does not fit its model is refused, at export and at load.

transformers 5 builds a five-token tokenizer ([PAD] [UNK] [CLS] [SEP] [MASK]) when a
checkpoint ships no vocabulary (the real OpenSearch highlighter ships none). Exported
with it, every word is [UNK] and the model returns probabilities that mean nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils import FAMILY_NAMES

pytestmark = pytest.mark.inprocess

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _bert_tokenizer_folder(folder: Path, extra: list[str]) -> Path:
    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(SPECIALS + extra) + "\n")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True})
    )
    return folder


@pytest.fixture(scope="module")
def five_tokens(tmp_path_factory) -> Path:
    """What transformers 5 falls back to: the special tokens and not one word."""
    return _bert_tokenizer_folder(tmp_path_factory.mktemp("tok") / "five", [])


@pytest.fixture(scope="module")
def no_words(tmp_path_factory) -> Path:
    """As many tokens as the test models' embedding rows, none of them a word piece."""
    return _bert_tokenizer_folder(
        tmp_path_factory.mktemp("tok") / "nowords", [f"[unused{i}]" for i in range(400)]
    )


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_export_refuses_a_vocabulary_far_smaller_than_the_embeddings(
    family, checkpoints, five_tokens, tmp_path
):
    from engine.errors import PruneError
    from export.onnx import export_model

    out = tmp_path / "ex"
    with pytest.raises(PruneError) as err:
        export_model(checkpoints[family], out, tokenizer=five_tokens, log=lambda m: None)
    msg = str(err.value)
    assert "5 tokens for the model's" in msg and "--tokenizer" in msg
    from engine.pipeline.families import FAMILIES

    assert FAMILIES[family].usual_tokenizer and FAMILIES[family].usual_tokenizer in msg
    assert not out.exists()


def test_export_refuses_a_vocabulary_that_knows_no_word(checkpoints, no_words, tmp_path):
    from engine.errors import PruneError
    from export.onnx import export_model

    with pytest.raises(
        PruneError, match=r"maps ordinary words \(the, city, water, people, \.\.\.\) to \[UNK\]"
    ):
        export_model(checkpoints["opensearch"], tmp_path / "ex", tokenizer=no_words, log=lambda m: None)


def test_cli_export_of_a_checkpoint_without_tokenizer_is_refused(tmp_path):
    """The issue's steps: a test checkpoint (prune test-checkpoint's), its tokenizer files deleted,
    then prune export."""
    from export.checkpoints import make_test_checkpoint

    ck = make_test_checkpoint("opensearch", tmp_path / "ck")
    run = [sys.executable, "-m", "engine"]
    for f in ck.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special_tokens")):
            f.unlink()
    proc = subprocess.run(
        run + ["export", "--model", str(ck), "--out", str(tmp_path / "ex")], capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the tokenizer does not fit the model" in proc.stderr
    assert "--tokenizer" in proc.stderr and "bert-base-uncased" in proc.stderr
    assert "parity OK" not in proc.stdout
    assert not (tmp_path / "ex").exists()


@pytest.mark.parametrize("kind", ["five_tokens", "no_words"])
def test_an_export_with_a_degenerate_tokenizer_is_refused_at_load(kind, exported, request, tmp_path):
    from engine.errors import ModelLoadError
    from engine.pruner import Pruner
    from transformers import AutoTokenizer

    folder = tmp_path / "ex"
    shutil.copytree(exported["opensearch"], folder)
    AutoTokenizer.from_pretrained(str(request.getfixturevalue(kind))).backend_tokenizer.save(
        str(folder / "tokenizer.json")
    )
    with pytest.raises(
        ModelLoadError, match="the tokenizer does not fit the model.*--tokenizer.*bert-base-uncased"
    ):
        Pruner.load(folder)


def test_the_test_checkpoints_own_tokenizers_pass(pruners):
    """The check must not refuse a real vocabulary: every family's loads (small ones too)."""
    for name in FAMILY_NAMES:
        assert pruners[name][0].prune("What is the city?", ["Paris is a city."])[0].sentences
