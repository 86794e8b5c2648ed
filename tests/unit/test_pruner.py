"""test_pruner's tests that need no model and no server (the rest: tests/inprocess/test_pruner.py)."""

import numpy as np
import pytest
from engine.pipeline.encode import BatchingConfig, plan
from engine.pipeline.decide import keep_mask
from engine.pipeline.families import FAMILIES

pytestmark = pytest.mark.unit


def test_token_budget_packing_counts_padding():
    cfg = BatchingConfig(max_batch_tokens=512, max_batch_size=64, buckets=(64, 128, 256, 512))
    lengths = [30, 200, 60, 100, 500, 64, 65]
    batches = plan(lengths, cfg, 512)
    seen = sorted(i for _, idx in batches for i in idx)
    assert seen == list(range(len(lengths)))
    for pad, idx in batches:
        assert all(lengths[i] <= pad for i in idx)
        assert pad * len(idx) <= 512 or len(idx) == 1
    # one bucket per batch: 30, 60, 64 pad to 64; 65 and 100 to 128; then 256 and 512
    assert batches == [(64, [0, 2, 5]), (128, [6, 3]), (256, [1]), (512, [4])]
    tight = plan([60, 62, 63, 64, 64], BatchingConfig(max_batch_tokens=128, buckets=(64, 128)), 128)
    assert tight == [(64, [0, 1]), (64, [2, 3]), (64, [4])]  # 3 x 64 > 128
    fixed = plan(
        lengths, BatchingConfig(strategy="fixed", max_batch_size=3, buckets=(64, 128, 256, 512)), 512
    )
    assert [idx for _, idx in fixed] == [[0, 1, 2], [3, 4, 5], [6]]
    with pytest.raises(ValueError):
        BatchingConfig(max_batch_size=0)


def test_longest_first_packing_makes_one_run_of_a_call_that_fits():
    # the GPU's batches: from the longest down, every row padded to its batch's longest
    lengths = [30, 200, 60, 100, 500, 64, 65]
    one = plan(
        lengths, BatchingConfig(max_batch_tokens=4096, buckets=(64, 128, 256, 512), strategy="longest"), 512
    )
    assert one == [(512, [4, 1, 3, 6, 5, 2, 0])]
    split = plan(
        lengths, BatchingConfig(max_batch_tokens=1024, buckets=(64, 128, 256, 512), strategy="longest"), 512
    )
    assert split == [(512, [4, 1]), (128, [3, 6, 5, 2, 0])]  # 2 x 512 fill the budget; 5 x 128 fit it
    capped = plan(
        lengths,
        BatchingConfig(
            max_batch_tokens=4096, max_batch_size=3, buckets=(64, 128, 256, 512), strategy="longest"
        ),
        512,
    )
    assert [idx for _, idx in capped] == [[4, 1, 3], [6, 5, 2], [0]]
    assert sorted(i for _, idx in split for i in idx) == list(range(len(lengths)))
    with pytest.raises(ValueError, match="strategy"):
        BatchingConfig(strategy="shortest")


def test_decision_rules():
    fam = FAMILIES["provence"]
    p = np.array([0.05, 0.2, 0.05, 0.1])
    assert keep_mask(p, fam, 0.1, "none", None).tolist() == [False, True, False, False]  # strict >
    assert keep_mask(p, FAMILIES["opensearch"], 0.1, "none", None).tolist() == [False, True, False, True]
    # the title rule only forces the title in: kept when another sentence is kept, and
    # kept on its own merit when nothing else passes (the families' own rule)
    assert keep_mask(np.array([0.9, 0.05]), fam, 0.1, "first_sentence", None).tolist() == [True, False]
    assert keep_mask(np.array([0.6, 0.2, 0.1]), fam, 0.5, "first_sentence", None).tolist() == [
        True,
        False,
        False,
    ]
    assert keep_mask(np.array([0.0, 0.5]), fam, 0.1, "first_sentence", None).tolist() == [True, True]
    assert keep_mask(np.array([0.05, 0.05]), fam, 0.1, "first_sentence", None).tolist() == [False, False]
    assert keep_mask(np.array([0.9]), fam, 0.1, "first_sentence", None).tolist() == [True]
    # backoff: keep the best if nothing passes and it reaches alpha
    assert keep_mask(np.array([0.02, 0.04]), fam, 0.5, "none", 0.03).tolist() == [False, True]
    assert keep_mask(np.array([0.02, 0.04]), fam, 0.5, "none", 0.05).tolist() == [False, False]
    assert keep_mask(np.array([0.9, 0.02, 0.04]), fam, 0.5, "first_sentence", 0.03).tolist() == [
        True,
        False,
        True,
    ]


def test_build_result_joins_around_dropped_sentences():
    """pruned_context keeps the original whitespace before a kept sentence; text between
    caller-given sentences that is not a sentence is never copied into it."""
    from engine.pipeline.decide import build_result

    doc = "One. Two.\n\nThree. Four."
    spans = [(0, 4), (5, 9), (11, 17), (18, 23)]
    probs = np.array([0.9, 0.1, 0.9, 0.9])
    r = build_result(0, doc, spans, probs, np.array([True, False, True, True]), 1.5, 0.5, 1)
    assert r.pruned_context == "One.\n\nThree. Four."  # the middle sentence dropped
    assert r.compression_rate == pytest.approx(1 - len("One.\n\nThree. Four.") / len(doc))
    assert [h["text"] for h in r.highlights] == ["One.", "Three.", "Four."]
    assert r.highlight("[", "]") == "[One.] Two.\n\n[Three.] [Four.]"
    # caller-given sentences with non-space text between them: a plain space joins them
    doc2 = "Alpha. [ref 1] Beta. [ref 2] Gamma."
    spans2 = [(0, 6), (15, 20), (29, 35)]
    r2 = build_result(0, doc2, spans2, np.array([0.9, 0.9, 0.1]), np.array([True, True, False]), None, 0.5, 1)
    assert r2.pruned_context == "Alpha. Beta."
    r3 = build_result(0, doc2, spans2, np.array([0.9, 0.1, 0.9]), np.array([True, False, True]), None, 0.5, 1)
    assert r3.pruned_context == "Alpha. Gamma."
