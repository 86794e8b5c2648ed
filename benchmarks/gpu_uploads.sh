#!/usr/bin/env bash
# The uploads for the GPU machine's plan (docs/performance.md, "The GPU run, call by call"):
# the wheels gpu.sh needs there, split so that each upload, with the repository's working
# tree, stays under the 64 MiB a call may carry; one folder per upload: DEST/p1 ... DEST/pN.
#
# Usage (from the repository root, where a package index is reachable):
#   RAG_DATA=../shared/data/squad-dev-rag.jsonl benchmarks/gpu_uploads.sh [DEST]   (default .gpu)
#   FROM=folder-of-wheels  take the wheels from there instead of downloading them
#   PIECE_BYTES            the size of a piece (default 55 MiB: a piece plus the ~6 MB tree < 64 MiB)
#   RAG_QUERIES            the first N questions of RAG_DATA go to p1 as rag.jsonl (default 10)
# What the machine lacks (its python3 is 3.12 with torch 2.11 cu130, transformers 5.17, onnx
# 1.23.1, numpy 2.5, the CPU onnxruntime 1.30 and CUDA 13's libraries as pip packages): the
# CUDA 13 build of onnxruntime-gpu 1.31.1 (256 MB) and nupunkt.
set -euo pipefail
dest="${1:-.gpu}"
piece="${PIECE_BYTES:-$((55 * 1024 * 1024))}"
rm -rf "$dest"
mkdir -p "$dest/wheels"
if [ -n "${FROM:-}" ]; then
  cp "$FROM"/*.whl "$dest/wheels/"
else
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$dest/wheels" onnxruntime-gpu==1.31.1 nupunkt==0.8.0
fi
n=0
small=()
for f in "$dest"/wheels/*.whl; do
  if [ "$(stat -c %s "$f")" -gt "$piece" ]; then
    split -b "$piece" "$f" "$dest/wheels/$(basename "$f").part-"
    for p in "$dest/wheels/$(basename "$f")".part-*; do
      n=$((n + 1)); mkdir -p "$dest/p$n"; mv "$p" "$dest/p$n/"
    done
    rm "$f"
  else
    small+=("$f")
  fi
done
[ "$n" -gt 0 ] || { n=1; mkdir -p "$dest/p1"; }
# the small wheels and the RAG questions ride with the last (smallest) piece
last="$dest/p$n"
for f in "${small[@]}"; do mv "$f" "$last/"; done
if [ -n "${RAG_DATA:-}" ]; then
  head -n "${RAG_QUERIES:-10}" "$RAG_DATA" > "$last/rag.jsonl"
fi
rmdir "$dest/wheels"
for d in "$dest"/p*; do
  echo "$d: $(du -sb "$d" | cut -f1) bytes: $(ls "$d" | tr '\n' ' ')"
done
echo "$n uploads; the last one holds rag.jsonl and the small wheels"
