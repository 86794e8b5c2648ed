"""`prune run --input queries.jsonl --output results.jsonl`: one result line per input
line, in order, with the input's id; a bad line gets an error record and every other line
is processed; results equal `Pruner.prune` of the same query. On 4,000 lines made from
the RAG sample in tests/data."""

import json

import numpy as np
import pytest

from engine.batchfile import run_file
from engine.cli import main
from tests.utils import DATA

pytestmark = pytest.mark.server

RAG = DATA / "squad-dev-rag.jsonl"


def test_four_thousand_lines_with_bad_ones(pruners, tmp_path, capsys):
    rows = [json.loads(line) for line in RAG.read_text().splitlines()]
    lines, bad = [], {}
    for k in range(4_000):
        r = rows[k % len(rows)]
        lines.append(
            json.dumps(
                {"id": f"q{k}", "question": r["question"], "passages": [r["passages"][r["gold"]][:300]]}
            )
        )
    # bad lines, each answered by an error record for that line only
    bad[17] = "{not json"
    bad[1000] = json.dumps({"id": "no-question", "passages": ["A passage."]})
    bad[2000] = json.dumps({"id": "empty", "question": " ", "passages": ["A passage."]})
    bad[3000] = json.dumps({"id": "surrogate", "question": "q?", "passages": ["bad \ud800 text"]})
    bad[3999] = json.dumps({"id": "threshold", "question": "q?", "passages": ["x."], "threshold": 7})
    for k, text in bad.items():
        lines[k] = text
    src = tmp_path / "q.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.jsonl"
    pruner = pruners["opensearch"][0]
    code = main(
        [
            "run",
            "--model",
            str(pruner.backend.graph.parent),
            "--input",
            str(src),
            "--output",
            str(out),
            "--quiet",
        ]
    )
    assert code == 3  # some lines failed: not 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(got) == 4_000
    for k, rec in enumerate(got):
        if k in bad:
            assert "error" in rec and rec["line"] == k + 1
            assert rec["id"] == (k + 1 if k == 17 else json.loads(lines[k])["id"])  # the line's own id
        else:
            assert rec["id"] == f"q{k}" and len(rec["results"]) == 1
    assert "not valid JSON" in got[17]["error"] and "no question" in got[1000]["error"]
    assert "question is empty" in got[2000]["error"] and "lone surrogate" in got[3000]["error"]
    assert "threshold" in got[3999]["error"]
    for k in (0, 1, 499, 2001, 3998):  # same as one query at a time
        q = json.loads(lines[k])
        exp = pruner.prune(q["question"], q["passages"])[0]
        res = got[k]["results"][0]
        assert res["pruned_context"] == exp.pruned_context
        np.testing.assert_allclose(
            [s["probability"] for s in res["sentences"]], [s.probability for s in exp.sentences], atol=1e-5
        )


def test_batch_file_through_a_text_model(server, pruners, tmp_path):
    import io
    from engine.pruner import Pruner

    queries = [
        {
            "id": i,
            "question": f"When was stadium {i} built?",
            "context": f"The stadium {i} was built in {1900 + i}. It holds {i} people.",
        }
        for i in range(30)
    ]
    src = io.StringIO("\n".join(json.dumps(q) for q in queries) + "\n\n")
    sink = io.StringIO()
    stats = run_file(Pruner.connect(server.grpc_url, "opensearch_text"), src, sink, group=8, progress=False)
    assert stats["lines"] == 30 and stats["errors"] == 0
    got = [json.loads(line) for line in sink.getvalue().splitlines()]
    assert [g["id"] for g in got] == list(range(30))
    exp = pruners["opensearch"][0].prune(queries[7]["question"], [queries[7]["context"]])[0]
    assert got[7]["results"][0]["pruned_context"] == exp.pruned_context


BROKEN = [
    ({"id": "broken", "question": 5, "passages": "x"}, "passages must be a list of strings"),
    ({"id": "no-question", "passages": ["A passage."]}, "the line has no question"),
    ({"id": 7, "question": 5, "passages": ["A passage."]}, "question must be a str, got int"),
    (
        {"id": "bad-option", "question": "q?", "passages": ["x."], "top_k": 0},
        "top_k must be a positive integer",
    ),
    (
        {"question": "q?", "passages": ["x."], "title": "always"},
        "title must be one of",
    ),  # no id: the line number
    (
        {"id": "typo", "question": "q?", "passages": ["x."], "treshold": 0.2},
        "unknown option 'treshold'",
    ),  # as in Python
]


@pytest.mark.parametrize("where", ["in-process", "text model"])
def test_an_error_record_keeps_the_lines_id(where, pruners, request, tmp_path):
    """Whatever is wrong with a JSON line that has an id, its error record carries that id."""
    import io
    from engine.pruner import Pruner

    pruner = (
        pruners["opensearch"][0]
        if where == "in-process"
        else Pruner.connect(request.getfixturevalue("server").grpc_url, "opensearch_text")
    )
    good = {"id": "good", "question": "When was it built?", "passages": ["It was built in 1923."]}
    lines = [json.dumps(good)] + [json.dumps(row) for row, _ in BROKEN] + ["[1, 2]"]
    sink = io.StringIO()
    stats = run_file(pruner, io.StringIO("\n".join(lines) + "\n"), sink, group=3, progress=False)
    got = [json.loads(line) for line in sink.getvalue().splitlines()]
    assert stats["lines"] == len(lines) and stats["errors"] == len(BROKEN) + 1
    assert got[0]["id"] == "good" and len(got[0]["results"]) == 1
    for k, (row, message) in enumerate(BROKEN, start=1):
        assert got[k] == {"id": row.get("id", k + 1), "line": k + 1, "error": got[k]["error"]}
        assert message in got[k]["error"], got[k]
    assert got[-1]["id"] == len(lines) and "expected a JSON object" in got[-1]["error"]


