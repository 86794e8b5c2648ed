"""fp16 exports made and loaded with the ONNX Runtime a `[gpu]` user has (#28 item 1).

onnxruntime 1.30 and 1.31 (1.31.1 is the newest onnxruntime-gpu) convert a graph to
float16 with one Cast per consumer of each float32-kept tensor, all writing one tensor
name, and then refuse what they wrote ("two nodes with same node name", "Duplicate
definition of name"); 1.32, the CPU build here, accepts it. In a fresh venv with
onnxruntime 1.31.1 and onnx 1.23.1 (the GPU machine's), `export.optimize.convert_fp16`
converts each trained family's fp32 graph; the graph must load there and agree with the
fp32 graph run here within the export's fp16 tolerance. The venv is the GPU machine's
versions (conftest.machine_python), shared with the gpu.sh rehearsal."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engine.pipeline.families import get_family
from export.onnx import FP16_TOLERANCE
from export.optimize import encoder_dims

pytestmark = pytest.mark.packaging


ROOT = Path(__file__).resolve().parents[2]
TRAINED = ["provence", "xprovence", "open_provence", "opensearch"]
SCRIPT = r"""
import sys, numpy as np
from pathlib import Path
root, src, dst, heads, hidden, keep_ln, feed, out = sys.argv[1:]
sys.path.insert(0, root)
from export.optimize import convert_fp16
convert_fp16(Path(src), Path(dst), int(heads), int(hidden), keep_ln == "1")
import onnxruntime as ort
s = ort.InferenceSession(dst, providers=["CPUExecutionProvider"])
f = dict(np.load(feed))
names = [o.name for o in s.get_outputs()]
np.savez(out, **dict(zip(names, s.run(None, {i.name: f[i.name] for i in s.get_inputs()}))), version=ort.__version__)
"""


@pytest.fixture(scope="module")
def old_ort(machine_python) -> Path:
    """The GPU machine's versions (conftest.MACHINE_VERSIONS: onnxruntime 1.31.1, onnx 1.23.1, ...)."""
    return machine_python


@pytest.mark.parametrize("family", TRAINED)
def test_fp16_conversion_loads_and_agrees_on_onnxruntime_1_31(
    old_ort, exported, checkpoints, family, tmp_path
):
    import onnxruntime as ort
    from engine.measuring import call_batches
    from engine.pruner import Pruner
    from engine.pipeline.text import split_sentences

    heads, hidden = encoder_dims(json.loads((checkpoints[family] / "config.json").read_text()))
    pruner = Pruner.load(exported[family])
    passages = [
        "The stadium was built in 1923. It holds 80,000 people. Its roof came later.",
        "Paris is the capital of France.",
    ]
    batch = call_batches(
        pruner, "When was the stadium built?", passages, [split_sentences(p) for p in passages]
    )[0]
    src = exported[family] / "model.onnx"
    fp32 = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    feed = batch.inputs([i.name for i in fp32.get_inputs()])
    np.savez(tmp_path / "feed.npz", **feed)
    keep_ln = "1" if get_family(family).backbone == "deberta-v2" else "0"
    run = subprocess.run(
        [
            str(old_ort),
            "-c",
            SCRIPT,
            str(ROOT),
            str(src),
            str(tmp_path / "fp16.onnx"),
            str(heads),
            str(hidden),
            keep_ln,
            str(tmp_path / "feed.npz"),
            str(tmp_path / "out.npz"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    assert str(got["version"]) == "1.31.1"
    want = dict(zip([o.name for o in fp32.get_outputs()], fp32.run(None, feed)))
    for name, value in want.items():
        np.testing.assert_allclose(
            got[name].astype(np.float32), value, atol=FP16_TOLERANCE, rtol=0, err_msg=name
        )


def test_repeated_casts_are_dropped_and_a_real_conflict_raises():
    from onnx import TensorProto, helper
    from engine.errors import ExportError
    from export.optimize import drop_repeated_nodes, unique_node_names

    cast = dict(to=TensorProto.FLOAT)
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["x32"], name="c", **cast),
            helper.make_node("Relu", ["x32"], ["a"], name="r1"),
            helper.make_node("Cast", ["x"], ["x32"], name="c", **cast),
            helper.make_node("Relu", ["x32"], ["b"], name="r1"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in "ab"],
    )
    assert drop_repeated_nodes(graph) == 1 and [n.op_type for n in graph.node] == ["Cast", "Relu", "Relu"]
    assert unique_node_names(graph) == 1 and len({n.name for n in graph.node}) == 3
    conflict = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["y"], name="c1", **cast),
            helper.make_node("Relu", ["x"], ["y"], name="c2"),
        ],
        "g",
        [],
        [],
    )
    with pytest.raises(ExportError, match="write the tensor y"):
        drop_repeated_nodes(conflict)
