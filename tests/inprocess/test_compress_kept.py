"""A pruning call that also compresses what it keeps (compress_rate, compress_target_token;
engine.pipeline.token_compress): the token compressor beside the pruner gives, on each returned
passage's pruned text, the words llmlingua 0.2.2's own PromptCompressor keeps on those texts; the
budget counts the compressed text; the same answer over Python, HTTP and `prune run`; clear errors
without a compressor or with a bad value."""

from __future__ import annotations

import json

import pytest

from engine.errors import InputError

pytestmark = pytest.mark.inprocess

QUESTION = "What did the council decide about the bridge?"
#: text the tiny checkpoint's vocabulary knows whole (no <unk>: llmlingua's text loses an unknown
#: character, the engine's spans keep it, so the characters would not compare)
PASSAGES = [
    "The council met on Tuesday to talk about the old bridge. Most members wanted a new one, but the "
    "budget was small. At the end they asked for a second report.",
    "Prices rose 3 percent in March. Wages grew more slowly than prices, and rents went up too.",
    "The engineer said that repairs would cost 2.5 million and last ten years! Nobody asked why.",
]
#: every sentence kept and no passage gated: what the compressor sees is each passage whole
ALL = dict(threshold=0.0, passage_margin=-1)


@pytest.fixture(scope="module")
def pruner(exported, lingua_checkpoints, tiktoken_offline):
    from engine.compressor import Compressor
    from engine.pruner import Pruner

    compressor = Compressor.load(lingua_checkpoints["xlm-roberta"], threads=1)
    return Pruner.load(exported["provence"], threads=1, compressor=compressor)


@pytest.fixture(scope="module")
def reference(lingua_checkpoints, tiktoken_offline):
    llmlingua = pytest.importorskip("llmlingua", reason="the dev extra's llmlingua==0.2.2")
    folder = lingua_checkpoints["xlm-roberta"]
    return llmlingua.PromptCompressor(model_name=str(folder), use_llmlingua2=True, device_map="cpu")


