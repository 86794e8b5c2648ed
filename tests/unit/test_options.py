"""A call's options have one definition (engine.pipeline.inputs.CallOptions) with one meaning, and
every surface takes exactly those: the Python API, `prune run`'s flags, `/v1/prune`'s
body, the text model's inputs, batch-file fields and the three adapters. A surface that
drifts (an option missing, renamed, or with its own meaning) fails here."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InputError
from engine.pipeline.families import get_family
from engine.pipeline.inputs import OPTION_NAMES, CallOptions
from engine.pipeline.option_schema import option_help, option_type

pytestmark = pytest.mark.unit


def test_defaults_checks_and_one_meaning_of_off():
    o = CallOptions()
    assert all(getattr(o, n) is None for n in OPTION_NAMES if n != "reorder") and o.reorder is False
    assert o.given() == {}
    o = CallOptions.of(threshold=np.float32(0.25), alpha=-0.3, passage_margin=-5, top_k=np.int64(3))
    assert o.given() == {"threshold": 0.25, "alpha": -1.0, "passage_margin": -1.0, "top_k": 3}
    assert type(o.threshold) is float and type(o.top_k) is int
    assert CallOptions.of(o, top_k=None).top_k is None and CallOptions.of(o).threshold == 0.25
    for bad, message in [
        ({"threshold": 2}, "threshold must be in"),
        ({"alpha": math.nan}, "alpha must be a finite"),
        ({"passage_margin": math.inf}, "passage_margin must be a finite"),
        ({"title": "top"}, "title must be one of"),
        ({"windows": "tokens"}, "windows must be one of"),
        ({"splitter": "spacy"}, "splitter must be one of"),
        ({"top_k": 0}, "top_k must be a positive"),
        ({"reorder": "yes"}, "reorder must be"),
        ({"lexical_weight": 1.5}, "lexical_weight must be in"),
        ({"colour": 1, "size": 2}, "unknown options 'colour', 'size'"),
    ]:
        with pytest.raises(InputError, match=message):
            CallOptions.of(**bad)
    with pytest.raises(Exception):
        o.threshold = 0.5  # frozen


def test_a_family_resolves_the_options_into_the_rules_a_call_runs():
    emb, os_ = get_family("embedding"), get_family("opensearch")
    r = emb.rules.resolve(CallOptions())
    assert (r.threshold, r.alpha, r.lexical_weight, r.passage_margin, r.windows, r.title) == (
        0.83,
        0.0,
        0.5,
        0.1,
        "sentences",
        "none",
    )
    r = emb.rules.resolve(
        CallOptions.of(lexical_weight=0, alpha=-1, passage_margin=-1, title="first_sentence")
    )
    assert (r.threshold, r.alpha, r.lexical_weight, r.passage_margin, r.title) == (
        0.87,
        None,
        0.0,
        None,
        "first_sentence",
    )
    r = os_.rules.resolve(CallOptions.of(alpha=0.2, threshold=0.4))
    assert (r.threshold, r.alpha, r.windows, r.passage_margin) == (0.4, 0.2, "reference", None)


# ---------------------------------------------------------------------- every surface


def test_every_surface_takes_every_option_by_its_name():
    from engine.cli import build_parser
    from engine.http.app import PruneRequest
    from engine.batchfile import OPTIONS
    from engine.triton.wire import OPTION_DATATYPES, TEXT_INPUTS

    # HTTP: a field per option, with the option's own description
    schema = PruneRequest.model_fields
    for name in OPTION_NAMES:
        assert schema[name].description == option_help(name), name
    # the text model: an input per option, of its type
    for name in OPTION_NAMES:
        assert TEXT_INPUTS[name] == (OPTION_DATATYPES[option_type(name)], [1])
    # batch files
    assert tuple(OPTIONS) == OPTION_NAMES
    # prune run: a flag per option
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    dests = {a.dest: a for a in run._actions}
    for name in OPTION_NAMES:
        assert name in dests and option_help(name) in dests[name].help, name
    # the Python API: every pruner takes CallOptions, or its names as keywords
    from engine.remote.http_client import HttpPruner
    from engine.protocol import PrunerProtocol
    from engine.pruner import Pruner
    from engine.remote.text_pruner import TritonTextPruner

    for cls in (Pruner, TritonTextPruner, HttpPruner, PrunerProtocol):
        for method in ("prune", "aprune"):
            params = inspect.signature(getattr(cls, method)).parameters
            assert "options" in params and any(p.kind is p.VAR_KEYWORD for p in params.values()), (
                cls,
                method,
            )
    # and every pruner has every member the protocol names (its attributes set in __init__)
    members = {n for n in vars(PrunerProtocol) if not n.startswith("_") or n in ("__enter__", "__exit__")}
    members |= set(PrunerProtocol.__annotations__)
    for cls in (Pruner, TritonTextPruner, HttpPruner):
        missing = {
            m for m in members if not hasattr(cls, m) and f"self.{m} =" not in inspect.getsource(cls.__init__)
        }
        assert not missing, (cls.__name__, missing)


def test_every_adapter_takes_every_option():
    from engine.integrations.adapter import ADAPTER_FIELDS, PruneOptions
    from engine.integrations.haystack import PruneRanker
    from engine.integrations.langchain import PruneCompressor
    from engine.integrations.llamaindex import PrunePostprocessor
    from engine.integrations.adapter import TOP_N

    for adapter in (
        PruneCompressor,
        PrunePostprocessor,
    ):  # top_k named top_n, as LangChain and LlamaIndex say
        missing = {TOP_N.get(n, n) for n in OPTION_NAMES + ADAPTER_FIELDS} - set(adapter.model_fields)
        assert not missing, (adapter.__name__, missing)

    class Never:
        def prune(self, *a, **k):
            raise AssertionError("not called")

    every = {n: None for n in OPTION_NAMES if n != "reorder"}
    ranker = PruneRanker(
        pruner=Never(), **every, reorder=True, keep_empty=True, pre="[", post="]", metadata_key="m"
    )
    assert ranker.options == PruneOptions.of(
        **every, reorder=True, keep_empty=True, pre="[", post="]", metadata_key="m"
    )
    opts = PruneOptions.of(alpha=-1, top_k=2, keep_empty=True)
    assert opts.call == CallOptions.of(alpha=-1, top_k=2) and opts.keep_empty


OPTIONS = st.builds(
    CallOptions,
    threshold=st.one_of(st.none(), st.floats(0, 1)),
    title=st.sampled_from([None, "first_sentence", "none"]),
    alpha=st.one_of(st.none(), st.floats(0, 1), st.just(-1.0)),
    top_k=st.one_of(st.none(), st.integers(1, 50)),
    reorder=st.booleans(),
    windows=st.sampled_from([None, "reference", "sentences"]),
    splitter=st.sampled_from([None, "engine", "reference"]),
    lexical_weight=st.one_of(st.none(), st.floats(0, 1)),
    passage_margin=st.one_of(st.none(), st.floats(0, 3), st.just(-1.0)),
)


@settings(max_examples=150, deadline=None)
@given(options=OPTIONS)
def test_the_wire_and_the_http_body_carry_options_unchanged(options):
    """What the text model's client sends is what its server reads (float32 on the wire),
    and `/v1/prune`'s body gives back the same options."""
    from engine.http.app import PruneRequest
    from engine.pipeline.inputs import Limits
    from engine.triton.wire import options_to_tensors, read_request

    tensors = {
        "question": np.array([b"q?"], dtype=np.object_),
        "passages": np.array([b"p."], dtype=np.object_),
        **options_to_tensors(options),
    }
    back = read_request(tensors.get, Limits()).options
    f32 = {
        k: float(np.float32(v)) if option_type(k) is float and v is not None else v
        for k, v in options.given().items()
    }
    assert back.given() == f32
    body = PruneRequest(question="q?", passages=["p."], **options.given())
    assert CallOptions.of(**{n: getattr(body, n) for n in OPTION_NAMES}) == options
