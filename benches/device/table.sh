#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`. The pattern
# table issue's run: `fact realize` adds the three GEMM shapes of the auto-tuning benchmarks to a
# fresh user table, then a model holding all three composes from table hits (cold: winners not yet
# linked; warm: everything cached), each timed from start to composed module.
set -uo pipefail
export FACT_CACHE_DIR=/tmp/fact-cache FACT_TABLE=$OUT/user_table.json FACT_SHIPPED_TABLE=/nonexistent.json
rm -f "$FACT_TABLE"
bin=$PWD/.device/fact
log=$OUT/table_log.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$log" 2>&1
python3 tests/fixtures/make_models.py /tmp/models >> "$log" 2>&1
step() {
  echo "== $*" | tee -a "$log"; local t0=$(date +%s%N)
  "$@" 2>&1 | tee -a "$log"
  echo "wall $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$log"
}
step "$bin" realize --rule gemm_rrr --dtype f32 --shape 4096x4096x4096
step "$bin" realize --rule bmm_rrr --dtype f32 --shape 128x512x2048x1024
step "$bin" realize --rule gemm_rrr --dtype f32 --shape 256x256x524288
step "$bin" table list
shapes=(--input 4096x4096 --input 4096x4096 --input 128x512x1024 --input 128x1024x2048 --input 256x524288 --input 524288x256)
step "$bin" compose /tmp/models/three_gemms.pt "${shapes[@]}" --out /tmp/out/three_cold --no-bench --json
cp /tmp/out/three_cold/compose.json "$OUT/three_gemms_cold_compose.json"
step "$bin" compose /tmp/models/three_gemms.pt "${shapes[@]}" --out /tmp/out/three_warm --save-report "$OUT/three_gemms_tf32.json"
cp /tmp/out/three_warm/compose.json "$OUT/three_gemms_warm_compose.json"
true
