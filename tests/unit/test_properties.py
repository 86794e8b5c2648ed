"""Property-based tests (hypothesis) over arbitrary Unicode text and lengths: the
sentence splitter's promises, the wire's byte offsets, and the batch planner's."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.pipeline.encode import BatchingConfig, plan
from engine.pipeline.text import split_sentences
from engine.triton.wire import byte_offsets, char_offsets

pytestmark = pytest.mark.unit


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: pieces that exercise every rule of the splitter: punctuation, abbreviations, decimals,
#: quotes, list markers and enumerators, acronyms, blank lines, CJK stops and quotes, and Unicode's
#: odd spaces and line breaks
PIECES = st.sampled_from(
    [
        "a",
        "Word",
        " ",
        "  ",
        ".",
        "!",
        "?",
        "...",
        "\n",
        "\n\n",
        "\t",
        "-",
        "* ",
        "• ",
        "1. ",
        "2) ",
        "# ",
        "。",
        "！",
        "？",
        "「",
        "」",
        "『",
        "“",
        "”",
        "IA.",
        "EUA. ",
        " A ",
        "Dr. ",
        ": ",
        "：",
        '"',
        "'",
        "(",
        ")",
        "e.g.",
        "Dr.",
        "U.S.",
        "3.50",
        "北京",
        "東京",
        "\u3000",
        "\u00a0",
        "\u2028",
        "\u2029",
        "\x85",
        "\x0b",
        "\x0c",
        "\u200b",
        "\r\n",
        "é",
        "🙂",
    ]
)
TEXT = st.one_of(st.lists(PIECES, max_size=60).map("".join), st.text(max_size=300))


@SETTINGS
@given(TEXT)
def test_the_splitter_covers_every_character_in_order_without_overlap(text):
    """Every non-space character lands in exactly one sentence; sentences are stripped,
    non-empty and in order. (No generated input needed a repair pass after the splitter:
    engine.pipeline.text has none.)"""
    spans = split_sentences(text)
    covered = [False] * len(text)
    prev_end = 0
    for s, e in spans:
        assert prev_end <= s < e <= len(text), spans
        assert not text[s].isspace() and not text[e - 1].isspace(), (text[s:e], spans)
        for i in range(s, e):
            covered[i] = True
        prev_end = e
    lost = [text[i] for i, c in enumerate(covered) if not c and not text[i].isspace()]
    assert not lost, (text, spans, lost)


@SETTINGS
@given(st.text(max_size=200), st.data())
def test_byte_offsets_and_character_offsets_are_inverses(text, data):
    """The wire's UTF-8 byte offsets slice the encoded passage exactly where the code
    point offsets slice the string, and convert back."""
    positions = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    try:
        data_bytes = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate never reaches the wire (engine.pipeline.inputs)
        return
    b = byte_offsets(text, positions)
    assert all(data_bytes[:x].decode("utf-8") == text[:p] for x, p in zip(b, positions))
    assert char_offsets(text, b) == positions


@SETTINGS
@given(
    st.lists(st.integers(1, 512), max_size=300),
    st.integers(1, 64),
    st.integers(64, 20_000),
    st.sampled_from([512, 256, 1024]),
)
def test_the_planner_places_every_block_once_within_the_budget(lengths, max_size, max_tokens, window):
    lengths = [min(n, window) for n in lengths]
    cfg = BatchingConfig(max_batch_tokens=max_tokens, max_batch_size=max_size)
    batches = plan(lengths, cfg, window)
    placed = sorted(i for _, idx in batches for i in idx)
    assert placed == list(range(len(lengths)))  # every block exactly once
    buckets = cfg.buckets_for(window)
    for padded, idx in batches:
        assert padded in buckets and all(lengths[i] <= padded for i in idx)
        assert 1 <= len(idx) <= max_size
        # the padded size fits the token budget, unless one row alone is over it
        assert len(idx) * padded <= max(cfg.row_budget(padded), padded), (padded, len(idx), max_tokens)
