"""Checkpoints laid out like the real ones load strictly, without remote code."""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import ModelLoadError
from engine.pipeline.families import detect_family, get_family, read_config
from engine.pytorch.modeling import load_checkpoint, weight_names
from engine.measuring import call_blocks
from engine.pruner import Pruner
from engine.pytorch.torch_model import load_hf_tokenizer
from tests.utils import FAMILY_NAMES

pytestmark = pytest.mark.inprocess

EXPECTED_ARCH = {
    "provence": "Provence",
    "xprovence": "XProvence",
    "embedding": "BertModel",
    "open_provence": "OpenProvenceModel",
    "opensearch": "BertTaggerForSentenceExtractionWithBackoff",
}
HEAD_TENSORS = {
    "provence": [
        "deberta.embeddings.word_embeddings.weight",
        "deberta.encoder.rel_embeddings.weight",
        "pooler.dense.weight",
        "classifier.weight",
        "token_classifier.weight",
    ],
    "xprovence": [
        "roberta.embeddings.word_embeddings.weight",
        "roberta.pooler.dense.weight",
        "classifier.weight",
        "token_classifier.weight",
    ],
    "open_provence": [
        "ranking_model.roberta.embeddings.word_embeddings.weight",
        "ranking_model.classifier.dense.weight",
        "ranking_model.classifier.out_proj.weight",
        "pruning_head.classifier.weight",
    ],
    "opensearch": [
        "bert.embeddings.word_embeddings.weight",
        "bert.encoder.layer.0.attention.self.query.weight",
        "classifier.weight",
    ],
    "embedding": ["embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight"],
}
TOKENIZER_CLASS = {
    "provence": "DebertaV2Tokenizer",
    "xprovence": "XLMRobertaTokenizer",
    "open_provence": "XLMRobertaTokenizer",
    "opensearch": "BertTokenizer",
    "embedding": "BertTokenizer",
}


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_real_layout_loads_with_every_tensor_used(checkpoints, name):
    folder = checkpoints[name]
    config = read_config(folder)
    assert EXPECTED_ARCH[name] in config["architectures"]
    if name not in ("opensearch", "embedding"):
        assert "auto_map" in config  # the remote-code pointer real checkpoints carry
    names = weight_names(folder)
    for t in HEAD_TENSORS[name]:
        assert t in names
    assert detect_family(config, folder=folder).name == name
    ck = load_checkpoint(folder)
    assert ck.family.name == name
    model_keys = set(ck.model.state_dict())
    if name == "embedding":  # sentence-transformers stores the bare backbone names
        model_keys = {k.removeprefix("encoder.") for k in model_keys}
    stored = set(load_file(str(folder / "model.safetensors")))
    # every stored tensor is used, and every parameter came from the file
    assert stored <= model_keys
    assert {k for k in model_keys if not k.endswith(("position_ids", "token_type_ids"))} <= stored
    state = ck.model.state_dict()
    for k, v in load_file(str(folder / "model.safetensors")).items():
        assert torch.equal(state[("encoder." + k) if name == "embedding" else k], v)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_tokenizer_type_and_vocabulary(checkpoints, name):
    tok = load_hf_tokenizer(checkpoints[name])
    assert type(tok).__name__ == TOKENIZER_CLASS[name]
    assert len(tok) > 250  # a failed sentencepiece conversion gives ~7 tokens
    ids = tok("the quick brown fox", add_special_tokens=False)["input_ids"]
    assert 2 <= len(ids) <= 12


