"""test_precision's tests that need no model and no server (the rest: tests/inprocess/test_precision.py)."""

import numpy as np
import onnxruntime as ort
import pytest
from engine.fidelity_check import fidelity_report, rankdata, spearman
from export.tensorrt import profiles, trtexec_command, write_build_script
from export.optimize import fix_graph

pytestmark = pytest.mark.unit


def test_fidelity_report_with_a_known_disagreement():
    ref = [np.array([0.05, 0.2, 0.6]), np.array([0.9, 0.45])]
    got = [np.array([0.05, 0.35, 0.6]), np.array([0.9, 0.55])]
    rep = fidelity_report(
        ref, got, [1.0, 2.0], [1.1, 1.9], ["a", "b"], ["a", "c"], thresholds=(0.1, 0.3, 0.5)
    )
    assert rep["decision_agreement"] == {"0.1": 1.0, "0.3": 0.8, "0.5": 0.8}
    assert rep["max_abs_delta_prob"] == pytest.approx(0.15)
    assert rep["mean_abs_delta_prob"] == pytest.approx(0.25 / 5)
    assert rep["rerank_max_abs_error"] == pytest.approx(0.1)
    assert rep["rerank_spearman"] == pytest.approx(1.0)
    assert rep["pruned_text_changed_share"] == 0.5
    assert rankdata(np.array([3.0, 1.0, 3.0])).tolist() == [2.5, 1.0, 2.5]
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_tensorrt_profiles_follow_the_buckets():
    names = ["input_ids", "attention_mask", "sentence_ids"]
    buckets = list(range(32, 513, 32))
    profs = profiles(names, buckets, max_batch_size=64)
    assert len(profs) == 3
    assert profs[0]["input_ids"] == ((1, 32), (32, 128), (64, 128))
    assert profs[1]["input_ids"] == ((1, 160), (32, 256), (64, 256))
    assert profs[2]["sentence_ids"] == ((1, 288), (32, 512), (64, 512))
    single = profiles(names, [64, 128], max_batch_size=8, groups=(512,), opt_batch=4)
    assert single == [{n: ((1, 64), (4, 128), (8, 128)) for n in names}]


def test_trtexec_command_and_script(tmp_path):
    prof = {"input_ids": ((1, 32), (8, 256), (16, 512)), "sentence_ids": ((1, 32), (8, 256), (16, 512))}
    cmd = trtexec_command("m.onnx", "m.plan", prof, "fp16")
    assert cmd[:3] == ["trtexec", "--onnx=m.onnx", "--saveEngine=m.plan"]
    assert "--minShapes=input_ids:1x32,sentence_ids:1x32" in cmd
    assert "--optShapes=input_ids:8x256,sentence_ids:8x256" in cmd
    assert "--maxShapes=input_ids:16x512,sentence_ids:16x512" in cmd
    assert "--fp16" in cmd and "--int8" not in cmd
    assert "--int8" in trtexec_command("m.onnx", "m.plan", prof, "int8")
    with pytest.raises(ValueError):
        trtexec_command("m.onnx", "m.plan", prof, "fp4")
    script = write_build_script(tmp_path, ["input_ids"], [64, 512], 32, "fp16")
    assert "--maxShapes=input_ids:32x512" in script.read_text()


def test_tensorrt_graph_fix_rewrites_uint8_casts():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("mask", TensorProto.INT64, ["b", "l"])
    y = helper.make_tensor_value_info("out", TensorProto.BOOL, ["b", "l"])
    nodes = [
        helper.make_node("Cast", ["mask"], ["m8"], to=TensorProto.UINT8, name="u8"),
        helper.make_node("Cast", ["m8"], ["mb"], to=TensorProto.BOOL, name="b"),
        helper.make_node("Not", ["mb"], ["out"], name="not"),
        helper.make_node("Cast", ["mask"], ["m8b"], to=TensorProto.UINT8, name="u8_logical"),
        helper.make_node("Cast", ["mask"], ["dbl"], to=TensorProto.DOUBLE, name="dbl"),
    ]
    # a uint8 cast feeding only logical ops becomes BOOL, others INT32; double becomes float
    nodes.insert(4, helper.make_node("Not", ["m8b"], ["unused"], name="not2"))
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    feed = {"mask": np.array([[1, 0, 1]], dtype=np.int64)}
    before = ort.InferenceSession(
        helper.make_model(
            helper.make_graph(nodes[:3], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
        ).SerializeToString()
    ).run(None, feed)
    changed = fix_graph(model)
    assert changed == {"uint8_casts": 2, "double_casts": 1}
    to = {
        n.name: next(a.i for a in n.attribute if a.name == "to")
        for n in model.graph.node
        if n.op_type == "Cast"
    }
    assert to == {
        "u8": TensorProto.INT32,
        "b": TensorProto.BOOL,
        "u8_logical": TensorProto.BOOL,
        "dbl": TensorProto.FLOAT,
    }
    after = ort.InferenceSession(model.SerializeToString()).run(["out"], feed)
    assert (before[0] == after[0]).all()


def test_tensorrt_provider_profiles_span_the_buckets(tmp_path):
    from engine.backends.onnxruntime import tensorrt_options

    opts = tensorrt_options(
        ["input_ids", "attention_mask", "sentence_ids"], [16, 32, 64, 128, 256, 512], 64, tmp_path / "cache"
    )
    assert opts["trt_fp16_enable"] and opts["trt_engine_cache_enable"]
    assert opts["trt_engine_cache_path"] == str(tmp_path / "cache")
    assert opts["trt_profile_min_shapes"] == "input_ids:1x16,attention_mask:1x16,sentence_ids:1x16"
    assert opts["trt_profile_opt_shapes"] == "input_ids:8x128,attention_mask:8x128,sentence_ids:8x128"
    assert opts["trt_profile_max_shapes"] == "input_ids:64x512,attention_mask:64x512,sentence_ids:64x512"
