#!/usr/bin/env bash
# Every GPU path of the engine side by side, in one run, offline (docs/performance.md):
# PyTorch fp32/fp16/bf16 eager and SDPA, then the engine's ONNX Runtime backend on the CUDA
# provider (IO binding) for the fp32 and fp16 exports of a Provence-size model (DeBERTa-v3-
# large configuration, random weights, through `prune export`), the TensorRT provider where
# the onnxruntime-gpu build has it; sequences/s, tokens/s, p50/p99 at batch 1, share of the
# fp16 peak, and each graph's largest difference from the fp32 PyTorch reference.
#
# Usage (from the repository root):  WHEELS=/path/to/wheels benchmarks/gpu.sh [OUT_DIR]
#   WHEELS   offline: a folder of wheels, searched recursively, installed without an index
#            (--no-index --no-deps --no-compile) into WORK/site, ahead of site-packages: what the
#            machine lacks (onnxruntime-gpu, nupunkt, onnx, ...). Wheels split for a size-limited
#            transfer (split -b 50m X.whl X.whl.part-) are joined first, wherever the pieces are.
#            Without WHEELS the script runs with what is installed (pip install -e ".[gpu,export]").
#   GPU_WORK  where the packages, the models and the logs' working copies go (default: a new
#            folder under /tmp): never OUT_DIR, which gets only the results, at most 8 files
#            (gpu.json, gpu.md, gpu.png, bench.json, bench.md, results.tar.gz with every log and
#            the rest), each checked to be under 16 MiB.
#   GPU_DRY_RUN=1  the same script on CPU with a tiny configuration (tests/packaging/test_gpu_script.py)
#   BUDGET_S       seconds for everything after the install (default 330): benchmarks.gpu runs under
#                  `timeout` with GPU_SHARE percent of it (default 75 with RAG_DATA, else 100), its own
#                  cases stopping before; prune bench under `timeout` with what is left (skipped under 45 s).
#                  What a stopped step measured is kept (gpu.json is rewritten after every case).
#   RAG_DATA       squad-dev-rag.jsonl: then also `prune bench --device cuda` on that workload with the
#                  same model's fp32/fp16 exports and checkpoint (RAG_QUERIES queries, default 10, 2 repeats)
set -euo pipefail
out="${1:-${OUT:-benchmarks/results/gpu}}"
mkdir -p "$out"
work="${GPU_WORK:-$(mktemp -d /tmp/prune-gpu-XXXXXX)}"
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
budget="${BUDGET_S:-330}"
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
# Which providers really run: a one-node session on each, after the CUDA libraries are
# loaded as the engine's backend loads them (a provider whose libraries do not load falls
# back to the CPU, and is listed as such).
python3 - <<'PY' 2>&1 | tee "$work/logs/providers.txt"
import numpy as np, onnxruntime as ort, torch
from onnx import TensorProto, helper
from engine.backends.onnxruntime import preload_cuda_libraries
print("onnxruntime", ort.__version__, ort.__file__)
import transformers
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
for p in offered:
    try:
        s = ort.InferenceSession(model.SerializeToString(), providers=[p, "CPUExecutionProvider"])
        s.run(None, {"x": np.ones(2, np.float32)})
        ran = s.get_providers()[0]
        print(f"provider {p}: {'runs' if ran == p else 'does not load (the session fell back to ' + ran + ')'}")
    except Exception as exc:
        print(f"provider {p}: fails ({type(exc).__name__}: {str(exc)[:200]})")
PY
if [ "${GPU_DRY_RUN:-0}" = 1 ]; then
  args=(--tiny --device cpu --lengths 32 64 --batches 1 4 --iters 2 --dtypes float32 --attn eager)
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$work/logs/gpu-info.csv"
  args=(--device cuda)
fi
if [ -n "${RAG_DATA:-}" ]; then share="${GPU_SHARE:-75}"; else share="${GPU_SHARE:-100}"; fi
gpu_s=$(( $(left) * share / 100 ))
[ "$gpu_s" -ge 30 ] || gpu_s=30      # timeout 0 would mean no limit at all
echo "budget: ${budget} s in all, $(left) s left; benchmarks.gpu gets ${gpu_s} s"
# its cases stop starting 10% (at least 20 s) before the hard stop, so the last one ends in time
margin=$(( gpu_s / 10 > 20 ? gpu_s / 10 : 20 ))
status=0
timeout -s TERM -k 15 "$gpu_s" python3 -m benchmarks.gpu "${args[@]}" --budget-s "$(( gpu_s - margin ))" \
  --out "$out/gpu.json" --markdown "$out/gpu.md" --plot "$out/gpu.png" --keep "$work/models" \
  2>&1 | tee "$work/logs/gpu.log" || status=$?
[ "$status" = 0 ] || echo "benchmarks.gpu ended with status $status (124: stopped at its share of the budget)"
[ -f "$out/gpu.md" ] && cat "$out/gpu.md"
# The RAG workload through the whole engine (prune bench: splitting, tokenizing, batching,
# decisions) on the same model, when RAG_DATA names squad-dev-rag.jsonl.
if [ -n "${RAG_DATA:-}" ] && [ "$(left)" -ge 45 ] && [ -f "$work/models/fp32/manifest.json" ]; then
  if [ "${GPU_DRY_RUN:-0}" = 1 ]; then device=cpu; else device=cuda; fi
  fp16=(); [ -f "$work/models/fp16/manifest.json" ] && fp16=(--fp16 "$work/models/fp16")
  echo "prune bench gets $(left) s"
  timeout -s TERM -k 15 "$(left)" python3 -m engine bench --device "$device" --data "$RAG_DATA" \
    --queries "${RAG_QUERIES:-10}" --repeats 2 --model "$work/models/fp32" "${fp16[@]}" \
    --checkpoint "$work/models/checkpoint" --out "$work/bench" 2>&1 | tee "$work/logs/bench.log" || status=$?
  latest="$(ls -d "$work"/bench/bench-* 2>/dev/null | sort | tail -1 || true)"   # none when stopped early
  if [ -n "$latest" ] && [ -f "$latest/bench.json" ]; then
    cp "$latest/bench.json" "$latest/bench.md" "$out/"
    cp -r "$latest" "$work/logs/"
  else
    echo "prune bench wrote no report (stopped at the budget?)"
  fi
elif [ -n "${RAG_DATA:-}" ]; then
  echo "prune bench not run: $(left) s left of the budget, or no fp32 export"
fi
echo "gpu.sh: $(( $(date +%s) - t0 )) s after the install (budget ${budget} s)"
# What comes back: the results above and one archive of the logs (at most 8 files, each < 16 MiB)
tar -czf "$out/results.tar.gz" -C "$work" logs
count=$(find "$out" -type f | wc -l)
big=$(find "$out" -type f -size +16M)
echo "OUT: $count files$( [ -z "$big" ] || echo "; over 16 MiB: $big")"
if [ "$count" -gt 8 ] || [ -n "$big" ]; then
  echo "gpu.sh: $out must hold at most 8 files, each under 16 MiB" >&2
  exit 1
fi