def test_a_line_sets_the_lexical_weight(pruners, tmp_path):
    """`lexical_weight` per line, as per call: 0 is the embedding model alone."""
    pruner = pruners["embedding"][0]
    q = "When was the stadium built?"
    docs = ["The stadium was built in 1923. It holds 80,000 people. Its roof came later."]
    src = tmp_path / "q.jsonl"
    src.write_text(
        json.dumps({"id": "default", "question": q, "passages": docs})
        + "\n"
        + json.dumps({"id": "alone", "question": q, "passages": docs, "lexical_weight": 0})
        + "\n"
    )
    out = tmp_path / "r.jsonl"
    assert (
        main(
            [
                "run",
                "--model",
                str(pruner.backend.graph.parent),
                "--input",
                str(src),
                "--output",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    got = [json.loads(line)["results"][0] for line in out.read_text().splitlines()]
    for rec, weight in zip(got, (0.5, 0.0)):
        exp = pruner.prune(q, docs, lexical_weight=weight)[0]
        assert rec["lexical_weight"] == weight and rec["threshold"] == exp.threshold
        assert [s["probability"] for s in rec["sentences"]] == pytest.approx(
            [s.probability for s in exp.sentences]
        )


BUDGET_Q = "What goes on the bottom of the pie?"
BUDGET_DOCS = [
    "Shepherd's pie. In early cookery books, the dish was a means of using leftover roasted meat. "
    "The pie dish was lined on the sides and bottom with mashed potato.",
    "Paris is the capital of France. It has many museums. The Louvre is the largest of them.",
    "The river flows through the valley. Scientists measured the water every hour.",
]


def test_a_budget_works_alike_in_process_over_http_from_a_batch_file_and_through_the_text_model(
    pruners, server, tmp_path
):
    """budget_tokens (#57) on every surface: the same kept sentences in-process, over /v1/prune and
    TEI's /rerank, from a batch file; through Triton's text model with a named tokenizer (the
    model's own stays on the server, which the client says). Counted here by the tokenizer
    library on the export's tokenizer.json, not by the engine."""
    import httpx
    from tokenizers import Tokenizer

    from engine.errors import InputError
    from engine.pruner import Pruner
    from tests.utils import serve_api

    pruner = pruners["xprovence"][0]
    folder = pruner.backend.graph.parent
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokens = lambda t: len(tok.encode(t, add_special_tokens=False).ids) if t else 0  # noqa: E731
    whole = pruner.prune(BUDGET_Q, BUDGET_DOCS, threshold=0.0)
    budget = sum(tokens(r.pruned_context) for r in whole) // 2
    local = pruner.prune(BUDGET_Q, BUDGET_DOCS, threshold=0.0, budget_tokens=budget)
    kept = [r.pruned_context for r in local]
    assert 0 < sum(tokens(t) for t in kept) <= budget < sum(tokens(r.pruned_context) for r in whole)
    assert all(r.budget.tokenizer == "model" and r.budget.tokens == budget for r in local)
    assert sum(r.budget.cut for r in local) > 0
    with serve_api(pruner) as url:
        body = {"question": BUDGET_Q, "passages": BUDGET_DOCS, "threshold": 0.0, "budget_tokens": budget}
        got = httpx.post(f"{url}/v1/prune", json=body, timeout=60).json()["results"]
        assert [r["pruned_context"] for r in got] == kept
        assert [r["budget"] for r in got] == [r.budget.to_dict() for r in local]
        tei = httpx.post(
            f"{url}/rerank",
            json={"query": BUDGET_Q, "texts": BUDGET_DOCS, "budget_tokens": budget},
            timeout=60,
        ).json()
        at_defaults = pruner.prune(BUDGET_Q, BUDGET_DOCS, budget_tokens=budget)
        assert {r["index"]: r["pruned_text"] for r in tei} == {r.index: r.pruned_context for r in at_defaults}
        bad = httpx.post(f"{url}/v1/prune", json={**body, "budget_tokens": 0}, timeout=60)
        assert bad.status_code == 422 and "budget_tokens must be a positive integer" in bad.text
    src, out = tmp_path / "q.jsonl", tmp_path / "r.jsonl"
    src.write_text(
        json.dumps(
            {
                "id": 1,
                "question": BUDGET_Q,
                "passages": BUDGET_DOCS,
                "threshold": 0.0,
                "budget_tokens": budget,
            }
        )
        + "\n"
    )
    assert main(["run", "--model", str(folder), "--input", str(src), "--output", str(out), "--quiet"]) == 0
    line = json.loads(out.read_text())["results"]
    assert [r["budget"] for r in line] == [r.budget.to_dict() for r in local]
    remote = Pruner.connect(server.grpc_url, "xprovence_text")
    with pytest.raises(InputError, match="name a budget_tokenizer"):
        remote.prune(BUDGET_Q, BUDGET_DOCS, threshold=0.0, budget_tokens=budget)
    named = str(folder / "tokenizer.json")
    through = remote.prune(BUDGET_Q, BUDGET_DOCS, threshold=0.0, budget_tokens=budget, budget_tokenizer=named)
    here = pruner.prune(BUDGET_Q, BUDGET_DOCS, threshold=0.0, budget_tokens=budget, budget_tokenizer=named)
    assert [r.pruned_context for r in through] == [r.pruned_context for r in here]
    assert [r.pruned_context for r in here] == kept  # the same tokenizer, named: the same cut
