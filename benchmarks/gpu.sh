#!/usr/bin/env bash
# GPU benchmark of a Provence-size model (DeBERTa-v3-large, random weights), a few minutes
# on an H200 machine that has CUDA PyTorch, transformers and tokenizers (nothing else).
# Usage: benchmarks/gpu.sh [OUT_DIR]     (run from the repository root)
set -euo pipefail
out="${1:-${OUT:-benchmarks/results}}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu-info.csv"
PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
  python3 -m benchmarks.gpu --device cuda --budget-s 300 --out "$out/gpu-deberta-v3-large.json" 2>&1 | tee "$out/gpu.log"
