"""ONNX Runtime's denormal floats: flushed to zero while the engine's sessions run
(PRUNE_ORT_DENORMALS=flush, the default), IEEE with keep; the caller's own floating-point
state is the same before and after. Cases that watch a thread's state run in a fresh
process: ORT sets the flags of the thread that makes the process's first session."""

import json
import platform
import subprocess
import sys

import numpy as np
import pytest

import engine.backends.onnxruntime as ort_backend
from engine.models.loading import LoadOptions
from engine.pruner import Pruner

pytestmark = [
    pytest.mark.inprocess,
    pytest.mark.skipif(
        sys.platform != "linux" or platform.machine() != "x86_64",
        reason="the thread's flags are set through glibc on x86-64 Linux only",
    ),
]

#: a session of `x * 1e-30` over values of 1e-10 (1e-40: a denormal) on one intra-op thread
#: (so the calling thread computes all of it), made with the engine's session options and
#: run from a worker thread that existed before it (the HTTP API's pool); prints the run's
#: distinct results, then 1e-20 * 1e-20 computed by that thread and by the main thread after
PROBE = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
import numpy as np, onnxruntime as ort
from onnx import TensorProto, helper
from engine.backends.onnxruntime import session_options, thread_denormals
pool = ThreadPoolExecutor(1)
pool.submit(lambda: None).result()
g = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
                      [helper.make_tensor("k", TensorProto.FLOAT, [1], [1e-30])])
model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
opts, _ = session_options(ort, 1, denormals=sys.argv[1])
with thread_denormals(False):
    s = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
tiny = lambda: float(np.float32(1e-20) * np.float32(1e-20))
def run():
    with thread_denormals(sys.argv[1] == "flush"):
        y = s.run(None, {"x": np.full(4096, 1e-10, dtype=np.float32)})[0]
    return sorted({float(v) for v in y}), tiny()
ran, worker_after = pool.submit(run).result()
print(json.dumps([ran, worker_after, tiny()]))
"""


@pytest.mark.parametrize("mode", ["flush", "keep"])
def test_a_run_flushes_denormals_in_the_calling_thread_and_leaves_its_state_as_it_was(mode):
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    ran, worker_after, main_after = json.loads(out.stdout.splitlines()[-1])
    if mode == "flush":
        assert ran == [0.0]
    else:
        assert len(ran) == 1 and 0 < ran[0] < 1.2e-38, ran  # an IEEE denormal
    assert 0 < worker_after < 1.2e-38 and 0 < main_after < 1.2e-38, "the caller's state changed"


@pytest.mark.parametrize("mode", ["flush", "keep"])
def test_a_pruner_runs_as_its_load_option_says(exported, mode, monkeypatch):
    pruner = Pruner.load(exported["provence"], LoadOptions(denormals=mode, threads=1))
    opts = pruner.backend.session.get_session_options()
    assert opts.get_session_config_entry("session.set_denormal_as_zero") == ("1" if mode == "flush" else "0")
    seen = []
    real = ort_backend.thread_denormals

    def recording(flush):
        seen.append(flush)
        return real(flush)

    monkeypatch.setattr(ort_backend, "thread_denormals", recording)
    pruner.prune("Who built it?", ["It was built in 1923. It holds 80,000 people."])
    assert seen and set(seen) == {mode == "flush"}
    assert 0 < float(np.float32(1e-20) * np.float32(1e-20)) < 1.2e-38, "this thread keeps IEEE denormals"
