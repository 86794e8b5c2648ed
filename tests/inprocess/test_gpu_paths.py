"""The CUDA paths' choices, checked without a GPU (#28 items 7-10): ONNX Runtime is made
to offer CUDA and TensorRT, and the session records what the backend asked for.

- device "cpu" asks for the CPU alone, even where onnxruntime-gpu offers CUDA first;
- device "cuda" turns the CUDA provider's TF32 off (PyTorch fp32 does not use it);
- a TensorRT request that ONNX Runtime quietly ran on CUDA says so, and gpu.py measures it
  once (as CUDA), not twice;
- benchmarks/gpu.py runs again into the same --keep folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnxruntime
import pytest

from engine.backends import onnxruntime as backend_module
from engine.backends.onnxruntime import TENSORRT_FALLBACK, OnnxRuntimeBackend

pytestmark = pytest.mark.inprocess

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gpu_offered(monkeypatch):
    """onnxruntime offering CUDA (and TensorRT); sessions run on the CPU but report the
    first provider asked for, unless `runs` says which one 'loaded'."""
    asked: list = []
    state = {"runs": None}
    real = onnxruntime.InferenceSession

    class Session:
        def __init__(self, path, sess_options=None, providers=None):
            asked.append(providers)
            self._s = real(path, sess_options=sess_options, providers=["CPUExecutionProvider"])
            first = providers[0] if isinstance(providers[0], str) else providers[0][0]
            self._providers = [state["runs"] or first, "CPUExecutionProvider"]

        def get_providers(self):
            return self._providers

        def __getattr__(self, name):
            return getattr(self._s, name)

    monkeypatch.setattr(
        onnxruntime,
        "get_available_providers",
        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    monkeypatch.setattr(onnxruntime, "InferenceSession", Session)
    return asked, state


def test_device_cpu_asks_for_the_cpu_alone(gpu_offered, exported):
    asked, _ = gpu_offered
    OnnxRuntimeBackend(exported["xprovence"] / "model.onnx", device="cpu")
    assert asked[-1] == ["CPUExecutionProvider"]


def test_device_cuda_turns_tf32_off(gpu_offered, exported):
    asked, _ = gpu_offered
    b = OnnxRuntimeBackend(exported["xprovence"] / "model.onnx", device="cuda", io_binding=False)
    cuda = next(p[1] for p in asked[-1] if isinstance(p, tuple) and p[0] == "CUDAExecutionProvider")
    assert cuda["use_tf32"] == 0 and not b.tensorrt_fallback


def test_a_tensorrt_request_run_on_cuda_says_so(gpu_offered, exported):
    asked, state = gpu_offered
    state["runs"] = "CUDAExecutionProvider"  # TensorRT's libraries did not load
    said: list[str] = []
    b = OnnxRuntimeBackend(
        exported["xprovence"] / "model.onnx",
        device="cuda",
        io_binding=False,
        tensorrt=backend_module.tensorrt_options(["input_ids"], [128], 8, Path("trt")),
        log=said.append,
    )
    assert asked[-1][0][0] == "TensorrtExecutionProvider"
    assert b.tensorrt_fallback and said == [TENSORRT_FALLBACK]
    state["runs"] = None  # TensorRT ran: no note
    said.clear()
    b = OnnxRuntimeBackend(
        exported["xprovence"] / "model.onnx",
        device="cuda",
        io_binding=False,
        tensorrt=backend_module.tensorrt_options(["input_ids"], [128], 8, Path("trt")),
        log=said.append,
    )
    assert not b.tensorrt_fallback and said == []


def _system_library() -> Path:
    """A real shared library of this machine, to stand in for a CUDA one."""
    import ctypes.util

    for name in ("z", "bz2", "lzma", "ffi"):
        found = ctypes.util.find_library(name)
        if found:
            for d in (
                "/lib/x86_64-linux-gnu",
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib64",
                "/lib64",
                "/usr/lib",
            ):
                if (Path(d) / found).is_file():
                    return Path(d) / found
    pytest.skip("no system shared library to stand in for a CUDA one")


def test_cuda_libraries_are_found_on_sys_path_beside_a_target_install(tmp_path, monkeypatch):
    """onnxruntime-gpu in one folder (pip install --target), the nvidia packages in another
    sys.path entry: ONNX Runtime's preload_dlls looks beside onnxruntime only; the backend
    searches every nvidia/*/lib on sys.path (#28 item 6)."""
    import shutil

    site = tmp_path / "site"
    lib = site / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    shutil.copy(_system_library(), lib / "libcurand.so.10")  # a loadable library under CUDA's name
    assert "libcurand.so.10" not in backend_module.loaded_libraries()
    before = backend_module.preload_cuda_libraries(onnxruntime)
    assert "libcurand.so" in before  # not on sys.path yet
    monkeypatch.syspath_prepend(str(site))
    after = backend_module.preload_cuda_libraries(onnxruntime)
    assert "libcurand.so" not in after and "libcurand.so.10" in backend_module.loaded_libraries()


def test_a_cuda_session_that_fell_back_to_the_cpu_names_the_missing_libraries(
    gpu_offered, exported, monkeypatch
):
    from engine.errors import ModelLoadError

    _, state = gpu_offered
    state["runs"] = "CPUExecutionProvider"  # the CUDA provider did not load
    monkeypatch.setattr(backend_module, "preload_cuda_libraries", lambda ort: ["libcudnn.so", "libcublas.so"])
    with pytest.raises(ModelLoadError, match=r"did not load.*libcudnn\.so, libcublas\.so.*cuda,cudnn"):
        OnnxRuntimeBackend(exported["xprovence"] / "model.onnx", device="cuda", io_binding=False)


def test_gpu_py_stopped_by_timeout_keeps_what_it_measured(tmp_path):
    """gpu.sh runs benchmarks.gpu under `timeout` (#28 item 4): on SIGTERM the report and
    the markdown are still written, with every case measured so far; a rerun into the same
    keep folder reuses what the stopped run exported. The signal comes once
    the engine's first timed row is in (how long that takes depends on the machine's load)."""
    import signal
    import time

    out, md = tmp_path / "gpu.json", tmp_path / "gpu.md"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu",
            "--tiny",
            "--device",
            "cpu",
            "--out",
            str(out),
            "--markdown",
            str(md),
            "--keep",
            str(tmp_path / "m"),
            "--lengths",
            "16",
            "32",
            "64",
            "--batches",
            "1",
            "4",
            "16",
            "--dtypes",
            "float32",
            "bfloat16",
            "--attn",
            "eager",
            "sdpa",
            "--iters",
            "30",
            "--budget-s",
            "600",
            "--cut-layers",
            "0",
            "--no-check",  # the GPU check is the dry run's (tests/packaging/test_gpu_script.py)
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # a session of its own, as under gpu.sh's `timeout`: in the full suite the
        # pytest-xdist worker running this test died twice when it shared the group
        start_new_session=True,
    )

    def engine_timed() -> bool:
        try:
            rows = json.loads(out.read_text())["rows"]
        except (OSError, ValueError):
            return False
        return any(r.get("path") == "onnxruntime-cpu fp16" and "ms_per_batch" in r for r in rows)

    deadline = time.monotonic() + 150
    while not engine_timed() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None and engine_timed(), "the run ended, or no engine row came within 150 s"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    report = json.loads(out.read_text())
    assert report["info"]["stopped"].startswith("stopped by SIGTERM after ")
    assert any("sequences_per_s" in r for r in report["rows"])
    text = md.read_text()
    assert "| onnxruntime-cpu fp16 |" in text and "not reached or not finished: stopped by SIGTERM" in text
    # a rerun into the same keep folder (gpu.sh's GPU_WORK) reuses the stopped run's export
    rerun = tmp_path / "rerun.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--tiny", "--device", "cpu", "--out", str(rerun)]
        + ["--keep", str(tmp_path / "m"), "--lengths", "16", "--batches", "1", "--dtypes", "float32"]
        + ["--attn", "eager", "--iters", "1", "--cut-layers", "0", "--peers", "eager", "--no-check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(rerun.read_text())["rows"]
    assert not [r for r in rows if "error" in r], [r for r in rows if "error" in r]
    assert "onnxruntime-cpu fp16" in {r.get("path") for r in rows}
    exports = [r for r in rows if r.get("kind") == "export"]
    assert exports and all(r["reused"] for r in exports), exports
