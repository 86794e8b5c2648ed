"""prune bench's peers (engine/bench/peers.py): the tools a user would pick instead of the
engine do the embedding family's job on the same checkpoint, and the batches counted for
their share of the machine's limit are the ones they really send."""

import numpy as np
import onnxruntime as ort
import pytest

from export.backbone import plain_backbone as plain_export, plain_backbone_int8 as plain_int8
from engine.bench.peers import call_texts, embedding_peers, fastembed_peer, sentence_transformers_peer
from tests.utils import PASSAGES, QUESTION

pytestmark = pytest.mark.inprocess

pytest.importorskip("fastembed", reason="fastembed comes with the [bench] extra")
pytest.importorskip("sentence_transformers", reason="sentence-transformers comes with [default-model]")

FE32 = "peer: fastembed (ONNX Runtime fp32, plain export; embed + cosine, no decisions)"
FE8 = "peer: fastembed (ONNX Runtime int8 dynamic, per-tensor weights; embed + cosine, no decisions)"
ST = "peer: sentence-transformers (torch fp32; encode + cosine, no decisions)"


@pytest.fixture(scope="module")
def peers(checkpoints, tmp_path_factory):
    logs: list[str] = []
    out = embedding_peers(
        str(checkpoints["embedding"]), tmp_path_factory.mktemp("peers"), threads=1, log=logs.append
    )
    return out, logs


def test_every_peer_is_there_and_named(peers):
    found, logs = peers
    assert set(found) == {FE32, FE8, ST}
    assert found[FE8].precision == "int8" and found[FE32].precision == "fp32"
    assert found[ST].graph == found[FE32].graph  # the same network's work per token
    assert any("exporting the checkpoint plainly" in m for m in logs)


def test_fastembed_gives_sentence_transformers_cosines(peers):
    """Two independent libraries on one checkpoint: fastembed (ONNX Runtime on the plain
    export, its own tokenizer handling and pooling) and sentence-transformers (PyTorch)
    agree on every sentence's cosine; dynamic int8 stays close."""
    found, _ = peers
    st = np.concatenate(found[ST].prune(QUESTION, PASSAGES))
    fe = np.concatenate(found[FE32].prune(QUESTION, PASSAGES))
    fe8 = np.concatenate(found[FE8].prune(QUESTION, PASSAGES))
    assert len(st) == len(call_texts(QUESTION, PASSAGES)[0]) - 1
    assert np.abs(st - fe).max() < 1e-5
    assert np.abs(st - fe8).max() < 0.1 and np.corrcoef(st, fe8)[0, 1] > 0.9


def test_counted_batches_are_the_ones_sent(peers, monkeypatch):
    """The limit share counts the (rows, padded length) batches each library sends: checked
    against the input_ids shapes fastembed's ONNX Runtime session and sentence-transformers'
    forward really receive."""
    found, _ = peers
    texts = call_texts(QUESTION, PASSAGES * 30)[0]  # more than one batch of 64
    seen: list[tuple[int, int]] = []
    run = ort.InferenceSession.run

    def recording(self, names, feed, *a, **k):
        seen.append(tuple(feed["input_ids"].shape))
        return run(self, names, feed, *a, **k)

    monkeypatch.setattr(ort.InferenceSession, "run", recording)
    found[FE32].embed(texts)
    assert len(seen) > 1 and seen == found[FE32].shapes(texts)
    monkeypatch.undo()

    from sentence_transformers import SentenceTransformer

    seen.clear()
    forward = SentenceTransformer.forward

    def recording_forward(self, features, *a, **k):
        seen.append(tuple(features["input_ids"].shape))
        return forward(self, features, *a, **k)

    monkeypatch.setattr(SentenceTransformer, "forward", recording_forward)
    found[ST].embed(texts)
    assert len(seen) > 1 and seen == found[ST].shapes(texts)


def test_plain_export_is_the_backbone_and_quantizes(checkpoints, tmp_path):
    """The plain export is the backbone's last_hidden_state (checked against transformers'
    own forward) and its int8 form has dynamic int8 products."""
    import onnx
    import torch
    from transformers import AutoModel, AutoTokenizer

    ck = str(checkpoints["embedding"])
    folder = plain_export(ck, tmp_path / "fp32")
    tok = AutoTokenizer.from_pretrained(ck)
    enc = tok([QUESTION, PASSAGES[0]], padding=True, return_tensors="np")
    feed = {n: enc[n].astype(np.int64) for n in ("input_ids", "attention_mask", "token_type_ids")}
    got = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"]).run(
        None, feed
    )[0]
    model = AutoModel.from_pretrained(ck).eval()
    with torch.inference_mode():
        want = model(**{n: torch.from_numpy(v) for n, v in feed.items()}).last_hidden_state.numpy()
    assert np.abs(got - want).max() < 1e-4
    int8 = plain_int8(folder, tmp_path / "int8")
    ops = {n.op_type for n in onnx.load(str(int8 / "model.onnx")).graph.node}
    assert "MatMulInteger" in ops and (int8 / "tokenizer.json").is_file()
    assert fastembed_peer(int8, threads=1) is not None and sentence_transformers_peer(ck) is not None


def test_a_peer_in_another_interpreter_answers_as_in_this_one(checkpoints, tmp_path):
    """`--peer-python`'s worker (engine/bench/peer_worker.py), here with this interpreter and
    sentence-transformers' torch backend: the embeddings that come back over the pipe are
    the in-process peer's, call after call; a worker that cannot start says why."""
    import sys

    from engine.bench.peers import CosinePeer, RemotePeer

    ck = str(checkpoints["embedding"])
    remote = RemotePeer(sys.executable, ck, "torch", tmp_path / "w")
    try:
        assert remote.model == "torch fp32"
        peer, local = CosinePeer(remote.embed, lambda t: []), sentence_transformers_peer(ck)
        for passages in (PASSAGES, PASSAGES[:1]):
            for a, b in zip(peer.prune(QUESTION, passages), local.prune(QUESTION, passages)):
                np.testing.assert_allclose(a, b, atol=1e-5)
    finally:
        remote.close()
    assert remote.proc.returncode == 0
    with pytest.raises(RuntimeError, match="did not start"):
        RemotePeer(sys.executable, str(tmp_path / "missing"), "torch", tmp_path / "w2")