def _bare(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize("options", [dict(compress_rate=0.5), dict(compress_target_token=30)], ids=str)
def test_the_kept_text_is_compressed_as_llmlingua_compresses_it(pruner, reference, options):
    results = pruner.prune(QUESTION, PASSAGES, **ALL, **options)
    texts = [r.pruned_context for r in results]
    assert all(texts)
    args = (
        dict(rate=options["compress_rate"])
        if "compress_rate" in options
        else dict(target_token=options["compress_target_token"])
    )
    expected = reference.compress_prompt(texts, use_context_level_filter=False, **args)
    assert len(expected["compressed_prompt_list"]) == len(results)
    for r, want in zip(results, expected["compressed_prompt_list"]):
        # llmlingua joins its words by its tokenizer's rules, the engine with the passage's own
        # separators: the same characters kept, in the same order
        assert _bare(r.compressed_context) == _bare(want)
        assert len(r.compressed_context) < len(r.pruned_context)
        assert "".join(r.context[a:b] for a, b in r.compressed_spans) == _bare(r.compressed_context)
        assert r.pruned_context == r.to_dict()["pruned_context"]  # the sentences stay whole


def test_the_budget_counts_the_compressed_text(pruner):
    count = pruner.encoder.tokenizer
    plain = pruner.prune(QUESTION, PASSAGES, **ALL, budget_tokens=40)
    squeezed = pruner.prune(QUESTION, PASSAGES, **ALL, budget_tokens=40, compress_rate=0.4)

    def tokens(text: str) -> int:
        return len(count.encode(text, add_special_tokens=False).ids)

    assert sum(tokens(r.compressed_context) for r in squeezed) <= 40
    assert squeezed[0].budget.used == sum(tokens(r.compressed_context) for r in squeezed)
    # the same budget holds more sentences once they are compressed
    assert sum(s.kept for r in squeezed for s in r.sentences) > sum(
        s.kept for r in plain for s in r.sentences
    )
    # a sentence the budget cut takes its compressed words with it
    for r in squeezed:
        spans = [(s.start, s.end) for s in r.sentences if s.kept]
        assert all(any(lo <= a and b <= hi for lo, hi in spans) for a, b in r.compressed_spans)


def test_without_a_compressor_or_with_a_bad_value_the_call_is_refused(exported, pruner):
    from engine.pruner import Pruner

    alone = Pruner.load(exported["provence"], threads=1)
    with pytest.raises(InputError, match="--compressor"):
        alone.prune(QUESTION, PASSAGES, compress_rate=0.5)
    with pytest.raises(InputError, match=r"Compressor.load\(DIR\)"):
        Pruner.load(exported["provence"], threads=1, compressor="a/folder")
    assert alone.prune(QUESTION, PASSAGES)[0].compressed_context is None
    for bad in (0, 1.5, "half", True):
        with pytest.raises(InputError, match="compress_rate"):
            pruner.prune(QUESTION, PASSAGES, compress_rate=bad)
    with pytest.raises(InputError, match="compress_target_token"):
        pruner.prune(QUESTION, PASSAGES, compress_target_token=0)
    # a rate of 1 keeps every token: nothing to compress, no compressed text
    assert pruner.prune(QUESTION, PASSAGES, compress_rate=1)[0].compressed_context is None


def test_a_call_that_keeps_nothing_compresses_nothing(pruner):
    """Every passage emptied (threshold 1) with compress_rate: the call answers, each result's
    compressed text empty (the compressor, given no text, refused the call before), over Python
    and HTTP."""
    from fastapi.testclient import TestClient

    from engine.http.app import ApiConfig, create_app

    results = pruner.prune(QUESTION, PASSAGES, threshold=1.0, passage_margin=-1, compress_rate=0.5)
    assert [(r.pruned_context, r.compressed_context, r.compressed_spans) for r in results] == [
        ("", "", [])
    ] * 3
    body = {"question": QUESTION, "passages": PASSAGES, "threshold": 1.0, "compress_rate": 0.5}
    with TestClient(create_app(pruner, ApiConfig(model_name="p")).app) as c:
        reply = c.post("/v1/prune", json=body)
    assert reply.status_code == 200, reply.text
    assert [r["compressed_context"] for r in reply.json()["results"]] == ["", "", ""]


def test_http_and_prune_run_answer_as_python(pruner, exported, lingua_checkpoints, capsys):
    from fastapi.testclient import TestClient

    from engine.cli import main
    from engine.http.app import ApiConfig, create_app

    want = pruner.prune(QUESTION, PASSAGES, **ALL, compress_rate=0.5)
    body = {"question": QUESTION, "passages": PASSAGES, **ALL, "compress_rate": 0.5}
    with TestClient(create_app(pruner, ApiConfig(model_name="p")).app) as c:
        got = c.post("/v1/prune", json=body).json()["results"]
        plain = c.post("/v1/prune", json={"question": QUESTION, "passages": PASSAGES}).json()["results"]
    assert [g["compressed_context"] for g in got] == [w.compressed_context for w in want]
    assert [[tuple(s) for s in g["compressed_spans"]] for g in got] == [w.compressed_spans for w in want]
    assert "compressed_context" not in plain[0]
    argv = [
        "run",
        "--model",
        str(exported["provence"]),
        "--compressor",
        str(lingua_checkpoints["xlm-roberta"]),
    ]
    argv += ["--question", QUESTION, "--threshold", "0", "--passage-margin", "-1", "--compress-rate", "0.5"]
    assert main([*argv, "--json", *[x for p in PASSAGES for x in ("--context", p)]]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["compressed_context"] for r in out] == [w.compressed_context for w in want]


def test_teis_rerank_takes_the_compress_options_as_engine_extras(pruner):
    """TEI's /rerank with the engine extras compress_rate / compress_target_token: each text's
    compressed_text is what Python gives; a misspelt extra is refused, as /v1/prune refuses it."""
    from fastapi.testclient import TestClient

    from engine.http.app import ApiConfig, create_app

    with TestClient(create_app(pruner, ApiConfig(model_name="p")).app) as c:
        for extra in ({"compress_rate": 0.5}, {"compress_target_token": 12}):
            want = {r.index: r.compressed_context for r in pruner.prune(QUESTION, PASSAGES, **extra)}
            got = c.post("/rerank", json={"query": QUESTION, "texts": PASSAGES, **extra})
            assert got.status_code == 200, got.text
            assert {r["index"]: r.get("compressed_text") for r in got.json()} == want
            assert any(want.values())
        plain = c.post("/rerank", json={"query": QUESTION, "texts": PASSAGES}).json()
        assert all("compressed_text" not in r for r in plain)
        bad = c.post("/rerank", json={"query": QUESTION, "texts": PASSAGES, "compress_rates": 0.5})
        assert bad.status_code == 422 and "compress_rate" in bad.text
        assert (
            c.post("/rerank", json={"query": QUESTION, "texts": PASSAGES, "compress_rate": 2}).status_code
            == 422
        )


def test_prune_run_says_a_compressor_waits_for_a_rate_and_prints_no_empty_compressed_text(
    exported, lingua_checkpoints, capsys
):
    """`prune run --compressor DIR` without --compress-rate said nothing of the compressor it
    loaded, and with a rate printed an empty `compressed_context:` block under every emptied
    passage: a line now says the compressor waits for --compress-rate / --compress-target-token,
    and only a passage that keeps something shows its compressed text."""
    from engine.cli import main

    argv = [
        "run",
        "--model",
        str(exported["provence"]),
        "--compressor",
        str(lingua_checkpoints["xlm-roberta"]),
    ]
    argv += ["--question", QUESTION, *[x for p in PASSAGES for x in ("--context", p)]]
    assert main(argv) == 0
    out = capsys.readouterr()
    name = lingua_checkpoints["xlm-roberta"].name
    assert f"compressor {name} (LLMLingua-2" in out.err
    assert "--compress-rate or --compress-target-token runs it on what each call keeps" in out.err
    assert "compressed_context:" not in out.out
    for threshold, emptied in (("1", 3), ("0", 0)):
        assert (
            main([*argv, "--threshold", threshold, "--passage-margin", "-1", "--compress-rate", "0.5"]) == 0
        )
        out = capsys.readouterr()
        assert "is loaded beside the pruner" not in out.err  # a rate was given
        blocks = out.out.split("\n## passage ")[1:]
        assert sum("compressed_context:" not in b for b in blocks) == emptied, out.out
        for b in blocks:
            if "compressed_context:" in b:
                assert b.split("compressed_context:\n", 1)[1].strip(), b


def test_prune_apis_start_up_line_names_the_compressor(exported, lingua_checkpoints, capsys, monkeypatch):
    """`prune api --model MODEL --compressor DIR` said nothing of the compressor on start-up."""
    import uvicorn

    from engine.cli import main

    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: None)  # start-up only, no server
    argv = ["api", "--model", str(exported["provence"]), "--port", "0", "--threads", "1"]
    assert main([*argv, "--compressor", str(lingua_checkpoints["xlm-roberta"])]) == 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("prune api: ")]
    name = lingua_checkpoints["xlm-roberta"].name
    assert f"; compressor {name} (LLMLingua-2" in line and "compress_rate / compress_target_token" in line
    assert main(argv) == 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("prune api: ")]
    assert "compressor" not in line
