#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: tunes the tf32
# GPT block's fused GEMMs again from the built-in space alone (no shipped or user table), so a
# space change reaches the shipped table. Entries go to $OUT/retune_table.json for
# `fact table merge`. Usage: benches/device/retune_block.sh [BUDGET_S per shape (default 150)]
set -uo pipefail
per=${1:-150}
export FACT_SHIPPED_TABLE=/nonexistent.json FACT_TABLE=$OUT/retune_table.json FACT_CACHE_DIR=/tmp/fact-cache
run() { echo "== $*"; timeout "$per" .device/fact realize --rule gemm_rcr_bias --dtype f32 --jobs 16 --out /tmp/retune "$@" 2>&1 | tail -3; }
run --shape 65536x768x768 --epilogue 'leaves=full;v1=add(l0,v0)'
run --shape 65536x768x3072 --epilogue 'leaves=full;v1=add(l0,v0)'
run --shape 65536x3072x768 --epilogue 'leaves=;v1=gelu(v0)'
run --shape 65536x3072x768 --epilogue 'leaves=;v1=mul(v0,0.5);v2=pow(v0,3.0);v3=mul(v2,0.044715);v4=add(v0,v3);v5=mul(v4,0.7978845608028654);v6=tanh(v5);v7=add(v6,1.0);v8=mul(v1,v7)'
