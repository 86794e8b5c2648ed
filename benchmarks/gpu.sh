#!/usr/bin/env bash
# Every GPU path of the engine side by side, in one run, offline (docs/performance.md):
# PyTorch fp32/fp16/bf16 eager and SDPA, then the engine's ONNX Runtime backend on the CUDA
# provider (IO binding) for the fp32 and fp16 exports of a Provence-size model (DeBERTa-v3-
# large configuration, random weights, through `prune export`), the TensorRT provider where
# the onnxruntime-gpu build has it; sequences/s, tokens/s, p50/p99 at batch 1, share of the
# fp16 peak, and each graph's largest difference from the fp32 PyTorch reference.
#
# Usage (from the repository root):  WHEELS=/path/to/wheels benchmarks/gpu.sh [OUT_DIR]
#   WHEELS   a folder of wheels installed without an index (--no-index --no-deps) into
#            OUT_DIR/site, ahead of site-packages: onnxruntime-gpu (the CUDA 13 build, 1.31.1)
#            and what the machine lacks (onnx, ml_dtypes, nupunkt). Files split for small
#            uploads (split -b 60m X.whl X.whl.part-) are joined first.
#   GPU_DRY_RUN=1  the same script on CPU with a tiny configuration (tests/test_gpu_script.py)
#   BUDGET_S       seconds after which no new case starts (default 420: the run ends within 8 minutes)
#   RAG_DATA       squad-dev-rag.jsonl: then also `prune bench --device cuda` on that workload with the
#                  same model's fp32/fp16 exports and checkpoint (RAG_QUERIES queries, default 20)
set -euo pipefail
out="${1:-${OUT:-benchmarks/results/gpu}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
pythonpath="$(pwd)"
if [ -n "${WHEELS:-}" ]; then
  for first in "$WHEELS"/*.whl.part-aa; do
    [ -e "$first" ] || continue
    whole="${first%.part-aa}"
    cat "$whole".part-* > "$whole"
    echo "joined $(ls "$whole".part-* | wc -l) pieces into $(basename "$whole")"
  done
  python3 -m pip install --quiet --no-index --no-deps --target "$out/site" "$WHEELS"/*.whl
  pythonpath="$out/site:$pythonpath"      # ahead of the CPU onnxruntime in site-packages
fi
export PYTHONPATH="$pythonpath${PYTHONPATH:+:$PYTHONPATH}"
python3 - <<'PY' | tee "$out/providers.txt"
import onnxruntime as ort, torch
print("onnxruntime", ort.__version__, ort.__file__)
print("providers", ort.get_available_providers())
print("torch", torch.__version__, "cuda", torch.cuda.is_available())
PY
if [ "${GPU_DRY_RUN:-0}" = 1 ]; then
  args=(--tiny --device cpu --lengths 32 64 --batches 1 4 --iters 2 --dtypes float32 --attn eager)
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu-info.csv"
  args=(--device cuda)
fi
python3 -m benchmarks.gpu "${args[@]}" --budget-s "${BUDGET_S:-420}" --out "$out/gpu.json" \
  --markdown "$out/gpu.md" --plot "$out/gpu.png" --keep "$out/models" 2>&1 | tee "$out/gpu.log"
cat "$out/gpu.md"
# The RAG workload through the whole engine (prune bench: splitting, tokenizing, batching,
# decisions) on the same model, when RAG_DATA names squad-dev-rag.jsonl.
if [ -n "${RAG_DATA:-}" ]; then
  if [ "${GPU_DRY_RUN:-0}" = 1 ]; then device=cpu; else device=cuda; fi
  python3 -m engine bench --device "$device" --data "$RAG_DATA" --queries "${RAG_QUERIES:-20}" --repeats 3 \
    --model "$out/models/fp32" --fp16 "$out/models/fp16" --checkpoint "$out/models/checkpoint" \
    --out "$out" 2>&1 | tee "$out/bench.log"
fi
