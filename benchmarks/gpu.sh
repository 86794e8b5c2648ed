#!/usr/bin/env bash
# Every GPU path of the engine side by side, in one command of at most 8 minutes on a bare GPU
# machine (docs/performance.md, "The GPU run"): benchmarks/gpu.py on a Provence-size model
# (DeBERTa-v3-large configuration, random weights) and a 6-layer cut of it, the engine's
# ONNX Runtime CUDA fp16 path first, torch eager fp16 and torch.compile fp16 as its peers,
# then `prune bench --device cuda` on the RAG workload (the engine against torch batched fp16
# and torch.compile batched fp16 on the same calls).
#
# Usage (from the repository root):  benchmarks/gpu.sh [OUT_DIR]        (default benchmarks/results/gpu)
#   BUDGET_S   seconds for everything, the install included (default 450: the command ends within
#              about 460 s). Exports count in it; each part starts only when it fits (gpu.py's doc);
#              benchmarks.gpu runs under `timeout`, and whatever stops it, gpu.json and gpu.md hold
#              what was measured, the export times, and what was not measured and why.
#   RAG_DATA   the RAG workload of prune bench (default tests/data/squad-dev-rag.jsonl; empty: none),
#              RAG_QUERIES of it (default 10), 2 repeats; BENCH_PATHS: prune bench's --paths instead
#              of the default (the engine's fp16 path, torch batched fp16, torch.compile batched fp16)
#   GPU_FP32=1      also export fp32 and measure it (never by default: its export took 64 s on an H200)
#   GPU_TENSORRT=1  also ONNX Runtime's TensorRT provider (where its libraries load)
#   GPU_WORK   the work folder: packages, checkpoints, exports, logs (default /tmp/prune-gpu-UID).
#              Never OUT_DIR. A rerun with the same GPU_WORK reuses the checkpoints and exports there
#              (an export whose manifest names the same checkpoint, weights and precision; said so).
#   WHEELS     offline: a folder of wheels, searched recursively, installed without an index
#              (--no-index --no-deps --no-compile) into GPU_WORK/site, ahead of site-packages; wheels
#              split for a size-limited transfer (split -b 50m X.whl X.whl.part-) are joined first.
#              Without WHEELS the script runs with what is installed (pip install -e ".[gpu,export]").
#   GPU_DRY_RUN=1  the same script on the CPU with a tiny configuration (tests/packaging/test_gpu_script.py)
# OUT_DIR gets only gpu.json, gpu.md, gpu.png, bench.json, bench.md and results.tar.gz (every log:
# the providers check, gpu.log, the exports' logs, prune bench's folder), each checked to be under 16 MiB.
set -euo pipefail
t0=$(date +%s)
budget="${BUDGET_S:-450}"
left() { echo $(( budget - ($(date +%s) - t0) )); }
out="${1:-${OUT:-benchmarks/results/gpu}}"
mkdir -p "$out"
rm -f "$out"/gpu.json "$out"/gpu.md "$out"/gpu.png "$out"/bench.json "$out"/bench.md "$out"/results.tar.gz
work="${GPU_WORK:-${TMPDIR:-/tmp}/prune-gpu-$(id -u)}"
rm -rf "$work/logs"
mkdir -p "$work/wheels" "$work/logs"
export PYTHONUNBUFFERED=1
pythonpath="$(pwd)"
if [ -n "${WHEELS:-}" ]; then
  # whole wheels anywhere under WHEELS, and split ones joined from their pieces, wherever each is
  find "$WHEELS" -name '*.whl' -type f -exec cp {} "$work/wheels/" \;
  find "$WHEELS" -name '*.whl.part-*' -type f | sed 's/\.part-[a-z]*$//' | sort -u | while read -r whole; do
    name="$(basename "$whole")"
    find "$WHEELS" -name "$name.part-*" -type f -printf '%f %p\n' | sort | cut -d' ' -f2- | xargs -d '\n' cat > "$work/wheels/$name"
    echo "joined $(find "$WHEELS" -name "$name.part-*" -type f | wc -l) pieces into $name"
  done
  python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" "$work/wheels"/*.whl
  pythonpath="$work/site:$pythonpath"      # ahead of the CPU onnxruntime in site-packages
fi
export PYTHONPATH="$pythonpath${PYTHONPATH:+:$PYTHONPATH}"
echo "install: $(( $(date +%s) - t0 )) s"
# What the run needs, checked in seconds before anything else: the modules every export and the
# engine import (a bare GPU image lacks nupunkt and onnxruntime-gpu: docs/performance.md names the
# wheels to carry) and, on a GPU, ONNX Runtime's CUDA provider; one line naming what is missing
# stops the run. Then which providers really run: a one-node session on each, after the CUDA
# libraries are loaded as the engine's backend loads them (a provider whose libraries do not load
# falls back to the CPU, and is listed as such).
status=0
timeout 120 python3 - <<'PY' 2>&1 | tee "$work/logs/providers.txt" || status=$?
import importlib, os, sys
wheels = {"nupunkt": "nupunkt (pip download nupunkt)", "onnxruntime": "onnxruntime-gpu 1.31.1 (cp312, CUDA 13)",
          "onnx": "onnx", "tokenizers": "tokenizers", "transformers": "transformers", "torch": "torch"}
missing = []
for module in ("nupunkt", "onnxruntime", "onnx", "tokenizers", "transformers", "torch", "engine.pruner",
               "export.onnx"):
    try:
        importlib.import_module(module)
    except ImportError as exc:
        top = (exc.name or module).split(".")[0]
        missing.append(wheels.get(top, "the engine (run gpu.sh from the repository root)" if top in ("engine", "export")
                                  else f"{top} (imported by {module})"))
