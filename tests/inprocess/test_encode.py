"""How text becomes model input, checked against independent references: each
checkpoint tokenizer's own pair encoding (the template the family was trained with),
and which block's reranking score a multi-block passage reports."""

import asyncio

import numpy as np
import pytest

from engine.measuring import call_blocks

import engine.pruner as pruner_module
from engine.errors import InputError
from tests.utils import FAMILY_NAMES, with_window

pytestmark = pytest.mark.inprocess

Q = "Who built the stadium in 1923?"
SENTENCE = "The stadium was built in 1923 by the city."


@pytest.mark.parametrize("name", ["provence", "open_provence", "opensearch", "xprovence", "embedding"])
def test_block_template_matches_the_checkpoint_tokenizer(pruners, checkpoints, name):
    """One sentence: the engine's block equals the tokenizer's own encoding of the pair
    (question, sentence): ids and, for BERT, token_type_ids. XProvence was trained with
    one separator between question and context (`<s> q </s> ctx </s>`, its training
    scripts), where XLM-R's pair template puts two; the embedding family wraps each
    segment in its own specials."""
    from engine.pytorch.torch_model import load_hf_tokenizer

    ort_p = pruners[name][0]
    hf = load_hf_tokenizer(checkpoints[name])
    block = call_blocks(ort_p, Q, [SENTENCE], [[(0, len(SENTENCE))]])[0]
    if name == "xprovence":
        q = hf(Q, add_special_tokens=False)["input_ids"]
        s = hf(SENTENCE, add_special_tokens=False)["input_ids"]
        expected = [hf.cls_token_id, *q, hf.sep_token_id, *s, hf.sep_token_id]
    elif name == "embedding":
        expected = hf(Q)["input_ids"] + hf(SENTENCE)["input_ids"]
    else:
        pair = hf(Q, SENTENCE)
        expected = pair["input_ids"]
        if name == "opensearch":
            assert block.token_type_ids.tolist() == pair["token_type_ids"]
    assert block.input_ids.tolist() == expected
    # sentence ids: the sentence's tokens (and, for embeddings, its own specials) only
    n_sent = len(hf(SENTENCE, add_special_tokens=False)["input_ids"]) + (2 if name == "embedding" else 0)
    assert int((block.sentence_ids == 0).sum()) == n_sent and set(block.sentence_ids.tolist()) == {-1, 0}


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_reranking_score_of_a_multi_block_passage(pruners, name):
    """The first block's score (the best block's for the embedding and OpenProvence
    families): equal to the score of a passage made of just the sentences that block holds.
    (Threshold 0: every sentence kept, so OpenProvence's 0.0-when-nothing-is-kept stays out.)"""
    ort_p, _ = pruners[name]
    small = with_window(ort_p, 96)
    passage = " ".join(
        f"Sentence {i} says the stadium held {i} thousand people in {1900 + i}." for i in range(12)
    )
    r = small.prune(Q, [passage], threshold=0.0, windows="sentences")[
        0
    ]  # (OpenSearch: not its token windows)
    assert r.blocks > 2
    spans = [(s.start, s.end) for s in r.sentences]
    blocks = call_blocks(small, Q, [passage], [spans], "sentences")
    scores = []
    for b in blocks:
        first, last = b.units[0][0], b.units[-1][0]
        part = passage[spans[first][0] : spans[last][1]]
        alone = small.prune(
            Q,
            [part],
            sentences=[[passage[s:e] for s, e in spans[first : last + 1]]],
            threshold=0.0,
            windows="sentences",
        )[0]
        assert alone.blocks == 1
        scores.append(alone.reranking_score)
    expected = max(scores) if name in ("embedding", "open_provence") else scores[0]
    assert r.reranking_score == pytest.approx(expected, abs=1e-5)
    if name != "opensearch":  # (no rerank head: always 0)
        assert len(set(np.round(scores, 6))) > 1  # the blocks differ: the choice matters


def test_passage_limits_are_enforced(pruners, monkeypatch):
    """The call limits, here set through their PRUNE_* variables (engine.settings)."""
    from engine.pipeline.inputs import Limits

    monkeypatch.setenv("PRUNE_MAX_PASSAGES", "3")
    monkeypatch.setenv("PRUNE_MAX_CALL_CHARS", str(len(Q) + 54))
    base = pruners["opensearch"][0]
    ort_p = pruner_module.Pruner(base.backend, base.encoder.tokenizer, base.spec)
    assert ort_p.limits == Limits(max_passages=3, max_chars=len(Q) + 54)
    with pytest.raises(InputError, match="4 passages in one call; the limit is 3"):
        ort_p.prune(Q, ["a.", "b", "c", "d"])
    with pytest.raises(InputError, match=f"more than {len(Q) + 54} characters .* passed at passage 2"):
        ort_p.prune(Q, ["a.", "b" * 50, "c.."])
    assert len(ort_p.prune(Q, ["a.", "b" * 50, "c."])) == 3  # exactly at the limit


def test_aprune_equals_prune(pruners):
    ort_p, _ = pruners["xprovence"]
    docs = ["The stadium was built in 1923. It holds 80,000 people.", "Paris is in France."]

    async def main():
        return await asyncio.gather(ort_p.aprune(Q, docs), ort_p.aprune(Q, docs[::-1]))

    a, b = asyncio.run(main())
    expected = ort_p.prune(Q, docs)
    assert [r.pruned_context for r in a] == [r.pruned_context for r in expected]
    assert [r.reranking_score for r in b[::-1]] == pytest.approx(
        [r.reranking_score for r in expected], abs=1e-6
    )
