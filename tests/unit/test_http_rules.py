"""The HTTP API's request rules, without a model (a stub pruner behind the real app): the
engine's own bodies refuse an unknown field naming the nearest known one, TEI's and Cohere's
ignore it as their anchors do, tags come in pairs; the model service's parts (its proto's
name, a start that fails still closing the state); and each rule's one home in the source."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from engine.pipeline.families import FAMILIES
from engine.pipeline.inputs import Limits

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from engine.http.app import ApiConfig, create_app  # noqa: E402

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "Why does sourdough taste sour?"


class Stub:
    """A pruner with no model: every call answers no results (what the rules need)."""

    family, limits, max_length = FAMILIES["embedding"], Limits(), 256

    def prune(self, question, passages, options=None, **kwargs):
        return []

    def prune_many(self, queries):
        return [[] for _ in queries]

    def describe(self):
        return "a stub"


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Stub(), ApiConfig()).app) as c:
        yield c


@pytest.mark.parametrize(
    "route, body, error",
    [
        (
            "/v1/prune",
            {"question": QUESTION, "passages": ["x"], "threshhold": 0.99},
            "unknown field 'threshhold'; did you mean 'threshold'?",
        ),
        (
            "/v1/prune",
            {"question": QUESTION, "passages": ["x"], "lexical_wieght": 0},
            "unknown field 'lexical_wieght'; did you mean 'lexical_weight'?",
        ),
        (
            "/v1/prune",
            {"question": QUESTION, "pasages": ["x"]},
            "unknown field 'pasages'; did you mean 'passages'?",
        ),
        (
            "/v1/prune",
            {"question": QUESTION, "passages": ["x"], "zzz": 1},
            "unknown field 'zzz'; the fields are question, ",
        ),
        (
            "/v1/highlight",
            {"question": QUESTION, "context": "x", "treshold": 0.5},
            "unknown field 'treshold'; did you mean 'threshold'?",
        ),
        (
            "/opensearch/highlight",
            {"question": QUESTION, "context": "x", "inputz": []},
            "unknown field 'inputz'; did you mean 'inputs'?",
        ),
        (  # TEI's own unknown fields are ignored, as TEI does; a misspelt engine extra is not
            "/rerank",
            {"query": QUESTION, "texts": ["x"], "budget_token": 10},
            "unknown engine extra 'budget_token'; did you mean 'budget_tokens'?",
        ),
        (
            "/rerank",
            {"query": QUESTION, "texts": ["x"], "return_sentence": True},
            "unknown engine extra 'return_sentence'; did you mean 'return_sentences'?",
        ),
    ],
)
def test_the_engines_own_bodies_refuse_an_unknown_field_naming_the_nearest(client, route, body, error):
    r = client.post(route, json=body)
    assert r.status_code == 422 and r.json()["error"].startswith(error), r.text


@pytest.mark.parametrize(
    "route, body",
    [
        ("/rerank", {"query": QUESTION, "texts": [], "truncate": True, "normalize": True, "anything": 1}),
        (
            "/v2/rerank",
            {"model": "m", "query": QUESTION, "documents": [], "max_tokens_per_doc": 512, "priority": 1},
        ),
        (
            "/v1/rerank",
            {
                "model": "m",
                "query": QUESTION,
                "documents": [],
                "rank_fields": ["text"],
                "max_chunks_per_doc": 1,
            },
        ),
    ],
)
def test_tei_and_cohere_bodies_ignore_fields_of_their_own_as_their_anchors_do(client, route, body):
    """TEI's RerankRequest is a serde struct without deny_unknown_fields; Cohere's published
    schema does not close its body, and its SDKs send fields the v2 schema lacks."""
    assert client.post(route, json=body).status_code == 200


@pytest.mark.parametrize(
    "tags, error", [({"pre": "<b>"}, "pre without post"), ({"post": "</b>"}, "post without pre")]
)
def test_tags_come_in_pairs(client, tags, error):
    r = client.post("/v1/prune", json={"question": QUESTION, "passages": ["Sourdough is sour."], **tags})
    assert (
        r.status_code == 422 and r.json()["error"] == f"{error}: tags come in pairs (give both pre and post)"
    )
    assert (
        client.post(
            "/v1/prune", json={"question": QUESTION, "passages": [], "pre": "<b>", "post": "</b>"}
        ).status_code
        == 200
    )


def test_the_vendored_proto_registers_under_its_package_path():
    pytest.importorskip("grpc_tools")
    from engine.http.milvus import proto_modules

    pb, _ = proto_modules()
    assert pb.DESCRIPTOR.name == "engine/http/proto/model_service.proto"
    assert pb.DESCRIPTOR.package == "milvus.proto.modelservice"


def test_a_model_service_that_cannot_start_still_closes_the_api():
    """The lifespan's start of Milvus's model service fails (its port taken): the worker pool
    and the health probe's thread are shut down all the same."""
    pytest.importorskip("grpc_tools")
    import socket
    from engine.errors import PruneError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        app = create_app(Stub(), ApiConfig(model_service=f"127.0.0.1:{taken.getsockname()[1]}")).app

        async def start():
            async with app.router.lifespan_context(app):
                pass

        with pytest.raises(PruneError, match="cannot listen"):
            asyncio.run(start())
    assert app.state.api.pool._shutdown


def _engine_sources() -> dict[str, ast.Module]:
    return {
        str(p.relative_to(ROOT)): ast.parse(p.read_text(encoding="utf-8"))
        for p in sorted((ROOT / "engine").rglob("*.py"))
    }


def test_one_request_to_options_builder():
    """A request's (or parsed flags') options become CallOptions in one place,
    CallOptions.of_attributes: no other module reads the options off an object by name."""
    homes = set()
    for path, tree in _engine_sources().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.DictComp, ast.ListComp, ast.GeneratorExp, ast.SetComp)):
                loops_options = any(
                    isinstance(g.iter, ast.Name) and g.iter.id == "OPTION_NAMES" for g in node.generators
                )
                reads = any(
                    isinstance(n, ast.Call) and getattr(n.func, "id", None) == "getattr"
                    for n in ast.walk(node)
                )
                if loops_options and reads:
                    homes.add(path)
    assert homes == {"engine/pipeline/inputs.py"}, homes


def test_one_count_limit_check():
    """Passages per call, documents or texts per request: `Limits.check_count` is the one
    refusal of a count over max_passages (`count > max_passages`; the HTTP API, the model
    service and the text model call it; the text-model client's `>=` cuts calls into requests)."""
    homes = set()
    for path, tree in _engine_sources().items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Compare)
                and isinstance(node.ops[0], ast.Gt)
                and any(
                    isinstance(n, ast.Attribute) and n.attr == "max_passages"
                    for n in ast.walk(node.comparators[0])
                )
            ):
                homes.add(path)
    assert homes == {"engine/pipeline/inputs.py"}, homes


def test_one_api_key_check():
    """The HTTP API and the model service ask ApiConfig.authorizes; nothing else compares a key."""
    users = {
        path
        for path, tree in _engine_sources().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "compare_digest"
    }
    assert users == {"engine/http/state.py"}, users
