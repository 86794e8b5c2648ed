"""test_passage_gate's tests that need no model and no server (the rest: tests/server/test_passage_gate.py)."""

from __future__ import annotations
import math
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from engine.pipeline.decide import gate_passages
from engine.pipeline.results import PruneResult, Sentence
from engine.errors import InputError
from engine.pipeline.families import get_family
from engine.pipeline.inputs import CallOptions, check_passage_margin

pytestmark = pytest.mark.unit


def _result(index: int, score: float | None, kept: list[bool]) -> PruneResult:
    text = " ".join(f"Sentence {index}.{k}." for k in range(len(kept)))
    sentences, pos = [], 0
    for k, keep in enumerate(kept):
        s = f"Sentence {index}.{k}."
        start = text.index(s, pos)
        sentences.append(Sentence(s, start, start + len(s), 0.9 if keep else 0.1, keep))
        pos = start + len(s)
    pruned = " ".join(s.text for s in sentences if s.kept)
    return PruneResult(
        index=index,
        context=text,
        pruned_context=pruned,
        reranking_score=score,
        sentences=sentences,
        compression_rate=1 - len(pruned) / len(text) if text else 0.0,
        threshold=0.5,
    )


def test_the_gate_by_hand():
    results = [
        _result(0, 0.90, [True, False]),
        _result(1, 0.81, [False, True]),
        _result(2, 0.79, [True, True]),
        _result(3, None, []),
        _result(4, 0.2, [False, False]),
    ]
    got = gate_passages(results, 0.1)
    # best 0.90: 0.81 stays (within 0.1), 0.79 is emptied, no score (an empty passage) stays as it is
    assert [r.pruned_context for r in got] == ["Sentence 0.0.", "Sentence 1.1.", "", "", ""]
    assert [any(s.kept for s in r.sentences) for r in got] == [True, True, False, False, False]
    assert got[2].compression_rate == 1.0 and got[2].reranking_score == 0.79
    assert [s.probability for s in got[2].sentences] == [0.9, 0.9]  # scores untouched, only decisions
    assert got[0] is results[0] and got[4] is results[4]
    assert gate_passages(results, None) is results  # no gate
    assert [r.pruned_context for r in gate_passages(results, 0.0)] == ["Sentence 0.0.", "", "", "", ""]
    assert gate_passages([], 0.1) == []


@settings(max_examples=200, deadline=None)
@given(
    scores=st.lists(st.one_of(st.none(), st.floats(-5, 5, allow_nan=False)), min_size=1, max_size=30),
    margin=st.floats(0, 2),
    cuts=st.lists(st.integers(1, 29), max_size=4),
)
def test_a_call_cut_into_parts_and_gated_again_whole_equals_the_whole_call(scores, margin, cuts):
    """What the text model's client relies on: each part gated by its own best, then the
    whole gated again, gives exactly the whole call gated once."""
    results = [_result(i, s, [True, i % 2 == 0]) for i, s in enumerate(scores)]
    whole = gate_passages(results, margin)
    bounds = sorted({0, len(results), *(c for c in cuts if c < len(results))})
    parts = [r for a, b in zip(bounds, bounds[1:]) for r in gate_passages(results[a:b], margin)]
    assert gate_passages(parts, margin) == whole
    assert gate_passages(whole, margin) == whole  # idempotent


def test_margins_are_checked_and_resolved():
    emb, prov = get_family("embedding"), get_family("provence")
    assert emb.rules.passage_margin == 0.1 and prov.rules.passage_margin is None

    def margin(fam, value):
        return fam.rules.resolve(CallOptions.of(passage_margin=value)).passage_margin

    assert margin(emb, None) == 0.1 and margin(emb, 0.3) == 0.3 and margin(emb, -1) is None
    assert margin(prov, None) is None and margin(prov, 0.0) == 0.0
    assert check_passage_margin(None) is None and check_passage_margin(np.float32(0.5)) == 0.5
    for bad in (math.nan, math.inf, True, "0.1", [0.1]):
        with pytest.raises(InputError, match="passage_margin"):
            check_passage_margin(bad)
