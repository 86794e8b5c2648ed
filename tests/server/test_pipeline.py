"""The retrieval pipeline on a real Milvus Lite database: index, ask, Milvus-shaped highlights.

A few hundred SQuAD passages (tests/data/squad-dev-rag.jsonl) are indexed with the
default model's ONNX encoder; the questions are asked through hybrid retrieval, reranking
and pruning, and every answer is checked against what the parts give on their own.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.utils import DATA, THREADS, processes_under

pytest.importorskip("pymilvus", reason="the [milvus] extra is part of the dev install")

from engine.errors import InputError  # noqa: E402
from engine.rag.retrieval import Pipeline, PipelineError
from engine.rag.documents import chunk_spans, read_documents
from engine.rag.highlight import semantic_highlight

pytestmark = pytest.mark.server

QUESTIONS = 16


@pytest.fixture(scope="module")
def encoder(default_cache):
    from engine.rag.embedder import Embedder

    return Embedder.load(default_cache["encoder"], threads=THREADS)


@pytest.fixture(scope="module")
def pruner(default_cache):
    from engine.pruner import Pruner

    return Pruner.load(default_cache["model"], threads=THREADS)


@pytest.fixture(scope="module")
def squad():
    rows = [json.loads(line) for line in (DATA / "squad-dev-rag.jsonl").open()][:QUESTIONS]
    ids: dict[str, str] = {}
    for q in rows:
        for i, p in enumerate(q["passages"]):
            ids.setdefault(p, f"{q['id']}-{i}")
    docs = [{"id": i, "text": t, "article": "squad"} for t, i in ids.items()]
    questions = [(q["question"], ids[q["passages"][q["gold"]]]) for q in rows]
    return docs, questions


@pytest.fixture(scope="module")
def rag(squad, encoder, pruner, tmp_path_factory):
    docs, _ = squad
    db = tmp_path_factory.mktemp("milvus") / "rag.db"
    pipe = Pipeline(db, pruner, encoder)
    report = pipe.index(docs)
    yield pipe, report
    pipe.close()
    assert not processes_under(db.parent), "the embedded Milvus server outlived Pipeline.close()"


def test_index_stores_every_passage_in_sentence_chunks(rag, squad):
    pipe, report = rag
    docs, _ = squad
    assert len(docs) >= 250 and report.documents == len(docs)
    rows = pipe.client.query(
        pipe.collection, filter="chunk >= 0", output_fields=["doc_id", "start", "end", "text"], limit=16384
    )
    assert len(rows) == report.chunks >= len(docs)
    by_id = {d["id"]: d["text"] for d in docs}
    for r in rows:
        assert by_id[r["doc_id"]][r["start"] : r["end"]] == r["text"]
    assert {r["doc_id"] for r in rows} == set(by_id)


def test_chunks_cover_the_text_within_the_token_budget(encoder):
    text = (
        "The first sentence is short. "
        + " ".join(f"word{i}" for i in range(700))
        + ". "
        + " ".join(f"Sentence {i} is a plain one about the weather." for i in range(40))
    )
    spans = chunk_spans(text, encoder, max_tokens=64)
    covered = np.zeros(len(text), dtype=int)
    for s, e in spans:
        covered[s:e] += 1
        assert encoder.token_counts([text[s:e]])[0] <= 64 + 2  # a cut sentence may re-tokenize by 1-2
    assert covered.max() == 1
    assert all(covered[i] == 1 for i, c in enumerate(text) if not c.isspace())
    # whole sentences stay whole: every chunk outside the long sentence ends a sentence,
    # and short sentences are packed several to a chunk
    long_start = text.index("word0")
    long_end = text.index("Sentence 0")
    outside = [(s, e) for s, e in spans if e <= long_start or s >= long_end]
    assert all(text[s:e].endswith(".") for s, e in outside)
    assert len([1 for s, e in outside if s >= long_end]) < 40 / 3
    assert len(spans) - len(outside) == pytest.approx(
        encoder.token_counts([text[long_start:long_end]])[0] / 64, abs=1
    )


def test_encoder_matches_sentence_transformers(encoder):
    """The ONNX encoder against the independent reference: sentence-transformers on the
    same checkpoint (its own pooling, normalisation and 256-token window)."""
    from sentence_transformers import SentenceTransformer
    from engine.models.default_model import default_checkpoint

    st = SentenceTransformer(default_checkpoint(), device="cpu")
    texts = [
        "What goes on the bottom of Shepherd's pie?",
        "北京是中国的首都。",
        "word " * 240,
        "The pie dish was lined on the sides and bottom with mashed potato.",
    ]
    ours = encoder.encode(texts)
    ref = st.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    assert encoder.max_length == st.max_seq_length == 256
    np.testing.assert_allclose(ours, ref, atol=1e-5)
    with pytest.raises(InputError, match="257 tokens|tokens; the encoder"):
        encoder.encode(["word " * 300])


def test_gold_passage_is_retrieved_for_most_questions(rag, squad):
    pipe, _ = rag
    _, questions = squad
    found = {mode: 0 for mode in ("hybrid", "dense", "bm25")}
    for q, gold in questions:
        for mode in found:
            found[mode] += any(h["entity"]["doc_id"] == gold for h in pipe.search(q, mode=mode, limit=20))
    assert found["hybrid"] >= 0.9 * len(questions), found
    assert found["dense"] >= 0.75 * len(questions) and found["bm25"] >= 0.75 * len(questions), found


def test_ask_reranks_by_the_pruners_score_and_prunes_as_prune_does(rag, squad, pruner):
    pipe, _ = rag
    _, questions = squad
    top1 = 0
    for n, (q, gold) in enumerate(questions):
        answer = pipe.ask(q, k=5, candidates=20)
        assert answer.candidates == 20 and len(answer.results) == 5
        scores = [r.reranking_score for r in answer.results]
        assert scores == sorted(scores, reverse=True)
        top1 += answer.results[0].id == gold
        if n >= 6:  # the suite's time: the first six calls are checked against prune() whole
            continue
        # the five returned are the five best of the candidates by the pruner's own score
        cands = pipe.search(q, mode="hybrid", limit=20)
        together = pruner.prune(q, [h["entity"]["text"] for h in cands])  # one call, as ask() makes
        best = sorted((r.reranking_score for r in together), reverse=True)[:5]
        np.testing.assert_allclose(scores, best, atol=1e-5)
        by_text = {r.context: r for r in together}
        for r in answer.results:
            one = by_text[r.text]
            assert r.pruned_context == one.pruned_context
            assert r.highlighted == one.highlight("<em>", "</em>")
            assert r.reranking_score == pytest.approx(one.reranking_score, abs=1e-5)
        # the passage gate emptied what scores more than its margin below the best
        floor = max(scores) - pruner.family.rules.passage_margin
        assert all(
            bool(r.pruned_context) == (r.reranking_score >= floor)
            for r in answer.results
            if abs(r.reranking_score - floor) > 1e-5
        )
        assert set(answer.timings_ms) >= {"embed", "retrieve", "rerank_prune", "total"}
    assert top1 >= len(questions) // 2
    plain = pipe.ask(questions[0][0], k=5, rerank=False)
    assert [r.retrieval_rank for r in plain.results] == [1, 2, 3, 4, 5] and not plain.reranked


def test_milvus_shaped_highlights(rag, squad, pruner):
    pipe, _ = rag
    _, questions = squad
    qs = [questions[0][0], questions[1][0]]
    vectors = pipe.embedder.encode(qs).tolist()
    results = pipe.client.search(
        pipe.collection,
        data=vectors,
        anns_field="dense",
        limit=4,
        search_params={"metric_type": "IP"},
        output_fields=["text", "doc_id"],
    )
    semantic_highlight(
        results,
        pruner,
        {
            "queries": qs,
            "input_fields": ["text"],
            "pre_tags": ["<b>", "<i>"],
            "post_tags": ["</b>", "</i>"],
            "threshold": 0.5,
        },
    )
    seen = 0
    for q, hits in zip(qs, results):
        for hit in hits:
            h = hit["highlight"]["text"]
            ref = pruner.prune(
                q, [hit["entity"]["text"]], threshold=0.5, alpha=-1, title="none", passage_margin=-1
            )[0]
            kept = [s for s in ref.sentences if s.kept]
            assert h["scores"] == pytest.approx([s.probability for s in kept], abs=1e-5)
            assert all(score > 0.5 for score in h["scores"])
            tags = [("<b>", "</b>"), ("<i>", "</i>")]
            assert h["fragments"] == [f"{tags[i % 2][0]}{s.text}{tags[i % 2][1]}" for i, s in enumerate(kept)]
            seen += len(kept)
    assert seen > 0
    # highlight_only=False: one fragment, the whole text with the tags inside
    semantic_highlight(
        results, pruner, queries=qs, input_fields=["text"], threshold=0.0, highlight_only=False
    )
    hit = results[0][0]
    frag = hit["highlight"]["text"]["fragments"]
    assert len(frag) == 1 and re.sub("</?em>", "", frag[0]) == hit["entity"]["text"] and "<em>" in frag[0]
    # a threshold nothing passes: empty fragments and scores, as Milvus returns
    semantic_highlight(results, pruner, queries=qs, input_fields=["text"], threshold=1.0)
    assert all(h["highlight"]["text"] == {"fragments": [], "scores": []} for hits in results for h in hits)
    with pytest.raises(InputError, match="output_fields"):
        semantic_highlight(results, pruner, queries=qs, input_fields=["title"])
    with pytest.raises(InputError, match="one query per search query"):
        semantic_highlight(results, pruner, queries=qs[:1], input_fields=["text"])


def test_bad_input_gets_clear_errors(rag, tmp_path):
    pipe, _ = rag
    with pytest.raises(InputError, match="question must be a non-empty string"):
        pipe.ask("   ")
    with pytest.raises(InputError, match="mode must be one of"):
        pipe.ask("Where?", mode="sparse")
    with pytest.raises(PipelineError, match="no collection 'nope'.*'passages'"):
        Pipeline(pipe.db, collection="nope").about()
    with pytest.raises(PipelineError, match="already exists.*overwrite"):
        pipe.index([{"id": 1, "text": "One sentence."}])
    bad = tmp_path / "not-milvus.db"
    bad.write_text("this is not a database\n" * 10)
    with pytest.raises(PipelineError, match="cannot open it as a Milvus Lite database"):
        Pipeline(bad).about()
    with pytest.raises(PipelineError, match="no such Milvus Lite database"):
        Pipeline(tmp_path / "missing.db").about()
    with pytest.raises(PipelineError, match=r"ends in \.db.*http://host:19530"):
        Pipeline("localhost:19530").about()
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": 1, "text": "Fine."}\n{"text": "no id"}\n')
    with pytest.raises(InputError, match=r"docs.jsonl:2: a document needs an id"):
        read_documents(docs)
    docs.write_text('{"id": 1, "text": "Fine."}\n{"id": 1, "text": "Again."}\n')
    with pytest.raises(InputError, match=r"docs.jsonl:2: id '1' appears twice"):
        read_documents(docs)
    docs.write_text('{"id": 1, "text": ""}\n')
    with pytest.raises(InputError, match="non-empty string text"):
        read_documents(docs)


def test_cli_index_and_ask(default_cache, tmp_path, monkeypatch, capsys):
    from engine.cli import main

    for k, v in default_cache["env"].items():
        monkeypatch.setenv(k, v)
    db = tmp_path / "examples.db"
    assert main(["index", "--db", str(db), "--data", "examples/documents.jsonl", "-q"]) == 0
    assert "indexed 8 documents as 8 chunks" in capsys.readouterr().out
    assert main(["index", "--db", str(db), "--data", "examples/documents.jsonl", "-q"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    q = "What is the crust at the bottom of a paella called?"
    assert main(["ask", "--db", str(db), "--question", q, "--k", "3", "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [
        set(r) >= {"id", "reranking_score", "pruned_context", "highlighted", "metadata"}
        for r in out["results"]
    ] == [True] * 3
    first = out["results"][0]
    assert (
        first["id"] == "paella"
        and "socarrat" in first["pruned_context"]
        and first["metadata"]["title"] == "Paella"
    )
    assert "[1] (source: paella#0)" in out["context"]
    assert main(["ask", "--db", str(tmp_path / "none.db"), "--question", q, "-q"]) == 2
    assert "no such Milvus Lite database" in capsys.readouterr().err
    assert main(["ask", "--db", str(db), "--question", " ", "-q"]) == 2
    assert "question is empty" in capsys.readouterr().err


def test_export_encoder_from_any_embedding_checkpoint(checkpoints, tmp_path):
    """`prune export --encoder` on a small random-weight sentence-embedding checkpoint: the
    graph gives what transformers' own model gives, mean-pooled and normalised."""
    import torch
    from transformers import AutoModel, AutoTokenizer
    from engine.cli import main
    from engine.rag.embedder import Embedder

    out = tmp_path / "enc"
    assert (
        main(["export", "--encoder", "--model", str(checkpoints["embedding"]), "--out", str(out), "-q"]) == 0
    )
    emb = Embedder.load(out)
    texts = ["a short one", "a somewhat longer text about the weather in 2020"]
    tok = AutoTokenizer.from_pretrained(checkpoints["embedding"])
    model = AutoModel.from_pretrained(checkpoints["embedding"]).eval()
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    ref = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    np.testing.assert_allclose(emb.encode(texts), ref, atol=1e-5)
    assert (
        main(["export", "--encoder", "--model", str(checkpoints["embedding"]), "--out", str(out), "-q"]) == 2
    )


