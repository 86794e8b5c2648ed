"""test_lexical's tests that need no model and no server (the rest: tests/server/test_lexical.py)."""

from __future__ import annotations
import math
import numpy as np
import pytest
from engine.pipeline.decide import fuse_scores, lexical_passage_score, lexical_sentence_scores, lexical_words

pytestmark = pytest.mark.unit


def test_bm25_over_the_passages_sentences_by_hand():
    sents = ["The cat sat.", "A dog sat on the cat.", "Birds fly."]
    got = lexical_sentence_scores("Where did the cat sit?", sents)
    # query words: where did the cat sit; df over the 3 sentences: the 2, cat 2 (sit: no "sit", only "sat")
    n, k1, b = 3, 1.5, 0.75
    lengths = [3, 6, 2]
    avgdl = sum(lengths) / n
    idf = math.log(1 + (n - 2 + 0.5) / (2 + 0.5))  # "the" and "cat": df 2 each

    def bm(tf_the, tf_cat, dl):
        norm = k1 * (1 - b + b * dl / avgdl)
        return sum(idf * tf * (k1 + 1) / (tf + norm) for tf in (tf_the, tf_cat) if tf)

    raw = np.array([bm(1, 1, 3), bm(1, 1, 6), 0.0])
    np.testing.assert_allclose(got, raw / raw.max())
    assert got[0] == 1.0 and got[2] == 0.0


def test_passage_score_is_question_word_coverage():
    assert lexical_passage_score("When was the stadium built?", "The stadium was built in 1923.") == 4 / 5
    assert lexical_passage_score("When?", "Nothing here.") == 0.0


@pytest.mark.parametrize(
    "question", ["北京是中国的首都吗？", "Où est la tour Eiffel ?", "the of and a", "???", "Ünïcödé CASE"]
)
def test_awkward_questions_are_handled(question):
    sents = ["北京是中国的首都。", "La tour Eiffel est à Paris.", "The cat and a dog.", "ünïcödé case works"]
    got = lexical_sentence_scores(question, sents)
    assert got.shape == (4,) and np.all((got >= 0) & (got <= 1))
    assert 0.0 <= lexical_passage_score(question, " ".join(sents)) <= 1.0
    assert lexical_sentence_scores(question, []).shape == (0,)
    if question == "Ünïcödé CASE":  # case-folded
        assert got[3] == 1.0


def test_cjk_text_is_counted_in_character_bigrams():
    """Chinese, Japanese and Korean have no spaces between words: a run of their characters
    is one `\\w+` match, so without bigrams a sentence is one "word" that never matches."""
    assert lexical_words("東京タワー") == ["東京", "京タ", "タワ", "ワー"]
    assert lexical_words("北京是首都") == ["北京", "京是", "是首", "首都"]
    assert lexical_words("서울은 수도") == ["서울", "울은", "수도"]
    assert lexical_words("iPhone15を買った 中 Ünï") == ["iphone15", "を買", "買っ", "った", "中", "ünï"]
    assert lexical_words("The cat sat.") == ["the", "cat", "sat"]  # other scripts as before


@pytest.mark.parametrize(
    "question, sentences, answer",
    [
        ("中国的首都是哪里？", ["上海是一个大城市。", "北京是中国的首都。", "长城很长。"], 1),
        (
            "東京タワーの高さは何メートルですか？",
            ["富士山は日本一高い山です。", "東京タワーの高さは333メートルです。", "京都には寺が多い。"],
            1,
        ),
        (
            "한국의 수도는 어디입니까?",
            ["부산은 항구 도시입니다.", "김치는 맛있습니다.", "서울은 한국의 수도입니다."],
            2,
        ),
    ],
)
def test_cjk_questions_find_their_sentence(question, sentences, answer):
    got = lexical_sentence_scores(question, sentences)
    assert int(np.argmax(got)) == answer and got[answer] == 1.0
    assert sorted(got)[-2] < 0.5  # the others share little with the question
    others = "".join(s for i, s in enumerate(sentences) if i != answer)
    assert lexical_passage_score(question, sentences[answer]) > lexical_passage_score(question, others)


def test_fusion_is_monotone_in_each_part_and_weight_zero_is_the_model():
    rng = np.random.default_rng(0)
    model, lex = rng.random(50), rng.random(50)
    for w in (0.0, 0.3, 0.5, 1.0):
        base = fuse_scores(model, lex, w)
        assert np.all(fuse_scores(model + 0.1, lex, w) >= base) and np.all(
            fuse_scores(model, lex + 0.1, w) >= base
        )
    assert fuse_scores(model, lex, 0.0) is model
