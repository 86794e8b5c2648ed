"""The in-process engine: invariances, decisions, results, bad input."""

import json
import math

import numpy as np
import pytest

from engine.errors import InputError, ModelLoadError
from engine.pruner import Pruner
from tests.utils import FAMILY_NAMES, with_window

pytestmark = pytest.mark.inprocess

Q = "Who built the stadium in 1923?"
DOCS = [
    "The stadium was built in 1923. It holds about 80,000 people. Football is played there.",
    "Paris is the capital of France. 北京是中国的首都。",
    " ".join(f"Sentence {i} mentions a price of {i}.50 dollars." for i in range(40)),
    "Short one.",
    "Line one\n\n- bullet a\n- bullet b",
]


def _probs(results):
    return [[s.probability for s in r.sentences] for r in results]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_list_equals_each_passage_alone_whatever_the_budget(pruners, name):
    ort_p, _ = pruners[name]
    base = with_window(ort_p, 96)
    # no passage gate: it compares a call's passages with each other on purpose (test_passage_gate)
    alone = [base.prune(Q, [d], passage_margin=-1)[0] for d in DOCS]
    for cfg in [
        dict(max_batch_tokens=96, max_batch_size=1),
        dict(max_batch_tokens=400, max_batch_size=4),
        dict(max_batch_tokens=10**6, max_batch_size=64),
        dict(strategy="fixed", max_batch_size=3),
    ]:
        together = with_window(ort_p, 96, **cfg).prune(Q, DOCS, passage_margin=-1)
        assert [r.index for r in together] == list(range(len(DOCS)))
        for a, t in zip(alone, together):
            np.testing.assert_allclose(
                [s.probability for s in a.sentences], [s.probability for s in t.sentences], atol=1e-5
            )
            assert [s.kept for s in a.sentences] == [s.kept for s in t.sentences]
            assert a.reranking_score == pytest.approx(t.reranking_score, abs=1e-4)
    # and the order of passages does not change any passage's result
    rev = base.prune(Q, DOCS[::-1])
    for a, r in zip(alone, rev[::-1]):
        np.testing.assert_allclose(
            [s.probability for s in a.sentences], [s.probability for s in r.sentences], atol=1e-5
        )


def test_long_sentence_pieces_merge_token_weighted(pruners):
    """A sentence longer than a block is cut into pieces whose probabilities are merged
    weighted by token count. The expected value is computed without the engine's
    encoder or merge code: rows built by hand from the provence template
    ([CLS] q [SEP] piece [SEP]), run on the backend, averaged here."""
    from engine.pipeline.encode import ModelBatch

    ort_p, _ = pruners["provence"]
    small = with_window(ort_p, 96)
    long_sentence = "word " * 300 + "end."
    r = small.prune(Q, [long_sentence])[0]
    assert len(r.sentences) == 1 and r.blocks > 1
    tok, spec = small.encoder.tokenizer, small.spec
    q_ids = tok.encode(Q, add_special_tokens=False).ids
    s_ids = tok.encode(long_sentence.strip(), add_special_tokens=False).ids
    piece = 96 - 3 - len(q_ids)  # window - [CLS], [SEP], [SEP] - question
    pieces = [s_ids[i : i + piece] for i in range(0, len(s_ids), piece)]
    assert len(pieces) == r.blocks
    num = den = 0.0
    for ids in pieces:
        row = [spec.cls_id, *q_ids, spec.sep_id, *ids, spec.sep_id]
        sent = [-1] * (len(q_ids) + 2) + [0] * len(ids) + [-1]
        arr = lambda v: np.array([v], dtype=np.int64)  # noqa: E731
        batch = ModelBatch(arr(row), arr([1] * len(row)), arr(sent), arr([0] * len(row)), [0])
        _, probs = small.backend.infer(batch)
        num += float(probs[0, 0]) * len(ids)
        den += len(ids)
    assert r.sentences[0].probability == pytest.approx(num / den, abs=1e-6)
    # and not the unweighted mean of the pieces (the pieces differ in length here)
    assert len(pieces[-1]) != len(pieces[0])