def test_pipeline_with_the_pruner_on_a_triton_text_model(rag, squad, server, pruners):
    """Text in on the server: the same pipeline with its reranking and pruning done by a
    Triton text model (`prune ask --server`) returns what the in-process pruner of the same
    exported model returns."""
    from engine.pruner import Pruner

    pipe, _ = rag
    _, questions = squad
    remote = Pipeline(pipe.db, Pruner.connect(server.grpc_url, "embedding_text"), pipe.embedder)
    remote._client = pipe.client  # one process holds a Milvus Lite file: share its connection
    local = Pipeline(pipe.db, pruners["embedding"][0], pipe.embedder)
    local._client = pipe.client
    for q, _ in questions[:3]:
        a, b = remote.ask(q, k=4), local.ask(q, k=4)
        assert [(r.id, r.chunk) for r in a.results] == [(r.id, r.chunk) for r in b.results]
        assert [r.pruned_context for r in a.results] == [r.pruned_context for r in b.results]
        assert [r.reranking_score for r in a.results] == pytest.approx(
            [r.reranking_score for r in b.results], abs=1e-5
        )
        for x, y in zip(a.results, b.results):
            np.testing.assert_allclose(
                [s.probability for s in x.result.sentences],
                [s.probability for s in y.result.sentences],
                atol=1e-5,
            )
