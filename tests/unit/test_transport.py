"""The Triton transport: one retry classification, and both implementations offer the
Transport protocol that the core backend and the text-model pruner are written against."""

from __future__ import annotations

import re

import pytest

from engine.triton.client import Transport, TritonClient, retryable
from engine.triton.replicas import ReplicaSet

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "exc,expected",
    [
        (TimeoutError("no answer"), True),
        (ConnectionError("failed to connect to all addresses; connection refused"), True),
        (RuntimeError("[StatusCode.UNAVAILABLE] Socket closed"), True),
        (
            RuntimeError(
                "Failed to process the request(s) for model 'm_text', message: model 'm' is not healthy"
            ),
            True,
        ),
        (RuntimeError("Request for unknown model: 'm' has no available versions"), True),
        (ValueError("bad shape"), False),
        (RuntimeError("invalid input: question is empty"), False),
    ],
)
def test_one_retry_classification(exc, expected):
    assert retryable(exc) is expected


@pytest.mark.parametrize("cls", [TritonClient, ReplicaSet])
def test_both_transports_offer_the_protocol(cls):
    """Methods as methods; attributes and properties as properties or as attributes that
    __init__ sets (the instances need a live server: tests/server/test_replicas.py uses them)."""
    import inspect

    init = inspect.getsource(cls.__init__)
    for name, member in vars(Transport).items():
        if name.startswith("_"):
            continue
        if callable(member) and not isinstance(member, property):
            assert callable(getattr(cls, name, None)), f"{cls.__name__} lacks the method {name}"
        else:
            assert isinstance(getattr(cls, name, None), property) or f"self.{name}" in init, (
                cls.__name__,
                name,
            )
    for name in Transport.__annotations__:
        assert isinstance(getattr(cls, name, None), property) or re.search(rf"self\.{name}\b", init), (
            cls.__name__,
            name,
        )
