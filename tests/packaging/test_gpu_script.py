"""benchmarks/gpu.sh, rehearsed on CPU with a tiny configuration (GPU_DRY_RUN=1) so the
GPU run cannot rot: it installs offline from a folder of wheels (one of them split into
pieces, as a size-limited transfer leaves it: joined first), reports the providers,
and writes JSON, markdown and PNG with the PyTorch and ONNX Runtime paths and the fidelity
check; packages and models stay outside OUT, which holds at most 8 files under 16 MiB."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["this environment", "the GPU machine's versions"])
def python(request) -> Path:
    """The python gpu.sh runs with: this environment's, or a venv with the GPU machine's
    Python-level versions (transformers 5.17, onnx 1.23, onnxruntime 1.31.1, numpy 2,
    protobuf 7: conftest.MACHINE_VERSIONS), where fp16 exports and DeBERTa's scripted
    helpers failed before (#28 items 1, 2)."""
    if request.param == "this environment":
        return Path(sys.executable)
    return request.getfixturevalue("machine_python")


def test_gpu_script_dry_run(tmp_path, python):
    # a wheel folder as a size-limited transfer leaves it: one wheel in 3 pieces, in folders of
    # their own (here a tiny pure Python wheel of ours, so the install runs for real offline)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build = tmp_path / "pkg"
    (build / "prune_gpu_probe").mkdir(parents=True)
    (build / "prune_gpu_probe" / "__init__.py").write_text("VALUE = 42\n")
    (build / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=77"]\n'
                                          'build-backend = "setuptools.build_meta"\n'
                                          '[project]\nname = "prune-gpu-probe"\nversion = "1.0"\n')
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(build)], check=True, capture_output=True, timeout=300)
    whl = next(tmp_path.glob("prune_gpu_probe-*.whl"))
    rag = tmp_path / "rag-all.jsonl"
    rag.write_text("".join(json.dumps({"question": f"What happened in {1900 + i}?", "gold": 0,
                                       "passages": [f"In {1900 + i} the stadium opened. It held {i} people.",
                                                    "Another passage about the weather."]}) + "\n"
                           for i in range(5)))
    data, size = whl.read_bytes(), whl.stat().st_size // 3 + 1
    for k, suffix in enumerate(("aa", "ab", "ac")):          # as `split -b SIZE X.whl X.whl.part-` names them
        (wheels / f"p{k + 1}").mkdir()
        (wheels / f"p{k + 1}" / f"{whl.name}.part-{suffix}").write_bytes(data[k * size:(k + 1) * size])
    rag = tmp_path / "rag.jsonl"
    rag.write_text("".join((tmp_path / "rag-all.jsonl").read_text().splitlines(keepends=True)[:3]))
    out = tmp_path / "out"
    work = tmp_path / "work"
    env = {**os.environ, "GPU_DRY_RUN": "1", "WHEELS": str(wheels), "BUDGET_S": "120", "GPU_WORK": str(work),
           "RAG_DATA": str(rag), "RAG_QUERIES": "3",
           "PATH": f"{python.parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "joined 3 pieces" in proc.stdout
    assert (work / "site" / "prune_gpu_probe" / "__init__.py").is_file()
    assert not list((work / "site").rglob("*.pyc"))                     # --no-compile
    providers = (work / "logs" / "providers.txt").read_text()
    assert "provider CPUExecutionProvider: runs" in providers, providers
    if python != Path(sys.executable):
        assert "onnxruntime 1.31.1" in providers and "transformers 5.17.0" in providers, providers
    # no If node in the exports (transformers 5.17 scripts DeBERTa's helpers; traced as Python)
    import onnx
    for precision in ("fp32", "fp16"):
        graph = onnx.load(str(work / "models" / precision / "model.onnx"), load_external_data=False).graph
        assert not [n for n in graph.node if n.op_type == "If"], precision
    assert "budget: 120 s in all" in proc.stdout
    # what comes back from the GPU machine: at most 8 files, each under 16 MiB, no packages or models
    files = [f for f in out.rglob("*") if f.is_file()]
    assert len(files) <= 8 and all(f.stat().st_size < 16 * 2 ** 20 for f in files), files
    assert {f.name for f in files} == {"gpu.json", "gpu.md", "gpu.png", "bench.json", "bench.md", "results.tar.gz"}
    import tarfile
    with tarfile.open(out / "results.tar.gz") as tar:
        names = tar.getnames()
    assert {"logs/gpu.log", "logs/bench.log", "logs/providers.txt"} <= set(names), names
    report = json.loads((out / "gpu.json").read_text())
    paths = {r.get("path") or f"torch {r.get('attn')} {r.get('dtype')}" for r in report["rows"]}
    assert {"torch eager float32", "onnxruntime-cpu fp32", "onnxruntime-cpu fp16"} <= paths
    checks = {r["path"]: r["max_abs_dprob"] for r in report["rows"] if "max_abs_dprob" in r}
    assert checks["onnxruntime-cpu fp32"] < 1e-5 and checks["onnxruntime-cpu fp16"] < 2e-2
    assert not [r for r in report["rows"] if "error" in r], [r for r in report["rows"] if "error" in r]
    md = (out / "gpu.md").read_text()
    assert "| onnxruntime-cpu fp32 | 64 |" in md and "p50 / p99" in md
    assert (out / "gpu.png").stat().st_size > 1000
    # prune bench on the RAG workload with the kept exports (on the GPU: --device cuda)
    bench = json.loads((out / "bench.json").read_text())
    assert bench["settings"]["device"] == "cpu"
    assert {"torch-unbatched (reference)", "onnxruntime-fp32", "onnxruntime-fp16"} <= {r["path"] for r in bench["paths"]}
