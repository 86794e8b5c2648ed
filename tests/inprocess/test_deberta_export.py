"""DeBERTa's position-term indices are exported once per graph (export/deberta.py), and the
graph computes exactly what it computed with transformers' per-layer indices."""

import collections
import contextlib
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from export import deberta
from export.onnx import export_model
from tests.utils import PASSAGES, QUESTION

pytestmark = pytest.mark.inprocess


def _ops(folder):
    return collections.Counter(n.op_type for n in onnx.load(str(folder / "model.onnx")).graph.node)


def test_provence_graph_builds_its_position_indices_once(exported, checkpoints):
    layers = json.loads((checkpoints["provence"] / "config.json").read_text())["num_hidden_layers"]
    assert layers >= 2
    ops = _ops(exported["provence"])
    assert ops["GatherElements"] == 2 * layers  # c2p and p2c in every layer
    assert ops["Expand"] <= 2  # their indices: once for all layers


def test_shared_indices_change_no_output_bit(exported, checkpoints, tmp_path, monkeypatch):
    """The same checkpoint exported with transformers' own method: more Expand nodes, the
    same outputs bit for bit on the engine's batches (fp32 and INT8)."""
    from engine.pruner import Pruner

    shared_dirs = {"fp32": exported["provence"], "int8": tmp_path / "shared-int8"}
    export_model(checkpoints["provence"], shared_dirs["int8"], precision="int8", log=lambda m: None)
    monkeypatch.setattr(deberta, "shared_position_indices", lambda model, log=None: contextlib.nullcontext())
    for precision in ("fp32", "int8"):
        plain, shared = tmp_path / f"plain-{precision}", shared_dirs[precision]
        export_model(checkpoints["provence"], plain, precision=precision, log=lambda m: None)
        assert _ops(plain)["Expand"] > _ops(shared)["Expand"]
        pruner = Pruner.load(plain, threads=1)
        batches = pruner.prepare(QUESTION, PASSAGES).batches
        sessions = [
            ort.InferenceSession(str(f / "model.onnx"), providers=["CPUExecutionProvider"])
            for f in (plain, shared)
        ]
        for b in batches:
            feed = b.inputs([i.name for i in sessions[0].get_inputs()])
            a, s = (sess.run(None, feed) for sess in sessions)
            for x, y in zip(a, s):
                assert np.array_equal(x, y), precision


def test_an_unknown_deberta_attention_is_left_alone(checkpoints):
    """Another transformers' method (another signature) is not replaced; the log says so."""
    from transformers.models.deberta_v2 import modeling_deberta_v2 as deb
    from engine.pytorch.torch_model import load_torch_model

    model = load_torch_model(checkpoints["provence"]).module
    original = deb.DisentangledSelfAttention.disentangled_attention_bias

    def other(self, query_layer, key_layer, relative_pos, rel_embeddings, scale_factor, extra=None):
        return original(self, query_layer, key_layer, relative_pos, rel_embeddings, scale_factor)

    deb.DisentangledSelfAttention.disentangled_attention_bias = other
    try:
        notes = []
        with deberta.shared_position_indices(model, notes.append):
            assert deb.DisentangledSelfAttention.disentangled_attention_bias is other
        assert any("not the one export.deberta knows" in n for n in notes)
    finally:
        deb.DisentangledSelfAttention.disentangled_attention_bias = original
    notes = []
    with deberta.shared_position_indices(model, notes.append):
        assert deb.DisentangledSelfAttention.disentangled_attention_bias is deberta.shared_bias
    assert deb.DisentangledSelfAttention.disentangled_attention_bias is original
    assert notes == ["exporting DeBERTa's position indices once for all layers"]
