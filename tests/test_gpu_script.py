"""benchmarks/gpu.sh, rehearsed on CPU with a tiny configuration (GPU_DRY_RUN=1) so the
one prepared GPU run cannot rot: it installs from a folder of wheels whose file was split
into pieces, each uploaded into a folder of its own (joined first), reports the providers,
and writes JSON, markdown and PNG with the PyTorch and ONNX Runtime paths and the fidelity
check; packages and models stay outside OUT, which holds at most 8 files under 16 MiB."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_dry_run(tmp_path):
    # a wheel folder as the GPU machine gets it: one wheel in 3 pieces (here a tiny pure
    # Python wheel of ours, so the install step runs for real without a package index)
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
    data = whl.read_bytes()
    third = len(data) // 3 + 1
    for i, suffix in enumerate(("aa", "ab", "ac")):   # each upload brings its piece in a folder of its own
        (wheels / f"upload{2 - i}").mkdir()
        (wheels / f"upload{2 - i}" / f"{whl.name}.part-{suffix}").write_bytes(data[i * third:(i + 1) * third])
    out = tmp_path / "out"
    rag = tmp_path / "rag.jsonl"
    rag.write_text("".join(json.dumps({"question": f"What happened in {1900 + i}?", "gold": 0,
                                       "passages": [f"In {1900 + i} the stadium opened. It held {i} people.",
                                                    "Another passage about the weather."]}) + "\n"
                           for i in range(3)))
    work = tmp_path / "work"
    env = {**os.environ, "GPU_DRY_RUN": "1", "WHEELS": str(wheels), "BUDGET_S": "120", "GPU_WORK": str(work),
           "RAG_DATA": str(rag), "RAG_QUERIES": "3",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "joined 3 pieces" in proc.stdout
    assert (work / "site" / "prune_gpu_probe" / "__init__.py").is_file()
    assert not list((work / "site").rglob("*.pyc"))                     # --no-compile
    assert "CPUExecutionProvider" in (work / "logs" / "providers.txt").read_text()
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
