#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: GEMM shape
# coverage (issue 13). Ragged fp32 GEMMs (contiguous dims not multiples of 4; >= 50 GFLOP each)
# under tf32 and f32-accurate, then the edges (small K, an outer product, a long K), each composed
# with fact and timed against the policy's torch baseline in one process
# (benches/device/coverage.py). Results in $OUT/coverage (suite.json, logs/, fact/), the log in
# $OUT/coverage_log.txt; a user table in $OUT keeps the tunings.
# Usage: bash benches/device/coverage.sh [BUDGET_S] [coverage.py arguments ...]
#   BUDGET_S (default 540): start no (model, policy) pair that could end past it. Resumable: a
#   second call with the same $OUT (or its suite.json and user_table.json copied back into a fresh
#   $OUT) skips the pairs suite.json holds.
set -uo pipefail
export FACT_CACHE_DIR=${FACT_CACHE_DIR:-/tmp/fact-cache} FACT_TABLE=$OUT/user_table.json FACT_SHIPPED_TABLE=/nonexistent.json
# SEED_DIR: the coverage folder and user table of an earlier call (a fresh machine resumes from them).
if [ -n "${SEED_DIR:-}" ]; then
  mkdir -p "$OUT/coverage"
  [ -f "$SEED_DIR/coverage/suite.json" ] && [ ! -f "$OUT/coverage/suite.json" ] && cp "$SEED_DIR/coverage/suite.json" "$OUT/coverage/"
  [ -f "$SEED_DIR/user_table.json" ] && [ ! -f "$FACT_TABLE" ] && cp "$SEED_DIR/user_table.json" "$FACT_TABLE"
  [ -f "$SEED_DIR/user_table.json.gz" ] && [ ! -f "$FACT_TABLE" ] && gzip -dc "$SEED_DIR/user_table.json.gz" > "$FACT_TABLE"
fi
budget=${1:-540}
shift || true
log=$OUT/coverage_log.txt
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'; "$PWD/.device/fact" --version; nvcc --version | tail -1
} >> "$log" 2>&1
python3 benches/device/coverage.py "$OUT/coverage" --budget-s "$budget" "$@" 2>&1 | tee -a "$log"
true
