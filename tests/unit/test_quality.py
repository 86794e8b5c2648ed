"""test_quality's tests that need no model and no server (the rest: tests/inprocess/test_quality.py)."""

import json
import numpy as np
import pytest
from engine.evaluate.quality import first_k_baseline, grid_search, keep_all_baseline, sentence_metrics
from engine.evaluate.rag_quality import reranking_metrics
from engine.evaluate.bm25 import BM25, words
from engine.datafiles import load_prune_data
from engine.evaluate.quality_report import table, write_report
from tests.utils import DATA

pytestmark = pytest.mark.unit


def test_sentence_metrics_by_hand():
    preds = [np.array([1, 1, 0, 0], bool), np.array([0, 0, 1], bool)]
    labels = [np.array([1, 0, 1, 0], bool), np.array([0, 0, 1], bool)]
    m = sentence_metrics(preds, labels)
    # micro: tp = 1 + 1, fp = 1, fn = 1 -> P = 2/3, R = 2/3, F1 = 2/3
    assert m["micro"]["precision"] == pytest.approx(2 / 3)
    assert m["micro"]["recall"] == pytest.approx(2 / 3)
    assert m["micro"]["f1"] == pytest.approx(2 / 3)
    # per document: doc1 P=1/2 R=1/2 F1=1/2; doc2 P=R=F1=1 -> means 3/4
    assert m["per_document"]["precision"] == pytest.approx(0.75)
    assert m["per_document"]["f1"] == pytest.approx(0.75)
    assert m["kept_share"] == pytest.approx(3 / 7)
    empty = sentence_metrics([np.zeros(2, bool)], [np.array([1, 0], bool)])
    assert empty["micro"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_grid_search_finds_the_known_best():
    labels = [np.array([1, 0, 0], bool), np.array([0, 1, 0, 0], bool), np.array([0, 0, 1], bool)]
    scores = [np.array([0.8, 0.3, 0.1]), np.array([0.2, 0.7, 0.65, 0.1]), np.array([0.05, 0.1, 0.2])]
    g = grid_search("toy", scores, labels, alphas=(None,))
    # thresholds in [0.65, 0.7) keep exactly the positives of docs 1-2; doc 3 needs t < 0.2,
    # which lets in false positives: best F1 is 0.8 (tp 2, fp 0, fn 1)
    assert g.best["micro"]["f1"] == pytest.approx(0.8)
    assert 0.65 <= g.setting["threshold"] < 0.7
    g2 = grid_search("toy", scores, labels, alphas=(None, 0.1))
    # backoff keeps doc 3's best sentence: perfect
    assert g2.best["micro"]["f1"] == pytest.approx(1.0) and g2.setting["alpha"] == 0.1
    assert len(g2.curve) == 101


def test_baselines_and_rerank_metrics():
    labels = [np.array([1, 0, 0, 0], bool), np.array([0, 1], bool)]
    ka = keep_all_baseline(labels)
    assert ka.best["micro"]["precision"] == pytest.approx(2 / 6) and ka.best["micro"]["recall"] == 1.0
    fk = first_k_baseline(labels, ks=[1, 2])
    assert fk.setting == {"k": 2} and fk.best["micro"]["recall"] == 1.0
    m = reranking_metrics([[0.1, 0.9, 0.3], [0.5, 0.5], [3, 2, 1]], golds=[1, 0, 2])
    # ranks: 1; tie -> 2 (pessimistic); 3 -> RR = (1 + 1/2 + 1/3) / 3
    assert m["mrr@10"] == pytest.approx((1 + 0.5 + 1 / 3) / 3)
    assert m["hit@1"] == pytest.approx(1 / 3)


def test_mrr_with_several_gold_passages_counts_the_best_ranked_one():
    # gold {1, 2}: passage 2 ranks first -> 1; gold {0, 1}: both behind passage 2 -> rank 2;
    # a tie with a non-gold passage ranks the gold passage last
    m = reranking_metrics([[0.1, 0.5, 0.9], [0.3, 0.2, 0.9], [0.5, 0.5]], golds=[[1, 2], [0, 1], [0]])
    assert m["mrr@10"] == pytest.approx((1 + 0.5 + 0.5) / 3) and m["hit@1"] == pytest.approx(1 / 3)


def test_rag_pruning_metrics_by_hand():
    from engine.pipeline.results import PruneResult, Sentence
    from engine.evaluate.rag_quality import rag_pruning_metrics
    from engine.datafiles import RagSample

    def res(i, score, kept):  # sentences of 10 characters each
        sents = [Sentence("x" * 10, 10 * k, 10 * k + 10, 0.5, bool(x)) for k, x in enumerate(kept)]
        return PruneResult(i, "x" * (10 * len(kept)), "", score, sents, 0.0, 0.5)

    samples = [RagSample("a", "q", ["p0", "p1", "p2"], [0]), RagSample("b", "q", ["p0", "p1"], [1])]
    calls = [
        [res(0, 0.9, [1, 0]), res(1, 0.5, [0, 0, 0]), res(2, 0.8, [1, 1])],
        [res(0, 0.7, [0]), res(1, 0.6, [0, 0])],
    ]
    m = rag_pruning_metrics(calls, samples)
    # non-gold: (call a) p1 emptied, p2 kept 20/20 chars; (call b) p0 emptied: 2 of 3 emptied, 20 of 60 chars
    assert m["non_gold_emptied"] == pytest.approx(2 / 3) and m["non_gold_chars_kept"] == pytest.approx(
        20 / 60
    )
    # gold: a's p0 keeps 10 of 20 chars, b's p1 nothing: 1 of 2, 10 of 40 chars
    assert m["gold_with_something_kept"] == 0.5 and m["gold_chars_kept"] == pytest.approx(10 / 40)
    # ranks: a's gold first, b's gold second
    assert m["mrr@10"] == pytest.approx(0.75) and (m["non_gold_passages"], m["gold_passages"]) == (3, 2)


def test_rag_files_take_one_gold_or_several_and_refuse_one_outside(tmp_path):
    from engine.datafiles import load_rag_data

    f = tmp_path / "rag.jsonl"
    f.write_text(
        json.dumps({"question": "q", "passages": ["a", "b"], "gold": 1})
        + "\n"
        + json.dumps({"question": "q", "passages": ["a", "b", "c"], "gold": [0, 2], "source": "x"})
        + "\n"
    )
    a, b = load_rag_data(f)
    assert a.gold == [1] and b.gold == [0, 2] and b.source == "x"
    f.write_text(json.dumps({"question": "q", "passages": ["a"], "gold": 3}) + "\n")
    with pytest.raises(ValueError, match="outside its 1 passages"):
        load_rag_data(f)


def test_rag_from_prune_cuts_documents_into_passages_at_sentence_ends(tmp_path):
    from benchmarks.rag_from_prune import main as rag_from_prune
    from engine.datafiles import load_rag_data

    out = tmp_path / "rag.jsonl"
    assert (
        rag_from_prune(["--data", str(DATA / "coqa-dev-prune.jsonl"), "--out", str(out), "--chars", "400"])
        == 0
    )
    rows = [json.loads(line) for line in (DATA / "coqa-dev-prune.jsonl").read_text().splitlines()]
    rag = load_rag_data(out)
    assert len(rag) == len(rows) and {r.source for r in rag} == {r["source"] for r in rows}
    for r, s in zip(rows, rag):
        assert all(p in r["context"] for p in s.passages)
        whole = {r["context"][a:b] for a, b in r["sentences"]}
        assert all(len(p) <= 400 or p in whole for p in s.passages)  # longer only when one sentence is
        assert "".join(s.passages).replace(" ", "").replace("\n", "") == "".join(
            r["context"][a:b] for a, b in r["sentences"]
        ).replace(" ", "").replace("\n", "")
        labelled = [r["context"][a:b] for (a, b), y in zip(r["sentences"], r["labels"]) if y]
        assert all(any(t in s.passages[g] for g in s.gold) for t in labelled)  # the gold holds the answer
        assert all(not any(t in p for t in labelled) for k, p in enumerate(s.passages) if k not in s.gold)


def test_bm25_prefers_matching_words():
    corpus = [words("the stadium was built in 1923"), words("paris is in france"), words("the cat sat")]
    bm = BM25(corpus)
    q = words("when was the stadium built")
    assert bm.score(q, corpus[0]) > bm.score(q, corpus[2]) > 0 == bm.score(q, corpus[1])


def test_report_files(tmp_path):
    labels = [np.array([1, 0], bool)]
    rows = [keep_all_baseline(labels), grid_search("m", [np.array([0.9, 0.1])], labels)]
    report = {
        "pruning": {"data": "x", "documents": 1, "sentences": 2, "positive_share": 0.5, "rows": []},
        "reranking": None,
        "_rows": rows,
    }
    paths = write_report(report, tmp_path, "t", "prune eval ...")
    assert json.loads(paths["json"].read_text())["pruning"]["documents"] == 1
    assert "| m | 100.00 |" in paths["markdown"].read_text()
    assert paths["plot"].stat().st_size > 1000
    assert "keep-all" in table(rows)


def test_dataset_loads_with_its_own_spans():
    samples = load_prune_data(DATA / "squad-dev-prune.jsonl", limit=5)
    for s in samples:
        assert len(s.spans) == len(s.labels) and s.labels.any()
        assert all(0 <= a < b <= len(s.context) for a, b in s.spans)


def test_lost_answers_lists_each_domains_lost_gold_passages_with_their_calls():
    from engine.pipeline.results import PruneResult, Sentence
    from engine.evaluate.rag_quality import lost_answers
    from engine.datafiles import RagSample

    def res(i, score, kept):
        sents = [Sentence("x" * 10, 10 * k, 10 * k + 10, 0.5, bool(x)) for k, x in enumerate(kept)]
        return PruneResult(i, "x" * (10 * len(kept)), "", score, sents, 0.0, 0.5)

    samples = [
        RagSample("a", "qa", ["p0", "p1", "p2"], [0, 2], "news"),
        RagSample("b", "qb", ["p0", "p1"], [1], "news"),
        RagSample("c", "qc", ["p0", "p1"], [0], "forum"),
    ]
    calls = [
        [res(0, 0.9, [1]), res(1, 0.5, [0]), res(2, 0.4, [0, 0])],  # gold 2 lost, third of three
        [res(0, 0.7, [1]), res(1, 0.6, [1])],  # nothing lost
        [res(0, 0.2, [0]), res(1, 0.8, [1])],
    ]  # gold 0 lost, second
    out = lost_answers(calls, samples)
    assert set(out) == {"news", "forum"}
    assert out["news"]["queries"] == 2 and out["news"]["gold_lost"] == 1 and out["news"]["gold_passages"] == 3
    assert out["news"]["gold_with_something_kept"] == pytest.approx(2 / 3)
    assert out["news"]["lost_calls"] == [
        {
            "id": "a",
            "question": "qa",
            "passages": 3,
            "best_score": 0.9,
            "lost": [{"index": 2, "reranking_score": 0.4, "rank": 3}],
        }
    ]
    assert out["forum"]["lost_calls"][0]["lost"] == [{"index": 0, "reranking_score": 0.2, "rank": 2}]
