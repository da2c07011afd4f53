#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: the zoo
# (benches/zoo/run.py) into $ZOO_WORK (default /tmp/zoo, kept while the machine stays warm, so
# calls add up: records merge, the user table and build cache grow), then copies what is worth
# bringing back into $OUT/zoo: records/, zoo.json, zoo.svg, logs/, compose/NAME_POLICY.json, the
# user table and zoo_log.txt (the traced models and composed folders stay behind: hundreds of MB).
# Arguments go to run.py: [--models a,b] [--policies tf32,bf16] [--modes ...] [--budget-s S] [--resume] ...
# ZOO_SEED: a folder from an earlier call (records/ and user_table.json, or user_table.json.gz as
# benches/results/zoo keeps it, e.g. benches/results/zoo/2026-11-27-h100x4-1180d1b) to continue
# from on a fresh machine; what $ZOO_WORK already holds wins.
set -uo pipefail
work=${ZOO_WORK:-/tmp/zoo}
mkdir -p "$work/records"
if [ -n "${ZOO_SEED:-}" ]; then
  cp -n "$ZOO_SEED"/records/*.json "$work/records/" 2>/dev/null
  if [ ! -f "$work/user_table.json" ]; then
    if [ -f "$ZOO_SEED/user_table.json" ]; then cp "$ZOO_SEED/user_table.json" "$work/"
    elif [ -f "$ZOO_SEED/user_table.json.gz" ]; then gzip -dc "$ZOO_SEED/user_table.json.gz" > "$work/user_table.json"; fi
  fi
fi
log=$work/zoo_log.txt
{
  echo "== $(date -u) benches/zoo/run.sh $*"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
} >> "$log" 2>&1
python3 benches/zoo/run.py "$work" "$@" 2>&1 | tee -a "$log"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/zoo/compose"
  cp -r "$work/records" "$work/logs" "$OUT/zoo/"
  for f in zoo.json zoo.svg user_table.json zoo_log.txt; do
    if [ -f "$work/$f" ]; then cp "$work/$f" "$OUT/zoo/"; fi
  done
  for d in "$work"/fact/*/; do
    if [ -f "$d/compose.json" ]; then cp "$d/compose.json" "$OUT/zoo/compose/$(basename "$d").json"; fi
  done
fi
true
