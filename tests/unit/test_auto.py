"""`prune export --precision auto`'s choice (export/auto.py: pick) and the fidelity gate it
applies (engine/fidelity_check.py: gate), on figures given here."""

import math

import pytest

from engine.errors import ExportError
from engine.fidelity_check import GATE, gate
from export.auto import GATE_CALLS, gate_docs, pick

pytestmark = pytest.mark.unit


def _report(agreement, rho, threshold=0.5):
    return {"decision_agreement": {"0.1": 1.0, str(threshold): agreement}, "rerank_spearman": rho}


def test_the_gate_needs_both_figures():
    assert GATE == {"agreement": 0.99, "spearman": 0.99}
    assert gate(_report(0.995, 0.995), 0.5)["passed"]
    assert gate(_report(0.99, 0.99), 0.5)["passed"]  # the bounds pass
    assert not gate(_report(0.9899, 0.999), 0.5)["passed"]
    failed = gate(_report(0.999, 0.985), 0.5)
    assert not failed["passed"] and "Spearman 0.9850 (>= 0.99: no)" in failed["reason"]
    assert gate(_report(0.999, math.nan), 0.5)["passed"]  # no spread: agreement decides
    assert not gate(_report(0.98, math.nan), 0.5)["passed"]
    assert gate(_report(1.0, 1.0, threshold=0.87), 0.87)["agreement"] == 1.0  # read at the family's threshold


def test_the_fastest_that_passes_is_picked():
    c = {
        "fp32": {"passed": True, "seconds": 1.0},
        "int8": {"passed": True, "seconds": 0.6},
        "ov-int8": {"passed": False, "seconds": 0.4},
    }
    assert pick(c) == "int8"  # ov-int8 is faster but failed its gate
    c["ov-int8"]["passed"] = True
    assert pick(c) == "ov-int8"
    c["int8"]["seconds"] = c["ov-int8"]["seconds"] = 2.0
    assert pick(c) == "fp32"
    with pytest.raises(ExportError, match="no precision passed"):
        pick({p: {**v, "passed": False} for p, v in c.items()})


def test_another_runtime_is_picked_only_beyond_its_noise():
    # OpenVINO 1% faster than ONNX Runtime's int8: noise, the export stays on ONNX Runtime
    c = {
        "fp32": {"passed": True, "seconds": 1.0, "spread": 0.01},
        "int8": {"passed": True, "seconds": 0.50, "spread": 0.01},
        "ov-bf16": {"passed": True, "seconds": 0.495, "spread": 0.01},
    }
    assert pick(c) == "int8"
    c["ov-bf16"]["seconds"] = 0.45  # 10% faster, spreads of 1%: switched
    assert pick(c) == "ov-bf16"
    c["ov-bf16"]["spread"] = 0.15  # but its own rounds spread 15%: not beyond its noise
    assert pick(c) == "int8"
    c["int8"]["seconds"] = 0.9  # int8 slower than ov-bf16 by far: switched
    assert pick(c) == "ov-bf16"


def test_the_built_in_gate_calls_are_rag_shaped_and_apart_from_the_calibration_text():
    from export.ov_int8 import CALIBRATION_TEXTS

    docs = gate_docs()
    assert len(docs) == sum(len(ps) for _, ps in GATE_CALLS) >= 24
    assert all(len(ps) >= 3 for _, ps in GATE_CALLS)
    assert not {d.context for d in docs} & set(CALIBRATION_TEXTS)
