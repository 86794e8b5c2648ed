#!/usr/bin/env bash
# Every GPU path of the engine side by side, in one run, offline (docs/performance.md):
# PyTorch fp32/fp16/bf16 eager and SDPA, then the engine's ONNX Runtime backend on the CUDA
# provider (IO binding) for the fp32 and fp16 exports of a Provence-size model (DeBERTa-v3-
# large configuration, random weights, through `prune export`), the TensorRT provider where
# the onnxruntime-gpu build has it; sequences/s, tokens/s, p50/p99 at batch 1, share of the
# fp16 peak, and each graph's largest difference from the fp32 PyTorch reference.
#
# Usage (from the repository root):  WHEELS=/path/to/wheels benchmarks/gpu.sh [OUT_DIR]
#   WHEELS   a folder of wheels, searched recursively (each upload may bring its piece in a
#            folder of its own), installed without an index (--no-index --no-deps --no-compile)
#            into WORK/site, ahead of site-packages: onnxruntime-gpu (the CUDA 13 build, 1.31.1)
#            and what the machine lacks (onnx, ml_dtypes, nupunkt). Files split for small
#            uploads (split -b 60m X.whl X.whl.part-) are joined first, wherever the pieces are.
#   GPU_WORK  where the packages, the models and the logs' working copies go (default: a new
#            folder under /tmp): never OUT_DIR, which gets only the results, at most 8 files
#            (gpu.json, gpu.md, gpu.png, bench.json, bench.md, results.tar.gz with every log and
#            the rest), each checked to be under 16 MiB.
#   GPU_DRY_RUN=1  the same script on CPU with a tiny configuration (tests/test_gpu_script.py)
#   BUDGET_S       seconds after which no new case starts (default 420: the run ends within 8 minutes)
#   RAG_DATA       squad-dev-rag.jsonl: then also `prune bench --device cuda` on that workload with the
#                  same model's fp32/fp16 exports and checkpoint (RAG_QUERIES queries, default 20)
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
python3 - <<'PY' | tee "$work/logs/providers.txt"
import onnxruntime as ort, torch
print("onnxruntime", ort.__version__, ort.__file__)
print("providers", ort.get_available_providers())
print("torch", torch.__version__, "cuda", torch.cuda.is_available())
PY
if [ "${GPU_DRY_RUN:-0}" = 1 ]; then
  args=(--tiny --device cpu --lengths 32 64 --batches 1 4 --iters 2 --dtypes float32 --attn eager)
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$work/logs/gpu-info.csv"
  args=(--device cuda)
fi
python3 -m benchmarks.gpu "${args[@]}" --budget-s "${BUDGET_S:-420}" --out "$out/gpu.json" \
  --markdown "$out/gpu.md" --plot "$out/gpu.png" --keep "$work/models" 2>&1 | tee "$work/logs/gpu.log"
cat "$out/gpu.md"
# The RAG workload through the whole engine (prune bench: splitting, tokenizing, batching,
# decisions) on the same model, when RAG_DATA names squad-dev-rag.jsonl.
if [ -n "${RAG_DATA:-}" ]; then
  if [ "${GPU_DRY_RUN:-0}" = 1 ]; then device=cpu; else device=cuda; fi
  python3 -m engine bench --device "$device" --data "$RAG_DATA" --queries "${RAG_QUERIES:-20}" --repeats 3 \
    --model "$work/models/fp32" --fp16 "$work/models/fp16" --checkpoint "$work/models/checkpoint" \
    --out "$work/bench" 2>&1 | tee "$work/logs/bench.log"
  latest="$(ls -d "$work"/bench/bench-* | sort | tail -1)"
  cp "$latest/bench.json" "$latest/bench.md" "$out/"
  cp -r "$latest" "$work/logs/"
fi
# What comes back: the results above and one archive of the logs (at most 8 files, each < 16 MiB)
tar -czf "$out/results.tar.gz" -C "$work" logs
count=$(find "$out" -type f | wc -l)
big=$(find "$out" -type f -size +16M)
echo "OUT: $count files$( [ -z "$big" ] || echo "; over 16 MiB: $big")"
if [ "$count" -gt 8 ] || [ -n "$big" ]; then
  echo "gpu.sh: $out must hold at most 8 files, each under 16 MiB" >&2
  exit 1
fi