gpu = os.environ.get("GPU_DRY_RUN") != "1"
if gpu and "onnxruntime" in sys.modules and "CUDAExecutionProvider" not in sys.modules["onnxruntime"].get_available_providers():
    ort = sys.modules["onnxruntime"]
    missing.append(f"onnxruntime-gpu 1.31.1 (cp312, CUDA 13): this onnxruntime {ort.__version__} has no CUDA provider")
if missing:
    print("gpu.sh: missing: " + "; ".join(dict.fromkeys(missing)) + ": put these wheels in WHEELS "
          "(docs/performance.md, 'The GPU run')")
    sys.exit(3)
import numpy as np, onnxruntime as ort, torch, transformers
from onnx import TensorProto, helper
from engine.backends.onnxruntime import preload_cuda_libraries
print("onnxruntime", ort.__version__, ort.__file__)
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__)
offered = ort.get_available_providers()
print("offered", offered)
if "CUDAExecutionProvider" in offered:
    print("CUDA libraries not loaded:", preload_cuda_libraries(ort) or "none")
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
model = helper.make_model(helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "probe", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
cuda_runs = False
for p in offered:
    try:
        s = ort.InferenceSession(model.SerializeToString(), providers=[p, "CPUExecutionProvider"])
        s.run(None, {"x": np.ones(2, np.float32)})
        ran = s.get_providers()[0]
        cuda_runs |= p == ran == "CUDAExecutionProvider"
        print(f"provider {p}: {'runs' if ran == p else 'does not load (the session fell back to ' + ran + ')'}")
    except Exception as exc:
        print(f"provider {p}: fails ({type(exc).__name__}: {str(exc)[:200]})")
if gpu and not cuda_runs:  # every GPU row would be the CPU's: nothing worth the budget
    print("gpu.sh: the CUDA provider does not load (the lines above say why): the CUDA 13 runtime, cuBLAS and "
          "cuDNN 9 wheels onnxruntime-gpu needs, or a driver for CUDA 13")
    sys.exit(3)
PY
if [ "$status" != 0 ]; then
  line="$(grep '^gpu.sh:' "$work/logs/providers.txt" | head -1)"
  printf '# GPU benchmark: not run\n\n%s\n' "${line:-the probe failed (status $status): see providers.txt}" > "$out/gpu.md"
  echo "gpu.sh: stopped after $(( $(date +%s) - t0 )) s: ${line:-the probe failed}"
  tar -czf "$out/results.tar.gz" -C "$work" logs
  exit 3
fi
if [ "${GPU_DRY_RUN:-0}" = 1 ]; then
  # the CPU rehearsal: tiny shapes, the engine's GPU graph in fixed-shape sessions as on the GPU (without
  # CUDA graphs), and torch.compile traced without code generation (aot_eager)
  args=(--tiny --device cpu --lengths 32 64 --batches 1 4 --cut-shapes 1x64 4x64 --compile-shapes 4x64
        --iters 3 --compile-backend aot_eager --fixed-shapes --bench-reserve-s 45 --bench-min-s 20)
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$work/logs/gpu-info.csv" || true
  args=(--device cuda)
fi
[ "${GPU_FP32:-0}" = 1 ] && args+=(--fp32)
[ "${GPU_TENSORRT:-0}" = 1 ] && args+=(--tensorrt)
rag="${RAG_DATA-tests/data/squad-dev-rag.jsonl}"
if [ -n "$rag" ]; then args+=(--rag-data "$rag" --rag-queries "${RAG_QUERIES:-10}"); fi
if [ -n "${BENCH_PATHS:-}" ]; then args+=(--bench-paths "$BENCH_PATHS"); fi
# what is left, less 15 s for the archive and the checks below; gpu.py plans for 10 s less than
# its hard stop (timeout's SIGTERM, then SIGKILL 10 s later), so it normally ends by itself
run_s=$(( $(left) - 15 ))
[ "$run_s" -ge 30 ] || run_s=30      # timeout 0 would mean no limit at all
echo "budget: ${budget} s in all, install included; $(left) s left; benchmarks.gpu gets ${run_s} s (prune bench in it)"
status=0
timeout -s TERM -k 10 "$run_s" python3 -m benchmarks.gpu "${args[@]}" --budget-s "$(( run_s - 10 ))" \
  --out "$out/gpu.json" --markdown "$out/gpu.md" --plot "$out/gpu.png" --keep "$work/models" --logs "$work/logs" \
  2>&1 | tee "$work/logs/gpu.log" || status=$?
[ "$status" = 0 ] || echo "benchmarks.gpu ended with status $status (124: stopped at its budget)"
[ -f "$out/gpu.md" ] && cat "$out/gpu.md"
echo "gpu.sh: $(( $(date +%s) - t0 )) s in all (budget ${budget} s, install included)"
# What comes back: the results above and one archive of the logs (at most 8 files, each < 16 MiB)
tar -czf "$out/results.tar.gz" -C "$work" logs
count=$(find "$out" -type f | wc -l)
big=$(find "$out" -type f -size +16M)
echo "OUT: $count files$( [ -z "$big" ] || echo "; over 16 MiB: $big")"
if [ "$count" -gt 8 ] || [ -n "$big" ]; then
  echo "gpu.sh: $out must hold at most 8 files, each under 16 MiB" >&2
  exit 1
fi
