#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: the GEMM +
# elementwise-epilogue suite (benches/device/epilogue_suite.py; models in epilogue_models.py),
# composed from the shipped pattern table plus a user table kept in $OUT (a rerun into the same
# $OUT reuses its tunings), results in $OUT/epilogue (suite.json, logs/, models/, fact/).
# Arguments go to the suite: [--policies tf32,f32,bf16] [--only NAME,...] [--budget-s SECONDS].
set -uo pipefail
export FACT_CACHE_DIR=/tmp/fact-cache FACT_TABLE=$OUT/user_table.json FACT_SHIPPED_TABLE=$PWD/pattern-table/table.json
# SEED_TABLE: a user table from an earlier run to start from (its tunings are reused; gzipped or
# not, as benches/results keeps them).
if [ -n "${SEED_TABLE:-}" ] && [ ! -f "$FACT_TABLE" ]; then gzip -dcf "$SEED_TABLE" > "$FACT_TABLE"; fi
log=$OUT/epilogue_log.txt
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'; "$PWD/.device/fact" --version
} > "$log" 2>&1
python3 benches/device/epilogue_suite.py "$OUT/epilogue" "$@" 2>&1 | tee -a "$log"
true
