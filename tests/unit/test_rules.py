"""The decision settings have one definition (engine.pipeline.inputs.Rules), and every surface is made of it."""

from __future__ import annotations

from dataclasses import fields

import pytest

from engine.pipeline.families import FAMILIES, Family, get_family
from engine.pipeline.inputs import OPTION_NAMES, RECORDED, CallOptions, Rules

pytestmark = pytest.mark.unit

RULE_NAMES = {f.name for f in fields(Rules)}


def test_the_rules_are_defined_once_and_every_surface_uses_their_names():
    # a family holds its defaults as Rules, and no setting of its own beside them
    assert not RULE_NAMES & {f.name for f in fields(Family)} - {"rules"}
    assert all(isinstance(fam.rules, Rules) for fam in FAMILIES.values())
    # a call's options are rules by the same names
    assert set(OPTION_NAMES) <= RULE_NAMES
    # /info's rules are Rules' fields; its defaults are those and what they mean
    from engine.http.models import Defaults, RulesBody

    assert set(RulesBody.model_fields) == RULE_NAMES
    assert set(Defaults.model_fields) - RULE_NAMES == {
        "threshold_without_lexical",
        "score_kind",
        "zero_rerank_when_empty",
        "decides_per_window",
    }
    # a manifest records rules by their names
    assert set(RECORDED) <= RULE_NAMES


def test_a_call_resolves_once_with_one_threshold():
    emb = get_family("embedding").rules
    assert emb.threshold_at(0.0) == 0.87 and emb.threshold_at(0.5) == 0.83
    r = emb.resolve(CallOptions())
    assert (r.threshold, r.lexical_threshold, r.lexical_weight) == (0.83, None, 0.5)
    assert emb.resolve(CallOptions.of(threshold=0.4, lexical_weight=0.5)).threshold == 0.4
    assert emb.resolve(CallOptions.of(top_k=2, reorder=True)).top_k == 2
    assert r.resolve(CallOptions()) == r  # resolving twice changes nothing


def test_a_manifest_overrides_by_the_same_names():
    emb = get_family("embedding").rules
    assert emb.overridden({}) == emb
    assert emb.overridden({"passage_margin": None}).passage_margin is None  # null: no gate
    assert emb.overridden({"passage_margin": -1}).passage_margin is None
    assert emb.overridden({"alpha": None, "title": "first_sentence"}).alpha is None  # null: no backoff
    assert emb.overridden({"backoff_alpha": 0.5}) == emb  # a name it does not record: left alone
    assert (
        emb.overridden(
            {
                "threshold": None,
                "lexical_weight": None,
                "lexical_threshold": None,
                "title": None,
                "windows": None,
            }
        )
        == emb
    )  # earlier exports' nulls: the family's
    assert emb.overridden({"opset": 17, "lexical_weight": 0.3}).lexical_weight == 0.3  # others left alone
    assert emb.overridden(emb.recorded()) == emb
    for bad in (
        {"threshold": 1.5},
        {"keep_rule": "gte"},
        {"windows": "tokens"},
        {"alpha": "x"},
        {"lexical_weight": True},
    ):
        with pytest.raises(Exception):
            emb.overridden(bad)


def test_the_http_client_reads_the_servers_rules_without_a_mapping():
    from engine.http.models import info_rules
    from engine.remote.http_client import HttpPruner

    fam = get_family("embedding")
    fam = fam.__class__(
        **{
            **{f.name: getattr(fam, f.name) for f in fields(fam)},
            "rules": fam.rules.overridden({"lexical_weight": 0.3, "passage_margin": 0.2}),
        }
    )
    rules, defaults = info_rules(fam)
    client = HttpPruner("http://127.0.0.1:1")
    client._info = {"family": "embedding", "rules": rules.model_dump(), "defaults": defaults.model_dump()}
    assert client.family == fam
    assert (defaults.threshold, defaults.threshold_without_lexical, defaults.lexical_threshold) == (
        0.83,
        0.87,
        None,
    )


def test_a_family_is_a_plain_value():
    emb = get_family("embedding")
    with pytest.raises(AttributeError):
        emb.threshold  # its decision settings are emb.rules'
    import copy
    import pickle

    assert copy.deepcopy(emb) == emb and pickle.loads(pickle.dumps(emb)) == emb