def test_family_detection_by_tensor_names_and_errors():
    assert (
        detect_family({"model_type": "deberta-v2"}, ["deberta.x", "token_classifier.weight"]).name
        == "provence"
    )
    assert detect_family({}, ["roberta.x", "token_classifier.weight"]).name == "xprovence"
    assert detect_family({}, ["roberta.x", "pruning_head.classifier.weight"]).name == "open_provence"
    assert detect_family({}, ["bert.x", "classifier.weight"]).name == "opensearch"
    with pytest.raises(ModelLoadError, match="model_type='gpt2'.*--family"):
        detect_family({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, ["h.0.attn.weight"])
    with pytest.raises(ModelLoadError, match="unknown family"):
        get_family("llama")
    assert get_family("zilliz").name == "open_provence"


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_and_unexpected_tensors_are_named(checkpoints, tmp_path):
    folder = _copy(checkpoints["provence"], tmp_path / "p")
    state = load_file(str(folder / "model.safetensors"))
    state.pop("token_classifier.weight")
    state["extra_head.weight"] = torch.zeros(2)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(
        ModelLoadError, match=r"missing \['token_classifier.weight'\].*unexpected \['extra_head.weight'\]"
    ):
        load_checkpoint(folder)


def test_old_open_provence_keys_without_prefix(checkpoints, tmp_path):
    folder = _copy(checkpoints["open_provence"], tmp_path / "o")
    state = load_file(str(folder / "model.safetensors"))
    state = {k.removeprefix("ranking_model."): v for k, v in state.items()}
    save_file(state, str(folder / "model.safetensors"))
    ck = load_checkpoint(folder)
    ref = load_checkpoint(checkpoints["open_provence"])
    for k, v in ref.model.state_dict().items():
        assert torch.equal(v, ck.model.state_dict()[k])


def test_pickle_weights_load_with_weights_only(checkpoints, tmp_path):
    folder = _copy(checkpoints["opensearch"], tmp_path / "b")
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    assert load_checkpoint(folder).family.name == "opensearch"


class _Payload:
    """A pickle that runs code when loaded without weights_only (it would create a file)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_unsafe_pickle_is_refused_and_never_runs(checkpoints, tmp_path):
    folder = _copy(checkpoints["opensearch"], tmp_path / "evil")
    state = dict(load_file(str(folder / "model.safetensors")))
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "code-ran"
    state["classifier.bias"] = _Payload(marker)
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="cannot read weights"):
        load_checkpoint(folder)
    assert not marker.exists()


def test_bad_folders_fail_clearly(checkpoints, tmp_path):
    with pytest.raises(ModelLoadError, match="no such folder"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="hub download failed"):
        load_checkpoint("no-such-org/no-such-model-for-tests")
    folder = _copy(checkpoints["provence"], tmp_path / "c")
    (folder / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_checkpoint(folder)
    folder2 = _copy(checkpoints["provence"], tmp_path / "d")
    (folder2 / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_checkpoint(folder2)
    folder3 = _copy(checkpoints["provence"], tmp_path / "e")
    (folder3 / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no weights"):
        load_checkpoint(folder3)
    folder4 = _copy(checkpoints["provence"], tmp_path / "f")
    cfg = json.loads((folder4 / "config.json").read_text())
    cfg["hidden_size"] = 64
    cfg["pooler_hidden_size"] = 64
    (folder4 / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="shape"):
        load_checkpoint(folder4)


def test_detection_from_pickle_names_and_published_class_names(checkpoints, tmp_path):
    folder = _copy(checkpoints["opensearch"], tmp_path / "bin-only")
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    config = read_config(folder)
    bare = {k: v for k, v in config.items() if k not in ("architectures",)}
    bare["model_type"] = "bert"
    (folder / "config.json").write_text(json.dumps(bare))
    names = weight_names(folder)  # read from the pickle, weights_only
    assert "classifier.weight" in names and any(n.startswith("bert.") for n in names)
    assert detect_family(bare, names, folder).name == "opensearch"
    assert load_checkpoint(folder).family.name == "opensearch"
    for arch, family in [
        ("XProvenceForSequenceClassification", "xprovence"),
        ("BertTaggerForSentenceExtractionWithBackoff", "opensearch"),
        ("DebertaV2ForCompressionAndRanking", "provence"),
    ]:
        assert detect_family({"architectures": [arch], "model_type": "x"}).name == family


def test_a_window_longer_than_512_where_the_positions_allow(tmp_path):
    """XProvence and Zilliz's model sit on BGE-M3 (8k positions): --max-length above 512 is
    accepted up to what the position embeddings allow, with buckets up to the window and
    batches whose attention memory stays bounded; the default stays 512."""
    from engine.backends.torch import TorchBackend
    from engine.pipeline.encode import BatchingConfig, plan
    from engine.pytorch.torch_model import load_torch_model
    from export.checkpoints import make_test_checkpoint
    from export.onnx import export_model

    ck = make_test_checkpoint("xprovence", tmp_path / "ck", sizes={"max_position_embeddings": 1026})
    with pytest.raises(ModelLoadError, match=r"outside 16\.\.1024"):
        export_model(ck, tmp_path / "too-long", max_length=2048, log=lambda m: None)
    export_model(ck, tmp_path / "long", max_length=1024, log=lambda m: None)  # parity checked inside
    export_model(ck, tmp_path / "default", log=lambda m: None)
    long, default = Pruner.load(tmp_path / "long"), Pruner.load(tmp_path / "default")
    assert long.spec.max_length == 1024 and default.spec.max_length == 512
    manifest = json.loads((tmp_path / "long" / "manifest.json").read_text())
    assert manifest["buckets"][-2:] == [512, 1024]
    passage = " ".join(f"Sentence {i} says the harbour held {i} ships." for i in range(25))
    r_long, r_default = (
        long.prune("Where are the ships?", [passage])[0],
        default.prune("Where are the ships?", [passage])[0],
    )
    assert r_long.blocks == 1 and r_default.blocks > 1
    tm = load_torch_model(ck, max_length=1024)
    reference = Pruner(TorchBackend(tm.module), tm.tokenizer, tm.spec).prune(
        "Where are the ships?", [passage]
    )[0]
    np.testing.assert_allclose(
        [s.probability for s in r_long.sentences], [s.probability for s in reference.sentences], atol=1e-5
    )
    cfg = BatchingConfig()
    assert cfg.buckets_for(8192)[-3:] == (7168, 7680, 8192) and cfg.row_budget(8192) == 1024
    assert [len(idx) for _, idx in plan([8000, 8000, 8000], cfg, 8192)] == [1, 1, 1]
    assert [len(idx) for _, idx in plan([1000] * 20, cfg, 1024)] == [8, 8, 4]


@pytest.mark.parametrize("flag", [True, False])
def test_open_provence_weighted_pooling_tensors_load_and_change_nothing(checkpoints, tmp_path, flag):
    """OpenProvence checkpoints trained with `use_weighted_pooling` carry
    `pruning_head.pooling_weights.*`; the original head builds that layer and its forward
    never applies it. They load (with or without the config flag) and the outputs are those
    of the same checkpoint without them."""
    import json

    folder = _copy(checkpoints["open_provence"], tmp_path / "weighted")
    state = dict(load_file(str(folder / "model.safetensors")))
    hidden = state["pruning_head.classifier.weight"].shape[1]
    state["pruning_head.pooling_weights.weight"] = torch.randn(1, hidden)
    state["pruning_head.pooling_weights.bias"] = torch.randn(1)
    save_file(state, str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["pruning_config"]["use_weighted_pooling"] = flag
    (folder / "config.json").write_text(json.dumps(cfg))
    ck, ref = load_checkpoint(folder), load_checkpoint(checkpoints["open_provence"])
    assert torch.equal(ck.model.pruning_head.pooling_weights.bias, state["pruning_head.pooling_weights.bias"])
    ids = torch.tensor([[0, 5, 6, 2, 2, 7, 8, 9, 2]])
    mask = torch.ones_like(ids)
    sent = torch.tensor([[-1, -1, -1, -1, -1, 0, 0, 1, -1]])
    with torch.inference_mode():
        a, b = ck.model(ids, mask, sent), ref.model(ids, mask, sent)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_open_provence_on_modernbert_exports_and_matches_pytorch(tmp_path):
    """OpenProvence on a ModernBERT backbone (global and sliding-window attention, rotary
    positions): detected, its template `[CLS] q [SEP] context [SEP]`, exported to ONNX and
    equal to the PyTorch module within 1e-5 on passages longer than the local attention
    window, at the default 512 window and at --max-length 1024; the pruning head reads the
    last layer's output before the final norm (transformers 4's `hidden_states[-1]`, what
    the original code reads), checked against transformers' own forward: that tensor
    through the final norm is the model's `last_hidden_state`."""
    from export.checkpoints import make_test_checkpoint
    from export.onnx import export_model
    from tests.utils import with_window

    ck_dir = make_test_checkpoint("open_provence", tmp_path / "ck", backbone="modernbert")
    ck = load_checkpoint(ck_dir)
    assert ck.family.backbone == "modernbert" and ck.family.seps_between == 1 and ck.max_positions == 8192
    model = ck.model
    ids = torch.randint(10, 200, (2, 90))
    mask = torch.ones_like(ids)
    mask[1, 60:] = 0
    sent = torch.full_like(ids, -1)
    sent[:, 10:80] = torch.arange(70) // 10
    with torch.inference_mode():
        model(ids, mask, sent)
        pre = model._pre_norm[-1] if model._pre_norm else None
        captured = []
        hook = model.ranking_model.model.final_norm.register_forward_pre_hook(
            lambda m, a: captured.append(a[0])
        )
        last = model.ranking_model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        hook.remove()
        torch.testing.assert_close(model.ranking_model.model.final_norm(captured[0]), last)
        rerank, probs = model(ids, mask, sent)
        head = torch.softmax(model.pruning_head.classifier(captured[0]), -1)[..., 1]
        torch.testing.assert_close(probs[0, 0], head[0, 10:20].mean())
        assert pre is None
    passage = " ".join(
        f"Sentence {i} says the stadium held {i} thousand people in {1900 + i}." for i in range(60)
    )
    blocks = {}
    for window in (None, 1024):
        out = tmp_path / f"onnx-{window}"
        export_model(ck_dir, out, max_length=window, log=lambda m: None)
        ort_p = Pruner.load(out, threads=1)
        torch_p = Pruner.load(ck_dir, backend="torch", threads=1)
        if window:
            torch_p = with_window(torch_p, window)
        block = call_blocks(ort_p, "Who?", [passage], [[(0, 10)]])[0]
        assert (
            list(block.input_ids[:1]) == [ort_p.spec.cls_id]
            and int((block.input_ids == ort_p.spec.sep_id).sum()) == 2
        )
        a = ort_p.prune("How many people did the stadium hold in 1930?", [passage, "Short one. Two."])
        b = torch_p.prune("How many people did the stadium hold in 1930?", [passage, "Short one. Two."])
        for x, y in zip(a, b):
            np.testing.assert_allclose(
                [s.probability for s in x.sentences], [s.probability for s in y.sentences], atol=1e-5
            )
            assert x.reranking_score == pytest.approx(y.reranking_score, abs=1e-5)
        blocks[window] = a[0].blocks
    assert blocks[None] > blocks[1024] >= 1 and blocks[None] > 1


