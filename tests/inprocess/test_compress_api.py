"""`POST /v1/compress` (its handler in engine/http/app.py, its body types in engine/http/compress_api.py): LLMLingua-2 over HTTP in front of the
Compressor, on a tiny checkpoint's export: the answer is `Compressor.compress`'s result on the
same input, bad input is 422 naming the field, and each model kind's app refuses the other's
routes with a 404 that says what is loaded."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from engine.http.app import ApiConfig, create_app  # noqa: E402

pytestmark = pytest.mark.inprocess

EN = (
    "The council met on Tuesday to talk about the old bridge.\nMost members wanted a new one, "
    "but the budget was small. Why not repair it? The engineer said that repairs would cost 2.5 "
    "million and last ten years! In the end they asked for a second report."
)
PT = "Ontem a câmara discutiu a velha ponte. A maioria queria uma nova, mas o orçamento era pequeno."
ZH = "昨天市议会开会讨论旧桥的问题。大多数人希望建一座新桥，但是预算很少。"


@pytest.fixture(scope="module")
def compressor(lingua_exports):
    from engine.compressor import Compressor

    return Compressor.load(lingua_exports["xlm-roberta", "fp32"], threads=1)


@pytest.fixture(scope="module")
def client(compressor):
    with TestClient(create_app(compressor, ApiConfig(model_name="lingua-tiny")).app) as c:
        yield c


BODIES = [
    {"context": EN, "rate": 0.33, "force_tokens": ["\n", "?"]},
    {
        "context": EN + "\n" + PT,
        "target_token": 20,
        "force_tokens": ["\n", "million and"],
        "return_word_label": True,
    },
    {"context": [EN, PT, ZH], "rate": 0.5, "context_level_rate": 0.7, "force_context_ids": [2]},
    {"context": [EN, PT], "use_context_level_filter": False, "target_token": 30, "drop_consecutive": True},
    {"context": PT, "rate": 0.5, "force_reserve_digit": True, "token_to_word": "first"},
]


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_the_answer_is_the_compressors_result(client, compressor, body):
    options = {k: v for k, v in body.items() if k != "context"}
    expected = json.loads(json.dumps(compressor.compress(body["context"], **options).to_dict()))
    got = client.post("/v1/compress", json=body)
    assert got.status_code == 200, got.text
    assert got.json() == expected
    assert ("fn_labeled_original_prompt" in got.json()) == bool(body.get("return_word_label"))


@pytest.mark.parametrize(
    "body, error",
    [
        ({"context": EN, "ratee": 0.5}, "unknown field 'ratee'; did you mean 'rate'?"),
        ({"context": EN, "rate": 1.5}, "rate must be a number in (0, 1], got 1.5"),
        ({"context": EN, "target_token": 0}, "target_token must be a positive integer, or -1 for none"),
        ({"context": []}, "context must be a string or a non-empty list of strings"),
        ({"context": "   "}, "context is empty: nothing to compress"),
        ({"context": EN, "token_to_word": "last"}, "token_to_word: Input should be 'mean' or 'first'"),
        ({"context": EN, "force_tokens": "\n"}, "force_tokens: Input should be a valid list"),
        ({"rate": 0.5}, "context: Field required"),
        ({"context": EN, "force_tokens": [str(i) for i in range(101)]}, "at most 100 force_tokens, got 101"),
    ],
)
def test_bad_input_is_422_naming_what_is_wrong(client, body, error):
    got = client.post("/v1/compress", json=body)
    assert got.status_code == 422 and error in got.json()["error"], got.text


def test_the_call_limits_are_the_pruners(client, compressor, monkeypatch):
    from engine.pipeline.inputs import Limits

    monkeypatch.setattr(compressor, "limits", Limits(max_passages=2, max_chars=300))
    got = client.post("/v1/compress", json={"context": [EN, EN]})
    assert got.status_code == 422 and "more than 300 characters (passed at context 1)" in got.json()["error"]
    got = client.post("/v1/compress", json={"context": ["a", "b", "c"]})
    assert got.status_code == 422 and "3 contexts in one call; the limit is 2" in got.json()["error"]


def test_a_compressor_offers_no_pruning_route_and_says_what_it_is(client):
    for path, body in [
        ("/v1/prune", {"question": "q", "passages": [EN]}),
        ("/rerank", {"query": "q", "texts": [EN]}),
        ("/v2/rerank", {"query": "q", "documents": [EN]}),
        ("/v1/highlight", {"question": "q", "context": EN}),
    ]:
        got = client.post(path, json=body)
        assert got.status_code == 404 and got.json()["error_type"] == "NotOffered", got.text
        assert (
            f"(lingua-tiny) is an LLMLingua-2 compressor: it serves POST /v1/compress, not {path}"
            in got.json()["error"]
        )
    info = client.get("/info").json()
    assert (info["kind"], info["family"], info["model"], info["routes"]) == (
        "compressor",
        "llmlingua2",
        "lingua-tiny",
        ["/v1/compress"],
    )
    assert info["defaults"]["rate"] == 0.5 and info["defaults"]["force_tokens"] == []
    assert "onnxruntime" in info["engine"] and info["tokenizer"] == "sentencepiece"
    assert client.get("/health").json()["status"] == "ok"
    assert 'route="/v1/compress",status="200"' in client.get("/metrics").text


def test_a_pruner_does_not_offer_compress():
    from engine.pipeline.families import FAMILIES
    from engine.pipeline.inputs import Limits

    class Stub:
        family, limits, max_length = FAMILIES["xprovence"], Limits(), 512

        def prune(self, question, passages, options=None, **kwargs):
            return []

        def describe(self):
            return "a stub"

    with TestClient(create_app(Stub(), ApiConfig(model_name="pruner")).app) as c:
        got = c.post("/v1/compress", json={"context": EN})
        assert got.status_code == 404
        assert (
            "(pruner) is a pruning model (family xprovence): /v1/compress needs an LLMLingua-2"
            in got.json()["error"]
        )
        assert c.get("/info").json()["family"] == "xprovence"


def test_prune_api_knows_a_compressor_from_a_pruner(lingua_checkpoints, lingua_exports, tmp_path):
    from engine.models.loading import ModelKind, model_kind

    def is_compressor(folder):
        return model_kind(folder) is ModelKind.COMPRESSOR

    assert is_compressor(lingua_checkpoints["bert"]) and is_compressor(lingua_exports["bert", "int8"])
    (tmp_path / "manifest.json").write_text('{"format": "prune-engine/1", "family": "xprovence"}')
    assert not is_compressor(tmp_path) and not is_compressor(tmp_path / "absent")


def test_prune_compress_input_jsonl_is_the_http_bodies_line_by_line(
    compressor, lingua_exports, tmp_path, capsys
):
    from engine.cli import main

    lines = [
        json.dumps({"id": "a", **BODIES[0]}),
        json.dumps(BODIES[2]),
        json.dumps({"id": 7, "context": EN, "ratee": 0.5}),
        "{not json",
        json.dumps({"id": "x", "context": EN, "rate": 1.5}),
        json.dumps({"id": "d", "context": PT}),
    ]
    source = tmp_path / "calls.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    model = str(lingua_exports["xlm-roberta", "fp32"])
    args = ["compress", "--model", model, "--input", str(source), "--output", str(out), "--threads", "1"]
    assert main([*args, "--rate", "0.4"]) == 3  # some lines failed, as prune run --input says it
    got = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    want = lambda body, **defaults: json.loads(  # noqa: E731
        json.dumps(
            compressor.compress(
                body["context"], **{**defaults, **{k: v for k, v in body.items() if k != "context"}}
            ).to_dict()
        )
    )
    assert got[0] == {"id": "a", **want(BODIES[0])}
    assert got[1] == {"id": 2, **want(BODIES[2], rate=0.4)}
    assert got[2] == {"id": 7, "line": 3, "error": "unknown field 'ratee'; did you mean 'rate'?"}
    assert got[3]["id"] == 4 and got[3]["line"] == 4 and got[3]["error"].startswith("not valid JSON")
    assert got[4] == {"id": "x", "line": 5, "error": "rate must be a number in (0, 1], got 1.5"}
    assert got[5] == {"id": "d", **want({"context": PT}, rate=0.4)}
    assert "6 lines, 3 errors" in capsys.readouterr().err
    assert main(["compress", "--model", model, "--text", EN, "--output", str(out)]) == 2
    assert "--output is for --input" in capsys.readouterr().err


def test_a_pruner_with_a_compressor_beside_it_serves_both_jobs(exported, compressor):
    """`prune api --model PRUNER --compressor DIR`: one address answers /v1/prune and /v1/compress
    (the compressor loaded beside the pruner), and /info names both."""
    from engine.pruner import Pruner

    pruner = Pruner.load(exported["provence"], threads=1, compressor=compressor)
    config = ApiConfig(model_name="provence-tiny", compressor_name="lingua-tiny")
    with TestClient(create_app(pruner, config).app) as c:
        body = BODIES[0]
        got = c.post("/v1/compress", json=body)
        assert got.status_code == 200, got.text
        options = {k: v for k, v in body.items() if k != "context"}
        assert got.json() == json.loads(json.dumps(compressor.compress(body["context"], **options).to_dict()))
        pruned = c.post("/v1/prune", json={"question": "Why not repair it?", "passages": [EN]})
        assert pruned.status_code == 200 and pruned.json()["model"] == "provence-tiny"
        info = c.get("/info").json()
        assert info["family"] == "provence" and info["model"] == "provence-tiny"
        assert info["compressor"] == {
            "model": "lingua-tiny",
            "family": "llmlingua2",
            "tokenizer": "sentencepiece",
            "engine": compressor.describe(),
            "routes": ["/v1/compress"],
        }
    pruner.close()
