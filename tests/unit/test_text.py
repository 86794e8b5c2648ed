import pytest

from engine.errors import InputError
from engine.pipeline.text import split_sentences, spans_from_sentences
from tests.utils import uncovered

pytestmark = pytest.mark.unit

TRICKY = [
    "Dr. Smith paid $3.50 for it. He left at 5 p.m. on Jan. 3rd.",
    "The U.S. economy grew 2.5% in 2020. Mr. and Mrs. Jones e.g. agreed, i.e. they signed.",
    '"Why?" she asked. "Because," he said, "it is 3.14 exactly." Then silence.',
    "北京是中国的首都。上海是一个大城市！你去过吗？",
    "東京は日本の首都です。大阪も大きい。",
    "Mixed text. 中文句子。Back to English!",
    "First paragraph ends here\n\nSecond paragraph has no final stop",
    "Intro line:\n- first bullet\n- second bullet\n  wrapped onto two lines\n* third\n1. numbered\n2) also numbered",
    "no punctuation at all in this passage just words and more words",
    "   leading and trailing spaces.   Another one.   ",
    "Ellipsis... and then? Yes!! Numbers like 1,000.50 and v2.3.1 stay whole.",
    "# Heading\nBody text under the heading. More body.",
    "a",
    "",
    "\n\n   \n",
    "Tab\tseparated.\tSentences.\r\nWindows line ends.\r\n\r\nNew para.",
    "Emoji 🎉 inside. Another 😀 sentence!",
]


@pytest.mark.parametrize("text", TRICKY)
def test_spans_cover_every_non_space_character(text):
    spans = split_sentences(text)
    assert uncovered(text, spans) == ""
    prev = 0
    for s, e in spans:
        assert prev <= s < e <= len(text)
        assert text[s:e] == text[s:e].strip() != ""
        prev = e


def sents(text):
    return [text[s:e] for s, e in split_sentences(text)]


def test_abbreviations_and_decimals_do_not_split():
    assert sents(TRICKY[0]) == ["Dr. Smith paid $3.50 for it.", "He left at 5 p.m. on Jan. 3rd."]
    assert sents("The U.S. economy grew 2.5% in 2020. It slowed later.") == [
        "The U.S. economy grew 2.5% in 2020.",
        "It slowed later.",
    ]


def test_cjk_sentence_punctuation():
    assert sents(TRICKY[3]) == ["北京是中国的首都。", "上海是一个大城市！", "你去过吗？"]
    assert sents(TRICKY[5]) == ["Mixed text.", "中文句子。", "Back to English!"]
    assert sents("「你好。」他说。") == ["「你好。」", "他说。"]


def test_a_sentence_final_acronym_ends_its_sentence_where_no_english_abbreviation_is_meant():
    assert sents("Os sistemas usam IA. A etapa seguinte poda o texto.") == [
        "Os sistemas usam IA.",
        "A etapa seguinte poda o texto.",
    ]
    assert sents("O modelo usa IA. Isso reduz o custo. O tamanho em PT. O resto.") == [
        "O modelo usa IA.",
        "Isso reduz o custo.",
        "O tamanho em PT.",
        "O resto.",
    ]
    # nupunkt already cut these: the same
    assert sents("A regra vale na UE. O texto saiu nos EUA. Os dados vieram depois.") == [
        "A regra vale na UE.",
        "O texto saiu nos EUA.",
        "Os dados vieram depois.",
    ]
    # English abbreviations are still no sentence end: inner periods, titles in capitals, all-caps
    # text, a lower-case word after the period
    for text in [
        "The U.S. Army is large.",
        "He met Dr. Smith and Mr. Jones e.g. at noon.",
        "DR. Smith arrived.",
        "CHAPTER XV. A POOR WIDOW",
        "They met the CEO. and left.",
        "The study (Ph.D. Thesis) is long.",
    ]:
        assert sents(text) == [text], text


def test_an_opening_quote_after_a_cjk_stop_starts_the_next_sentence():
    assert sents('模型发布了。"少即是多"，作者说。') == ["模型发布了。", '"少即是多"，作者说。']
    assert sents('彼は"短いほうがよい。"と答えた。') == [
        '彼は"短いほうがよい。"',
        "と答えた。",
    ]  # a closing one stays
    for opening in "「『“":
        close = {"「": "」", "『": "』", "“": "”"}[opening]
        text = f"模型发布了。{opening}少即是多{close}，作者说。"
        assert sents(text) == ["模型发布了。", f"{opening}少即是多{close}，作者说。"]
    assert sents("真的吗！？好的。") == ["真的吗！？", "好的。"]  # a run of stops is one end


def test_an_enumerator_is_never_a_sentence_of_its_own_whatever_script_follows():
    for item in [
        "给定问题，检索段落。",
        "Context pruning keeps it.",
        "質問に合う文書を検索する。",
        "Recuperar os documentos.",
    ]:
        assert sents(f"Steps:\n1. {item}\n2. {item}") == ["Steps:", f"1. {item}", f"2. {item}"]
    assert sents("The steps: 1. Retrieve. 2. Prune.") == ["The steps:", "1. Retrieve.", "2. Prune."]
    assert sents("手順：1. 検索する。2. 削除する。") == ["手順：", "1. 検索する。", "2. 削除する。"]
    assert sents("The ratio is 2:1. Assumptions hold.") == ["The ratio is 2:1.", "Assumptions hold."]
    assert sents("I counted to 3. Then I stopped.") == ["I counted to 3.", "Then I stopped."]


def test_latin_punctuation_before_cjk_text_cuts_but_not_after_an_abbreviation():
    assert sents("He left. 然后他走了。") == ["He left.", "然后他走了。"]
    assert sents("Dr. 田中は来た。Use e.g. 中文。") == ["Dr. 田中は来た。", "Use e.g. 中文。"]


def test_blank_lines_and_bullets_are_boundaries():
    assert sents(TRICKY[6]) == ["First paragraph ends here", "Second paragraph has no final stop"]
    assert sents(TRICKY[7]) == [
        "Intro line:",
        "- first bullet",
        "- second bullet\n  wrapped onto two lines",
        "* third",
        "1. numbered",
        "2) also numbered",
    ]


def test_no_punctuation_is_one_sentence():
    assert sents(TRICKY[8]) == [TRICKY[8]]
    assert sents("") == [] and sents(" \n ") == []


def test_quotes_stay_with_their_sentence():
    out = sents(TRICKY[2])
    assert out[0] == '"Why?" she asked.'
    assert out[-1] == "Then silence."


def test_user_sentences_as_strings_and_spans():
    text = "One. Two two. Three."
    assert spans_from_sentences(text, ["One.", "Two two.", "Three."]) == [(0, 4), (5, 13), (14, 20)]
    assert spans_from_sentences(text, [(0, 4), (5, 20)]) == [(0, 4), (5, 20)]
    with pytest.raises(InputError, match="not found"):
        spans_from_sentences(text, ["Three.", "One."])
    with pytest.raises(InputError, match="out of order"):
        spans_from_sentences(text, [(5, 13), (0, 4)])
    with pytest.raises(InputError):
        spans_from_sentences(text, [3])
    with pytest.raises(InputError):
        split_sentences(None)  # type: ignore[arg-type]


def test_large_text_is_fast_and_complete():
    text = ("The committee met on Jan. 3rd and approved 2.5 million. " * 20 + "\n\n") * 500
    spans = split_sentences(text)
    assert uncovered(text, spans) == ""
    assert len(spans) == 20 * 500
