#!/usr/bin/env bash
# Runs several zoo jobs side by side, one per GPU, on the GPU machine (after `source
# .device/env.sh`): job i gets GPU i alone (CUDA_VISIBLE_DEVICES), its own work folder, build cache
# and user table (/tmp/zoo-gi), and its share of the cores for nvcc. Each job's arguments are one
# quoted string for benches/zoo/run.sh. Figures compare only within one job (one process, one GPU).
#   bash benches/zoo/gpus.sh "--models gpt2 --policies bf16 ..." "--models bert --policies bf16 ..."
# What comes back: $OUT/zoo-gi.tgz per job (records, logs, compose reports, user table), since only
# a few files come back from a call.
set -uo pipefail
n=$#
cores=$(nproc)
jobs=$(( cores / (n > 0 ? n : 1) ))
i=0
for args in "$@"; do
  (
    export CUDA_VISIBLE_DEVICES=$i ZOO_WORK=/tmp/zoo-g$i
    real_out=${OUT:-}
    export OUT=/tmp/out-g$i
    mkdir -p "$OUT"
    # shellcheck disable=SC2086
    bash benches/zoo/run.sh $args --cache-dir /tmp/fact-cache-g$i --fact-args "--jobs $jobs" \
      > /tmp/zoo-g$i.log 2>&1
    if [ -n "$real_out" ]; then
      cp /tmp/zoo-g$i.log "$OUT/zoo/" 2>/dev/null
      tar czf "$real_out/zoo-g$i.tgz" -C "$OUT" zoo
    fi
  ) &
  i=$((i + 1))
done
wait
for j in $(seq 0 $((n - 1))); do echo "== job $j: $(tail -3 /tmp/zoo-g$j.log | tr '\n' ' ')"; done
