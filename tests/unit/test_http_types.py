"""The HTTP API's types without a server: each family's score semantics (by hand), the
one error enum, and the wire model of a result against the engine's dataclass."""

from __future__ import annotations

import dataclasses
import math

import pytest

from engine.pipeline.budget import Budget
from engine.pipeline.results import PruneResult, Sentence
from engine.pipeline.families import FAMILIES

pytest.importorskip("fastapi")
from engine.http.models import ApiError, PrunedPassage  # noqa: E402

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "family, score, raw, want",
    [
        ("provence", 2.0, False, 1 / (1 + math.exp(-2.0))),
        ("provence", 2.0, True, 2.0),
        ("xprovence", -1.0, False, 1 / (1 + math.exp(1.0))),
        ("xprovence", None, True, -1e9),
        ("open_provence", 0.8, False, 0.8),
        ("open_provence", 0.8, True, math.log(0.8 / 0.2)),
        ("open_provence", None, False, 0.0),
        ("embedding", 0.5, False, 0.75),
        ("embedding", -0.2, True, -0.2),
        ("embedding", None, True, 0.0),
        ("opensearch", 0.0, False, 0.0),
        ("opensearch", None, True, 0.0),
    ],
)
def test_each_familys_score_means_what_the_docs_say(family, score, raw, want):
    assert FAMILIES[family].rank_score(score, raw) == pytest.approx(want)


def test_the_order_by_rank_score_is_the_order_by_reranking_score():
    for fam in FAMILIES.values():
        scores = [-3.0, -0.5, 0.1, 0.4, 0.9, 2.5] if fam.score_kind == "logit" else [0.05, 0.2, 0.5, 0.9]
        for raw in (False, True):
            ranked = [fam.rank_score(s, raw) for s in scores]
            assert ranked == sorted(ranked), (fam.name, raw)


def test_one_error_enum_fixes_status_and_kind():
    assert ApiError.OVERLOADED.status == 429 and ApiError.OVERLOADED.error_type == "Overloaded"
    assert ApiError.INVALID.body("x: bad") == {
        "error": "x: bad",
        "error_type": "Validation",
        "message": "x: bad",
    }
    assert ApiError.of_status(404) is ApiError.NOT_FOUND and ApiError.of_status(418) is ApiError.INVALID
    assert ApiError.of_status(502) is ApiError.SERVER
    assert len({(k.status, k.error_type) for k in ApiError}) == len(ApiError)


def test_in_flight_refuses_past_its_limit_and_gives_its_places_back():
    from engine.http.state import Busy, InFlight

    class Gauge:
        value = 0

        def inc(self):
            self.value += 1

        def dec(self):
            self.value -= 1

    held = InFlight(2, Gauge())
    with held.slot(), held.slot():
        assert (held.count, held.gauge.value) == (2, 2)
        with pytest.raises(Busy, match="2 requests are in flight"), held.slot():
            pass
    assert (held.count, held.gauge.value) == (0, 0)


def test_a_body_not_sent_as_json_is_told_the_content_type():
    from engine.http.error_handlers import not_json_message

    for sent in ("application/x-www-form-urlencoded", None):
        message = not_json_message(sent)
        assert "Content-Type: application/json" in message and (sent or "no Content-Type") in message


def test_the_wire_result_carries_every_field_of_the_engines():
    r = PruneResult(
        index=2,
        context="A b. C d.",
        pruned_context="A b.",
        reranking_score=None,
        sentences=[Sentence("A b.", 0, 4, 0.9, True), Sentence("C d.", 5, 9, 0.1, False)],
        compression_rate=0.5,
        threshold=0.3,
        blocks=1,
        windows="sentences",
        lexical_weight=0.5,
    )
    wire = PrunedPassage.of(r).model_dump(exclude_unset=True)
    assert wire == r.to_dict()  # the engine's JSON form, field for field
    # budget: only when the call had one; unknown_share: where it was measured (not through a Triton
    # text model of an earlier version); the compressed text: when the call compressed
    assert set(dataclasses.asdict(r)) == set(wire) | {
        "budget",
        "unknown_share",
        "compressed_context",
        "compressed_spans",
    }
    budgeted = dataclasses.replace(
        r,
        budget=Budget(100, 40, 12, 1, "model"),
        unknown_share=0.6154,
        compressed_context="A",
        compressed_spans=[(0, 1)],
    )
    assert PrunedPassage.of(budgeted).model_dump(exclude_unset=True) == budgeted.to_dict()
    assert budgeted.to_dict()["unknown_share"] == 0.6154
    assert (
        PrunedPassage.of(r, "<b>A b.</b> C d.").model_dump(exclude_unset=True)["highlighted"]
        == "<b>A b.</b> C d."
    )
