#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: GPT-2's lm_head
# (B 8, T 1024, vocabulary 50257, bf16) composed with its weight padded to 50264, and fact's GEMM
# timed against cuBLAS on the same GEMM padded and against the unpadded linear, in one process
# (benches/device/lm_head_pad.py). Results in $OUT/lm_head_pad (lm_head_pad.json, logs/, fact/),
# the log in $OUT/lm_head_pad_log.txt; a user table in $OUT keeps the tuning.
# Usage: bash benches/device/lm_head_pad.sh [lm_head_pad.py arguments ...], e.g. --fact-args '--jobs 16'
set -uo pipefail
export FACT_CACHE_DIR=${FACT_CACHE_DIR:-/tmp/fact-cache} FACT_TABLE=$OUT/user_table.json
log=$OUT/lm_head_pad_log.txt
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'; "$PWD/.device/fact" --version; nvcc --version | tail -1
} >> "$log" 2>&1
python3 benches/device/lm_head_pad.py "$OUT/lm_head_pad" "$@" 2>&1 | tee -a "$log"