def test_one_megabyte_passage_is_processed_whole(pruners):
    ort_p, _ = pruners["opensearch"]
    big = ("The committee met again on Monday and approved the new budget for the year. " * 14000)[:1_000_000]
    r = ort_p.prune(Q, [big])[0]
    assert len(r.context) == 1_000_000
    assert r.blocks > 100
    assert sum(len(s.text) for s in r.sentences) + len(r.sentences) - 1 >= len(big.strip())
    assert all(not math.isnan(s.probability) for s in r.sentences)


def test_results_fields_highlight_and_pruned_text(pruners):
    ort_p, _ = pruners["xprovence"]
    doc = "Alpha one. Beta two.\n\nGamma three. 中文句子。第二句！"
    r = ort_p.prune(Q, [doc], threshold=0.0, title="none")[0]
    assert all(s.kept for s in r.sentences)
    assert r.pruned_context == doc.strip()  # everything kept: the original text
    assert r.compression_rate == 0.0
    for s in r.sentences:
        assert doc[s.start : s.end] == s.text
    assert r.highlight("[", "]") == "[Alpha one.] [Beta two.]\n\n[Gamma three.] [中文句子。][第二句！]"
    r2 = ort_p.prune(Q, [doc], threshold=1.0, title="none")[0]
    assert r2.pruned_context == "" and r2.compression_rate == 1.0 and r2.highlights == []
    json.dumps(r.to_dict())
    # drop one middle sentence: the others keep their own separators
    sentences = ["Alpha one.", "Beta two.", "Gamma three."]
    r3 = ort_p.prune(Q, ["Alpha one. Beta two. Gamma three."], sentences=[sentences], threshold=0.0)[0]
    assert [s.text for s in r3.sentences] == sentences


def test_reorder_and_top_k(pruners):
    ort_p, _ = pruners["provence"]
    res = ort_p.prune(Q, DOCS, reorder=True)
    scores = [r.reranking_score for r in res]
    assert scores == sorted(scores, reverse=True)
    top = ort_p.prune(Q, DOCS, top_k=2)
    assert [r.index for r in top] == [r.index for r in res[:2]]
    with pytest.raises(InputError):
        ort_p.prune(Q, DOCS, top_k=0)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(question=""), "question is empty"),
        (dict(question="   "), "question is empty"),
        (dict(question=None), "question must be a str"),
        (dict(passages=[1, "x"]), "passage 0 must be a str"),
        (dict(passages=None), "passages must be a list"),
        (dict(threshold=1.5), r"threshold must be in \[0, 1\]"),
        (dict(threshold=float("nan")), "finite"),
        (dict(threshold="0.3"), "finite number"),
        (dict(alpha=1.5), r"alpha must be in \[0, 1\]"),
        (dict(alpha=float("inf")), "alpha must be a finite number"),
        (dict(colour="red"), "unknown option .colour."),
        (dict(title="middle"), "title must be one of"),
        (dict(sentences=[["One."], ["Two."]]), "one list of sentences per passage"),
        (dict(sentences=[["Three."]]), "not found in its passage"),
    ],
)
def test_bad_input_is_a_clear_error(pruners, bad, match):
    ort_p, _ = pruners["provence"]
    kwargs = dict(question=Q, passages=["One. Two."])
    kwargs.update(bad)
    with pytest.raises(InputError, match=match):
        ort_p.prune(kwargs.pop("question"), kwargs.pop("passages"), **kwargs)


def test_defined_results_for_empty_input(pruners):
    ort_p, torch_p = pruners["open_provence"]
    assert ort_p.prune(Q, []) == []
    res = ort_p.prune(Q, ["", "   \n ", "Real text here."])
    assert [len(r.sentences) for r in res] == [0, 0, 1]
    assert res[0].pruned_context == "" and res[0].reranking_score is None and res[0].blocks == 0
    assert res[2].reranking_score is not None
    single = ort_p.prune(Q, "Real text here.")
    assert len(single) == 1


def test_question_longer_than_window_is_an_error(pruners):
    ort_p, _ = pruners["opensearch"]
    with pytest.raises(InputError, match="the question is .* tokens"):
        ort_p.prune("why " * 600, ["Some passage."])