def test_xprovence_v2s_layout_is_the_family_and_exports_as_pytorch_runs_it(tmp_path):
    """naver/xprovence-reranker-bgem3-v2 (its hub code modeling_xprovence_hf.py, classes
    XProvence and XProvenceConfig; BGE-M3's 8,194 positions; v1's tensor names, those of naver's
    training code): detected as xprovence from its class name and from its tensors alone,
    loaded strictly without remote code, with the training code's default threshold (0.1, Provence's),
    a 512 window by default within 8,192; exported (parity is checked inside), the export prunes
    as the checkpoint does in PyTorch."""
    from export.checkpoints import make_test_checkpoint
    from export.onnx import export_model

    ck = make_test_checkpoint("xprovence", tmp_path / "v2", version="v2")
    config, names = read_config(ck), weight_names(ck)
    assert config["auto_map"]["AutoModel"] == "modeling_xprovence_hf.XProvence"
    assert detect_family(config, names, ck).name == "xprovence"
    assert detect_family({"model_type": "xlm-roberta"}, names).name == "xprovence"
    for arch in ("XProvence", "XProvenceForSequenceClassification", "XProvenceForTokenClassification"):
        assert detect_family({"architectures": [arch], "model_type": "xlm-roberta"}).name == "xprovence"
    assert detect_family({"model_type": "xprovence"}).name == "xprovence"
    loaded = load_checkpoint(ck)
    assert (loaded.family.name, loaded.max_positions, loaded.max_length) == ("xprovence", 8192, 512)
    assert loaded.family.rules.threshold == 0.1 and loaded.family.rules.title == "first_sentence"
    export_model(ck, tmp_path / "export", log=lambda m: None)
    exported = Pruner.load(tmp_path / "export", threads=1)
    reference = Pruner.load(ck, backend="torch", threads=1)
    assert exported.family.rules.threshold == 0.1
    question = "When was the stadium built?"
    passages = [
        "Stade. The stadium was built in 1923. It holds 80,000 people. Football is played there.",
        "Paris is the capital of France. Le chat est sur la table. 北京是中国的首都。",
    ]
    got, want = exported.prune(question, passages), reference.prune(question, passages)
    for g, w in zip(got, want):
        assert [s.text for s in g.sentences] == [s.text for s in w.sentences]
        np.testing.assert_allclose(
            [s.probability for s in g.sentences], [s.probability for s in w.sentences], atol=1e-5
        )
        assert g.reranking_score == pytest.approx(w.reranking_score, abs=1e-4)
        assert g.pruned_context == w.pruned_context and g.threshold == 0.1
