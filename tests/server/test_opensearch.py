"""OpenSearch's semantic highlighter calls the engine as its remote model.

No OpenSearch can be installed here (the caller is Java inside the ml-commons and
neural-search plugins), so the test does what they do: it renders the connectors' own
`request_body` templates the way ML Commons renders them (`${parameters.X:-default}`, a
string parameter JSON-escaped, a batch's `inputs` a raw JSON array), posts the body, and
checks the answer as neural-search's parser and 3.7's HighlightTagApplier check it (a JSON
object with `highlights`; integer spans in UTF-16 code units, 0 <= start < end <= length,
sorted, no duplicate start, no overlap; a batch's lists one per input, in order). The
highlighted text must be what `/v1/prune` keeps for that document alone."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("fastapi")
import httpx  # noqa: E402

from tests.utils import serve_api  # noqa: E402

pytestmark = pytest.mark.server

#: neural-search src/test/resources/highlight/RemoteTorchServeConnector.json's request_body
TORCHSERVE = (
    '{ "question": "${parameters.question:-}", "context": "${parameters.context:-}", '
    '"inputs": ${parameters.inputs:-null} }'
)
#: ml-commons' sagemaker_semantic_highlighter_standard_blueprint.md's request_body
SAGEMAKER = (
    '{ "question": "${parameters.question:-}", "context": "${parameters.context:-}", '
    '"inputs": ${parameters.inputs:-[]} }'
)

QUESTION = "When was the stadium built?"
DOCS = [
    'The stadium was built in 1923. It holds 80,000 people. 🏟️ Its roof, called "the lid", came later.',
    "😀 Émile said 中文句子 twice, humming 𝄞𝅘𝅥𝅮. The stadium was built in 1923 by the city. Paris is in France.",
    "Nothing here answers. The weather was fine.",
]


def render(template: str, parameters: dict[str, str]) -> str:
    """A connector's request_body as ML Commons fills it: each `${parameters.X:-default}`
    is the parameter's value (strings JSON-escaped, as escapeRemoteInferenceInputData does;
    a JSON value as it is), else the default."""

    def value(m: re.Match) -> str:
        name, default = m.group(1), m.group(2) or ""
        if name not in parameters:
            return default
        v = parameters[name]
        return v if name == "inputs" else json.dumps(v)[1:-1]

    return re.sub(r"\$\{parameters\.(\w+)(?::-([^}]*))?\}", value, template)


def utf16(text: str) -> bytes:
    return text.encode("utf-16-le")


def checked_spans(text: str, spans: list) -> list[str]:
    """HighlightTagApplier's checks (OpenSearch 3.7); the highlighted texts, cut at Java's
    string indices (UTF-16 code units)."""
    length = len(utf16(text)) // 2
    out, prev_end, starts = [], 0, set()
    for s in spans:
        start, end = s["start"], s["end"]
        assert isinstance(start, int) and isinstance(end, int), s
        assert 0 <= start < end <= length, (s, length)
        assert start >= prev_end and start not in starts, spans  # sorted, no overlap
        starts.add(start)
        prev_end = end
        out.append(utf16(text)[2 * start : 2 * end].decode("utf-16-le"))
    return out


@pytest.fixture(scope="module", params=["opensearch", "embedding"])
def served(request, pruners):
    pruner = pruners[request.param][0]
    with serve_api(pruner) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield pruner, client


def _kept(client: httpx.Client, question: str, context: str, **options) -> list[str]:
    """What /v1/prune keeps for the document alone."""
    r = client.post("/v1/prune", json={"question": question, "passages": [context], **options})
    assert r.status_code == 200, r.text
    return [s["text"] for s in r.json()["results"][0]["sentences"] if s["kept"]]


@pytest.mark.parametrize("template", [TORCHSERVE, SAGEMAKER], ids=["torchserve", "sagemaker"])
@pytest.mark.parametrize(
    "path", ["/predictions/semantic_highlighter", "/v1/highlight", "/opensearch/highlight"]
)
def test_one_document_as_opensearch_sends_it(served, template, path):
    _, client = served
    for doc in DOCS:
        body = render(template, {"question": QUESTION, "context": doc})
        r = client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert isinstance(answer, dict) and isinstance(answer["highlights"], list)
        assert all(isinstance(s, dict) for s in answer["highlights"])
        assert checked_spans(doc, answer["highlights"]) == _kept(client, QUESTION, doc)
    assert any(
        checked_spans(
            DOCS[0],
            client.post(
                path,
                content=render(template, {"question": QUESTION, "context": DOCS[0]}),
                headers={"Content-Type": "application/json"},
            ).json()["highlights"],
        )
    )


@pytest.mark.parametrize("template", [TORCHSERVE, SAGEMAKER], ids=["torchserve", "sagemaker"])
def test_a_batch_answers_one_list_per_input_in_order(served, template):
    _, client = served
    inputs = [{"question": QUESTION, "context": d} for d in DOCS] + [
        {"question": "Who said it?", "context": DOCS[1]}
    ]
    body = render(template, {"inputs": json.dumps(inputs)})
    r = client.post(
        "/predictions/semantic_highlighter", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200, r.text
    got = r.json()["highlights"]
    assert isinstance(got, list) and len(got) == len(inputs) and all(isinstance(g, list) for g in got)
    for item, spans in zip(inputs, got):
        assert checked_spans(item["context"], spans) == _kept(client, item["question"], item["context"])


def test_offsets_count_utf16_code_units_outside_the_basic_plane(served):
    _, client = served
    doc = "😀😀 The stadium was built in 1923. 🏟️ It holds people."
    r = client.post("/v1/highlight", json={"question": QUESTION, "context": doc, "threshold": 0.0})
    spans = r.json()["highlights"]
    end = doc.index("people.") + len("people.")  # in code points; three emoji before it
    assert spans and spans[-1]["end"] == len(utf16(doc[:end])) // 2 == end + 3
    assert checked_spans(doc, spans) == _kept(client, QUESTION, doc, threshold=0.0)


def test_bad_requests_are_clear_errors_and_the_server_keeps_answering(served):
    _, client = served
    for body, status in (
        ({"context": "text only"}, 422),
        ({"question": "q", "context": "c", "threshold": 2}, 422),
        ({"inputs": [{"question": "q"}]}, 422),
        ("not json", 422),
        ({"inputs": [{"question": "q", "context": "c"}] * 10_001}, 422),
    ):
        r = client.post(
            "/v1/highlight",
            **(
                {"content": body, "headers": {"Content-Type": "application/json"}}
                if isinstance(body, str)
                else {"json": body}
            ),
        )
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"], r.text
    ok = client.post("/v1/highlight", json={"question": QUESTION, "context": DOCS[0]})
    assert ok.status_code == 200
