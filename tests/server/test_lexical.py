"""The in-passage lexical score (engine.pipeline.decide) and its fusion with the model's
(`lexical_weight`): BM25 against a hand computation, the fusion monotone in each part,
weight 0 equal to the model alone, the in-process pruner and the Triton text model equal,
awkward questions handled, bad weights refused."""

from __future__ import annotations


import numpy as np
import pytest

from engine.pipeline.decide import lexical_passage_score, lexical_sentence_scores
from engine.errors import InputError

pytestmark = pytest.mark.server


def test_weight_zero_equals_todays_results_and_weights_are_checked(pruners):
    p = pruners["xprovence"][0]
    q = "When was the stadium built?"
    docs = ["The stadium was built in 1923. It holds 80,000 people.", "Paris is the capital of France."]
    assert [r.to_dict() for r in p.prune(q, docs, lexical_weight=0.0)] == [
        r.to_dict() for r in p.prune(q, docs)
    ]
    fused = p.prune(q, docs, lexical_weight=0.5)
    for r, m in zip(fused, p.prune(q, docs)):
        lex = lexical_sentence_scores(q, [s.text for s in m.sentences])
        np.testing.assert_allclose(
            [s.probability for s in r.sentences],
            0.5 * np.array([s.probability for s in m.sentences]) + 0.5 * lex,
            atol=1e-6,
        )
        assert r.reranking_score == pytest.approx(
            0.5 * m.reranking_score + 0.5 * lexical_passage_score(q, m.context)
        )
    for bad in (-0.1, 1.5, float("nan"), "0.5"):
        with pytest.raises(InputError, match="lexical_weight"):
            p.prune(q, docs, lexical_weight=bad)
    with pytest.raises(InputError, match="token window"):
        pruners["opensearch"][0].prune(q, docs, lexical_weight=0.5, windows="reference")


def test_the_triton_text_model_fuses_as_in_process(pruners, server):
    from engine.pruner import Pruner

    local = pruners["xprovence"][0]
    q = "When was the stadium built?"
    docs = [
        "The stadium was built in 1923. It holds 80,000 people. Its roof came later.",
        "Paris is the capital of France.",
        "",
        "The river flows to the sea. The stadium opened in 1924.",
    ]
    with Pruner.connect(server.grpc_url, "xprovence_text") as remote:
        got, want = remote.prune(q, docs, lexical_weight=0.5), local.prune(q, docs, lexical_weight=0.5)
        assert [r.pruned_context for r in got] == [r.pruned_context for r in want]
        for g, w in zip(got, want):
            assert [s.probability for s in g.sentences] == pytest.approx(
                [s.probability for s in w.sentences], abs=1e-5
            )
            assert (g.reranking_score is None) == (w.reranking_score is None)
            if w.reranking_score is not None:
                assert g.reranking_score == pytest.approx(w.reranking_score, abs=1e-5)
        assert [r.to_dict() for r in remote.prune(q, docs, lexical_weight=0.0)] != [r.to_dict() for r in got]
        with pytest.raises(InputError, match="lexical_weight"):
            remote.prune(q, docs, lexical_weight=2.0)


def test_the_default_family_fuses_by_default_and_weight_zero_is_the_model_at_its_own_threshold(
    pruners, exported
):
    """The embedding family (the default model's) runs the hybrid unless told otherwise:
    weight 0.5 kept above 0.83, recorded in the manifest and in every result; weight 0 is
    the model alone at its own threshold 0.87."""
    import json

    from engine.pipeline.families import get_family

    p = pruners["embedding"][0]
    fam = get_family("embedding")
    assert (fam.rules.lexical_weight, fam.rules.lexical_threshold, fam.rules.threshold) == (0.5, 0.83, 0.87)
    defaults = json.loads((exported["embedding"] / "manifest.json").read_text())["defaults"]
    assert defaults["lexical_weight"] == 0.5 and defaults["lexical_threshold"] == 0.83
    q = "When was the stadium built?"
    docs = [
        "The stadium was built in 1923. It holds 80,000 people. Its roof came later.",
        "Paris is the capital of France. The river flows to the sea.",
    ]
    default = p.prune(q, docs)
    assert all(r.lexical_weight == 0.5 and r.threshold == 0.83 for r in default)
    assert [r.to_dict() for r in default] == [
        r.to_dict() for r in p.prune(q, docs, lexical_weight=0.5, threshold=0.83)
    ]
    alone = p.prune(q, docs, lexical_weight=0.0)
    assert all(r.lexical_weight == 0.0 and r.threshold == 0.87 for r in alone)
    for r, m in zip(default, alone):
        lex = lexical_sentence_scores(q, [s.text for s in m.sentences])
        np.testing.assert_allclose(
            [s.probability for s in r.sentences],
            0.5 * np.array([s.probability for s in m.sentences]) + 0.5 * lex,
            atol=1e-6,
        )
    for res, t in ((alone, 0.87), (default, 0.83)):
        best = max(x.reranking_score for x in res)
        for x in res:
            probs = np.array([s.probability for s in x.sentences])
            want = (
                probs > t if (probs > t).any() else probs == probs.max()
            )  # backoff (alpha 0) keeps the best
            want &= bool(
                np.float32(x.reranking_score) >= np.float32(best) - np.float32(0.1)
            )  # the passage gate
            assert [s.kept for s in x.sentences] == want.tolist()
    # the other families stay off by default
    assert all(r.lexical_weight == 0.0 for r in pruners["xprovence"][0].prune(q, docs))


def test_a_manifest_sets_or_clears_the_default(exported):
    import json

    from engine.pipeline.spec import Manifest

    def spec_from_manifest(d):
        return Manifest.from_dict(d).spec()

    manifest = json.loads((exported["embedding"] / "manifest.json").read_text())
    manifest["defaults"].update(lexical_weight=0.0)
    assert spec_from_manifest(manifest).family.rules.threshold_at(0.0) == 0.87
    assert spec_from_manifest(manifest).family.rules.lexical_weight == 0.0
    manifest["defaults"].update(lexical_weight=0.3, lexical_threshold=0.8)
    fam = spec_from_manifest(manifest).family
    assert (fam.rules.lexical_weight, fam.rules.threshold_at(fam.rules.lexical_weight)) == (0.3, 0.8)


def test_the_default_family_text_model_and_http_api_run_the_same_default(pruners, server):
    from tests.utils import serve_api

    from engine.remote.http_client import HttpPruner
    from engine.pruner import Pruner

    local = pruners["embedding"][0]
    q = "When was the stadium built?"
    docs = [
        "The stadium was built in 1923. It holds 80,000 people. Its roof came later.",
        "Paris is the capital of France.",
    ]
    want = local.prune(q, docs)
    with Pruner.connect(server.grpc_url, "embedding_text") as remote:
        got = remote.prune(q, docs)
        assert [(r.pruned_context, r.threshold, r.lexical_weight) for r in got] == [
            (r.pruned_context, r.threshold, r.lexical_weight) for r in want
        ]
        with serve_api(remote) as url, HttpPruner(url) as http:
            assert http.family.rules.lexical_weight == 0.5 and http.family.rules.threshold_at(0.5) == 0.83
            over = http.prune(q, docs)
            assert [(r.pruned_context, r.threshold, r.lexical_weight) for r in over] == [
                (r.pruned_context, r.threshold, r.lexical_weight) for r in want
            ]
            assert [r.lexical_weight for r in http.prune(q, docs, lexical_weight=0)] == [0.0, 0.0]