def test_missing_or_corrupted_model_folder(exported, tmp_path):
    import shutil

    with pytest.raises(ModelLoadError, match="no such model folder"):
        Pruner.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no manifest.json"):
        Pruner.load(tmp_path / "empty")
    broken = tmp_path / "broken"
    shutil.copytree(exported["provence"], broken)
    (broken / "model.onnx").write_bytes(b"not a graph")
    with pytest.raises(ModelLoadError, match="cannot load the graph"):
        Pruner.load(broken)
    bad_manifest = tmp_path / "bad_manifest"
    shutil.copytree(exported["provence"], bad_manifest)
    (bad_manifest / "manifest.json").write_text("{")
    with pytest.raises(ModelLoadError, match="corrupted manifest"):
        Pruner.load(bad_manifest)
    no_tok = tmp_path / "no_tok"
    shutil.copytree(exported["provence"], no_tok)
    (no_tok / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="cannot load tokenizer"):
        Pruner.load(no_tok)
    with pytest.raises(InputError, match="unknown backend"):
        Pruner.load(exported["provence"], backend="tensorflow")


def test_pruned_context_of_the_engine_with_a_middle_sentence_dropped(pruners):
    ort_p, _ = pruners["xprovence"]
    doc = "Alpha one. Beta two.\n\nGamma three. 中文句子。第二句！"
    base = ort_p.prune(Q, [doc], threshold=0.0, title="none")[0]
    probs = [s.probability for s in base.sentences]
    # a threshold just above the lowest middle sentence drops it and keeps the higher ones
    mid = 1 + int(np.argmin(probs[1:-1]))
    t = probs[mid] + 1e-9
    r = ort_p.prune(Q, [doc], threshold=t, title="none", alpha=-1)[0]
    kept = [s.text for s in r.sentences if s.kept]
    assert base.sentences[mid].text not in kept and len(kept) >= 2
    assert kept == [s.text for s in base.sentences if s.probability > t]
    parts = []
    for i, s in enumerate(r.sentences):
        if s.kept:
            gap = doc[r.sentences[i - 1].end : s.start] if i else ""
            parts.append((gap if parts else "") + s.text)
    assert r.pruned_context == "".join(parts)


def test_open_provence_reranking_score_is_process_s(pruners):
    """As OpenProvenceModel.process(): the sigmoid of the rerank logit, the best over the
    passage's blocks, and 0.0 when no sentence is kept; the torch reference agrees."""
    ort_p, torch_p = pruners["open_provence"]
    passage = " ".join(f"Sentence number {i} talks about the harbour and its ships." for i in range(120))
    for p in (ort_p, torch_p):
        r = p.prune("Where are the ships?", [passage], threshold=0.0)[0]
        assert r.blocks > 1 and 0.0 < r.reranking_score < 1.0
        call = p.prepare("Where are the ships?", [passage])
        logits = [score for score, _ in p._run_blocks(call.blocks)]
        assert len(logits) == r.blocks
        assert r.reranking_score == pytest.approx(max(1 / (1 + math.exp(-x)) for x in logits), abs=1e-6)
        nothing = p.prune("Where are the ships?", [passage], threshold=1.0)[0]
        assert not any(s.kept for s in nothing.sentences) and nothing.reranking_score == 0.0


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_each_result_says_how_much_of_its_passage_the_model_does_not_see(pruners, name):
    """unknown_share (engine.pipeline.encode) on every route of a call: prune, prune_many,
    the family's reference windows (OpenSearch's words input), reordered and budgeted results."""
    from engine.pipeline.encode import UNKNOWN_SHARE_WARNING

    pruner = pruners[name][0]
    english, korean = DOCS[0], "서울은 한국의 수도입니다. 부산은 큰 항구 도시입니다."
    got = pruner.prune(Q, [english, korean, ""])
    shares = [r.unknown_share for r in got]
    # no test checkpoint's vocabulary has Hangul: [UNK] (BERT), <unk> (SentencePiece)
    assert shares[0] == 0.0 and shares[1] > UNKNOWN_SHARE_WARNING and shares[2] == 0.0, shares
    many = pruner.prune_many([{"question": Q, "passages": [english, korean, ""]}])[0]
    assert [r.unknown_share for r in many] == shares
    assert [r.unknown_share for r in pruner.prune(Q, [english, korean, ""], windows="reference")] == shares
    ranked = pruner.prune(Q, [english, korean, ""], top_k=2, budget_tokens=5, passage_margin=-1)
    assert [r.unknown_share for r in ranked] == [shares[r.index] for r in ranked]
