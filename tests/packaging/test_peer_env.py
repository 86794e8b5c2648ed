"""`prune bench --peer-python`: sentence-transformers' ONNX and OpenVINO backends, each with
its own INT8 export, in the environment docs/installing.md makes for them (their optimum
pins transformers<4.58, so not beside the engine), answer a call on the same checkpoint
as sentence-transformers' torch backend does here, within INT8's error."""

import numpy as np
import pytest

from engine.bench.peers import PEER_ENV, REMOTE_PEERS, remote_peers, sentence_transformers_peer
from tests.utils import PASSAGES, QUESTION, fresh_venv

pytestmark = pytest.mark.packaging


def test_sentence_transformers_own_int8_backends_run_from_their_environment(checkpoints, tmp_path):
    python = fresh_venv(tmp_path / "venv", *PEER_ENV)
    ck = str(checkpoints["embedding"])
    logs: list[str] = []
    peers = remote_peers(str(python), ck, tmp_path / "work", logs.append)
    want = sentence_transformers_peer(ck).prune(QUESTION, PASSAGES)
    try:
        assert set(peers) == set(REMOTE_PEERS.values())
        models = {worker.model for _, worker in peers.values()}
        assert any(m.startswith("onnx onnx/model_") for m in models), models  # its dynamic int8 file
        assert any(m.startswith("openvino openvino/") and "quantized" in m for m in models), models
        for name, (peer, _) in peers.items():
            got = peer.prune(QUESTION, PASSAGES)
            assert [len(g) for g in got] == [len(w) for w in want], name
            worst = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
            assert worst < 0.1, (name, worst)  # int8 against fp32 cosines
    finally:
        for _, worker in peers.values():
            worker.close()
