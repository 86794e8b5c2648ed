"""The embedding family's options, each against an independent reference computed with
transformers directly (not the engine's module): the "full" and "isolated" modes, CLS
pooling, "mean" reranking, a RoBERTa backbone (positions offset by padding_idx + 1),
and the CLI options that choose them. The "passage" mode (a custom mask transformers
cannot express) is checked ONNX against PyTorch."""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoTokenizer

from engine.cli import main
from engine.measuring import call_blocks
from engine.pruner import Pruner

pytestmark = pytest.mark.inprocess

Q = "When was the stadium built?"
DOC = "The stadium was built in 1923. It holds about 80,000 people. Football is played there."


def _hidden(folder, ids):
    model = AutoModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long))[
            0
        ][0]


def _prob(cos, scale=8.0, shift=0.5):
    return 1 / (1 + np.exp(-scale * (np.asarray(cos) - shift)))


def _norm(v):
    return torch.nn.functional.normalize(v, dim=-1)


def _export(ck, out, *options):
    # the fp32 reference: these compare the export with PyTorch at fp32 tolerances (the CLI's
    # default, auto, may pick a reduced precision)
    assert main(["export", "--model", str(ck), "--out", str(out), "--precision", "fp32", *options]) == 0
    return Pruner.load(out, threads=1)


def test_full_mode_and_mean_rerank_equal_one_plain_forward(checkpoints, tmp_path):
    """mode "full": one ordinary forward over `[CLS] q [SEP] [CLS] s0 [SEP] ...`;
    sentence = mean of its tokens' states; rerank "mean": cos(q, mean of the context)."""
    ck = checkpoints["embedding"]
    p = _export(ck, tmp_path / "full", "--embedding-mode", "full", "--embedding-rerank", "mean")
    r = p.prune(Q, [DOC], lexical_weight=0)[0]
    block = call_blocks(p, Q, [DOC], [[(s.start, s.end) for s in r.sentences]])[0]
    h = _hidden(ck, block.input_ids.tolist())
    sid = torch.from_numpy(block.sentence_ids)
    q = _norm(h[sid < 0].mean(0))
    sents = torch.stack([_norm(h[sid == k].mean(0)) for k in range(len(r.sentences))])
    np.testing.assert_allclose([s.probability for s in r.sentences], _prob((sents @ q).numpy()), atol=1e-5)
    assert r.reranking_score == pytest.approx(float(_norm(h[sid >= 0].mean(0)) @ q), abs=1e-5)
    manifest = json.loads((tmp_path / "full" / "manifest.json").read_text())
    assert manifest["options"]["mode"] == "full" and manifest["options"]["rerank"] == "mean"


def test_cls_pooling_equals_each_segments_own_cls(checkpoints, tmp_path):
    ck = tmp_path / "ck-cls"
    shutil.copytree(checkpoints["embedding"], ck)
    (ck / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 32,
                "pooling_mode_cls_token": True,
                "pooling_mode_mean_tokens": False,
            }
        )
    )
    p = _export(ck, tmp_path / "cls", "--similarity-scale", "5", "--similarity-shift", "0.2")
    assert json.loads((tmp_path / "cls" / "manifest.json").read_text())["options"]["pooling"] == "cls"
    r = p.prune(Q, [DOC], lexical_weight=0)[0]
    tok = AutoTokenizer.from_pretrained(str(ck))
    cls = [_norm(_hidden(ck, tok(t)["input_ids"])[0]) for t in [Q] + [s.text for s in r.sentences]]
    cos = [float(c @ cls[0]) for c in cls[1:]]
    np.testing.assert_allclose([s.probability for s in r.sentences], _prob(cos, 5.0, 0.2), atol=1e-5)
    assert r.reranking_score == pytest.approx(max(cos), abs=1e-5)


def test_roberta_backbone_positions_start_after_padding(checkpoints, tmp_path):
    """An XLM-R sentence encoder: positions start at padding_idx + 1, as in RoBERTa. In
    isolated mode each sentence's embedding equals its own forward."""
    src = checkpoints["xprovence"]
    ck = tmp_path / "xlmr-embedding"
    ck.mkdir()
    for f in src.iterdir():
        if f.name not in ("model.safetensors", "config.json", "README.md"):
            shutil.copy2(f, ck / f.name)
    config = json.loads((src / "config.json").read_text())
    for k in ("auto_map", "id2label", "label2id"):
        config.pop(k, None)
    config["architectures"] = ["XLMRobertaModel"]
    (ck / "config.json").write_text(json.dumps(config))
    state = {
        k.removeprefix("roberta."): v
        for k, v in load_file(str(src / "model.safetensors")).items()
        if k.startswith("roberta.")
    }
    save_file(state, str(ck / "model.safetensors"))
    p = _export(ck, tmp_path / "xlmr")
    assert p.family.name == "embedding"
    r = p.prune(Q, [DOC], lexical_weight=0)[0]
    tok = AutoTokenizer.from_pretrained(str(ck))
    embs = []
    for t in [Q] + [s.text for s in r.sentences]:
        embs.append(_norm(_hidden(ck, tok(t)["input_ids"]).mean(0)))
    cos = [float(e @ embs[0]) for e in embs[1:]]
    np.testing.assert_allclose([s.probability for s in r.sentences], _prob(cos), atol=1e-5)
    assert r.reranking_score == pytest.approx(max(cos), abs=1e-5)


def test_passage_mode_onnx_equals_pytorch(checkpoints, tmp_path):
    ck = checkpoints["embedding"]
    onnx_p = _export(ck, tmp_path / "passage", "--embedding-mode", "passage")
    torch_p = Pruner.load(ck, backend="torch", module_options={"mode": "passage"})
    a, b = onnx_p.prune(Q, [DOC]), torch_p.prune(Q, [DOC])
    np.testing.assert_allclose(
        [s.probability for s in a[0].sentences], [s.probability for s in b[0].sentences], atol=1e-5
    )
    # the mode matters: isolated gives other probabilities on the same input
    iso = Pruner.load(ck, backend="torch").prune(Q, [DOC])
    assert (
        np.abs(
            np.array([s.probability for s in iso[0].sentences])
            - np.array([s.probability for s in b[0].sentences])
        ).max()
        > 1e-4
    )
