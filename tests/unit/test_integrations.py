"""test_integrations's tests that need no model and no server (the rest: tests/server/test_integrations.py)."""

from __future__ import annotations
import pytest

pytestmark = pytest.mark.unit


Q = "When was the stadium built?"


TEXTS = [
    "The stadium was built in 1923. It holds 80,000 people. Its roof came later.",
    "Paris is the capital of France. It is on the Seine.",
    "The river flows to the sea. The stadium opened in 1924 after a year of work.",
]


class Never:
    """A pruner that must not be called."""

    def prune(self, *a, **k):
        raise AssertionError("not called")


def test_a_bad_pruner_or_option_is_a_clear_error():
    from engine.errors import InputError
    from engine.integrations.haystack import PruneRanker

    with pytest.raises(TypeError, match="pruner must be"):
        PruneRanker(pruner=42)
    from engine.integrations.adapter import PruneOptions, prune_contents

    class Never:
        def prune(self, *a, **k):
            raise AssertionError("not called")

    with pytest.raises(InputError, match="top_k"):
        prune_contents(Never(), Q, TEXTS, PruneOptions.of(top_k=0))
    with pytest.raises(InputError, match="unknown option 'topk'.*keep_empty"):
        PruneRanker(pruner=Never(), topk=3)


def test_every_call_option_is_a_field_of_every_adapter():
    """One definition: the adapters' fields are CallOptions's (top_k named as each framework
    says), so an option added to CallOptions reaches every adapter."""
    from engine.pipeline.inputs import OPTION_NAMES
    from engine.integrations.adapter import ADAPTER_FIELDS, PruneOptions, options_of
    from engine.integrations.langchain import PruneCompressor
    from engine.integrations.llamaindex import PrunePostprocessor

    named = {"top_k": "top_n"}
    for adapter in (PruneCompressor, PrunePostprocessor):
        assert {named.get(n, n) for n in (*OPTION_NAMES, *ADAPTER_FIELDS)} <= set(adapter.model_fields)
    from engine.integrations.haystack import PruneRanker

    every = {
        "threshold": 0.4,
        "title": "none",
        "alpha": 0.2,
        "top_k": 3,
        "reorder": True,
        "windows": "sentences",
        "splitter": "reference",
        "lexical_weight": 0.3,
        "passage_margin": 0.05,
        "budget_tokens": 400,
        "budget_tokenizer": "cl100k_base",
        "compress_rate": 0.5,
        "compress_target_token": 80,
    }
    assert set(every) == set(OPTION_NAMES)
    for adapter in (
        PruneCompressor(pruner=Never(), **{named.get(k, k): v for k, v in every.items()}),
        PrunePostprocessor(pruner=Never(), **{named.get(k, k): v for k, v in every.items()}),
    ):
        assert options_of(adapter, named) == PruneOptions.of(**every)
    assert PruneRanker(pruner=Never(), **every).options == PruneOptions.of(**every)
