#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: the auto-tuning
# issue's sweeps. Each `fact realize` derives the space from the knowledge base, compiles it as one
# library (one translation unit per core), verifies and times every variant against torch under
# the same precision policy in the same run, tunes the launch knobs of the fastest, and records
# winners, failures and learned rules in a fresh user table. Usage: autotune.sh CASE... where CASE
# is rule:dtype:shape:precision, e.g. gemm_rrr:f32:4096x4096x4096:tf32; REALIZE_ARGS adds flags to
# every realize (e.g. "--hopeless 3" to measure the families the estimate cuts) and TAG to the
# result file names.
set -uo pipefail
export FACT_CACHE_DIR=${FACT_CACHE_DIR:-/tmp/fact-cache} FACT_TABLE=$OUT/user_table.json FACT_SHIPPED_TABLE=/nonexistent.json
bin=$PWD/.device/fact
log=$OUT/autotune_log.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; } >> "$log" 2>&1
for c in "$@"; do
  IFS=: read -r rule dtype shape precision <<< "$c"
  echo "== $rule $dtype $shape $precision" | tee -a "$log"
  t0=$(date +%s%N)
  # shellcheck disable=SC2086
  "$bin" realize --rule "$rule" --dtype "$dtype" --shape "$shape" --precision "$precision" --out /tmp/realize ${REALIZE_ARGS:-} 2>&1 | tee -a "$log"
  echo "wall $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$log"
  d=$(ls -d /tmp/realize/sweeps/${rule}_${dtype}_${shape} 2>/dev/null | head -1)
  name=${rule}_${dtype}_${shape}_${precision}${TAG:-}
  [ -n "$d" ] && cp "$d/sweep.json" "$OUT/$name.sweep.json" && cp "$d/scatter.svg" "$OUT/$name.scatter.svg" 2>/dev/null
  [ -f "${d}_knobs/sweep.json" ] && cp "${d}_knobs/sweep.json" "$OUT/$name.knobs.json"
  rm -rf /tmp/realize/sweeps
done
"$bin" table list >> "$log" 2>&1
"$bin" table rules >> "$log" 2>&1
true
