#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`. Composes the
# model holding the auto-tuning issue's three GEMM shapes under the f32-accurate policy from the
# shipped pattern table (hits where it has the shape; a sweep where it has not), then benches the
# composed module against the original, both in one process with torch's fp32 "highest".
set -uo pipefail
export FACT_CACHE_DIR=${FACT_CACHE_DIR:-/tmp/fact-cache} FACT_TABLE=$OUT/user_table.json FACT_SHIPPED_TABLE=$PWD/pattern-table/table.json
rm -f "$FACT_TABLE"
bin=$PWD/.device/fact
log=$OUT/compose_f32_log.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$log" 2>&1
python3 tests/fixtures/make_models.py /tmp/models >> "$log" 2>&1
shapes=(--input 4096x4096 --input 4096x4096 --input 128x512x1024 --input 128x1024x2048 --input 256x524288 --input 524288x256)
echo "== compose three_gemms.pt --precision f32" | tee -a "$log"
t0=$(date +%s%N)
"$bin" compose /tmp/models/three_gemms.pt "${shapes[@]}" --precision f32 --out /tmp/out/three_f32 \
  --save-report "$OUT/three_gemms_f32.json" 2>&1 | tee -a "$log"
echo "wall $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$log"
cp /tmp/out/three_f32/compose.json "$OUT/three_gemms_f32_compose.json" 2>/dev/null
true
