"""Every family: the exported ONNX graph equals the PyTorch reference.

Tolerance: sentence probabilities within 1e-5 (measured: under 3e-7), reranking scores
within 1e-4 (a raw logit), and identical keep decisions at thresholds 0.1, 0.3 and 0.5.
The model's own scores (`lexical_weight=0`): the lexical fusion the embedding family runs
by default is the same client-side code on both paths (tests/server/test_lexical.py).
"""

import numpy as np
import pytest

from tests.utils import FAMILY_NAMES, PASSAGES, QUESTION, with_window

pytestmark = pytest.mark.inprocess

PROB_TOL = 1e-5
RERANK_TOL = 1e-4


def _splitting_threshold(pruner, passages) -> float:
    """Random weights put most probabilities on one side of a fixed threshold. This one
    splits them near the median, in the widest gap between neighbours, so identical
    decisions there are a real check and not a tie decided by float noise."""
    probs = np.sort(
        [s.probability for r in pruner.prune(QUESTION, passages, lexical_weight=0) for s in r.sentences]
    )
    lo, hi = len(probs) // 4, 3 * len(probs) // 4
    k = lo + int(np.argmax(np.diff(probs[lo : hi + 1])))
    assert probs[k + 1] - probs[k] > 10 * PROB_TOL
    return float((probs[k] + probs[k + 1]) / 2)


def _compare(ort_pruner, torch_pruner, passages):
    for threshold in (0.1, 0.3, 0.5, _splitting_threshold(torch_pruner, passages)):
        a = ort_pruner.prune(QUESTION, passages, threshold=threshold, lexical_weight=0)
        b = torch_pruner.prune(QUESTION, passages, threshold=threshold, lexical_weight=0)
        assert len(a) == len(b) == len(passages)
        for ra, rb in zip(a, b):
            pa = np.array([s.probability for s in ra.sentences])
            pb = np.array([s.probability for s in rb.sentences])
            assert pa.shape == pb.shape and len(pa) > 0
            np.testing.assert_allclose(pa, pb, atol=PROB_TOL, rtol=0)
            assert abs(ra.reranking_score - rb.reranking_score) <= RERANK_TOL
            assert [s.kept for s in ra.sentences] == [s.kept for s in rb.sentences]
            assert ra.pruned_context == rb.pruned_context
    return a


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_onnx_equals_pytorch_full_window(pruners, name):
    ort_p, torch_p = pruners[name]
    results = _compare(ort_p, torch_p, PASSAGES)
    assert results[4].blocks > 1  # the unpunctuated passage exceeds one window


@pytest.mark.parametrize("name", FAMILY_NAMES)
@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_onnx_equals_pytorch_multi_block(pruners, name, batch_size):
    ort_p, torch_p = pruners[name]
    ort_s = with_window(ort_p, 96, max_batch_size=batch_size)
    torch_s = with_window(torch_p, 96, max_batch_size=batch_size)
    results = _compare(ort_s, torch_s, PASSAGES)
    assert results[1].blocks == 1 and results[3].blocks > 3 and results[4].blocks > 3


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_decisions_vary_on_random_models(pruners, name):
    """Guard against a vacuous parity test: probabilities are spread, not constant."""
    ort_p, _ = pruners[name]
    probs = [s.probability for r in ort_p.prune(QUESTION, PASSAGES, lexical_weight=0) for s in r.sentences]
    assert max(probs) - min(probs) > 0.05
