#!/usr/bin/env bash
# Runs several zoo jobs side by side, one per GPU, on the GPU machine (after `source
# .device/env.sh`): job i gets GPU i alone (CUDA_VISIBLE_DEVICES), its own work folder, build cache
# and user table (/tmp/zoo-gi), and its share of the cores for nvcc (`--fact-args "--jobs N"`,
# unless the job gives its own --fact-args). Each job's arguments are one quoted string for
# benches/zoo/run.sh, read as a shell reads words (quote a value that holds spaces:
# "--models llama --fact-args '--jobs 16 --fuse-siblings'"). Figures compare only within one job (one process, one GPU).
#   bash benches/zoo/gpus.sh "--models gpt2 --policies bf16 ..." "--models bert --policies bf16 ..."
#   bash benches/zoo/gpus.sh --staged COMPOSE_S MEASURE_S "ARGS0" "ARGS1" ...
# --staged runs every job's trace and compose first (`run.py --stage compose --budget-s COMPOSE_S`),
# waits for all of them, then every job's measuring (`--stage measure --budget-s MEASURE_S`): no
# timed run then shares the host's cores with another job's nvcc or inductor autotuning (on four
# H100s side by side, mobilenet's torch.compile timed 2.9 ms in one call and 4.5 in another).
# What comes back: $OUT/zoo-gi.tgz per job (records, logs, compose reports, user table), since only
# a few files come back from a call.
set -uo pipefail
phases=all
if [ "${1:-}" = --staged ]; then
  phases="compose:$2 measure:$3"
  shift 3
fi
n=$#
cores=$(nproc)
jobs=$(( cores / (n > 0 ? n : 1) ))
real_out=${OUT:-}

run_phase() { # STAGE BUDGET ARGS...
  local stage=$1 budget=$2 i=0 args
  shift 2
  for args in "$@"; do
    (
      export CUDA_VISIBLE_DEVICES=$i ZOO_WORK=/tmp/zoo-g$i OUT=/tmp/out-g$i
      mkdir -p "$OUT"
      extra=()
      if [ "$stage" != all ]; then extra=(--stage "$stage" --budget-s "$budget"); fi
      # A job's own --fact-args (e.g. "--jobs 16 --fuse-siblings") stands; others get the core share.
      if [[ $args != *--fact-args* ]]; then extra+=(--fact-args "--jobs $jobs"); fi
      # The job's string as a shell would read it, so a quoted value in it keeps its spaces.
      eval "set -- $args"
      bash benches/zoo/run.sh "$@" "${extra[@]}" --cache-dir /tmp/fact-cache-g$i >> /tmp/zoo-g$i.log 2>&1
    ) &
    i=$((i + 1))
  done
  wait
}

for phase in $phases; do
  if [ "$phase" = all ]; then run_phase all 0 "$@"; else run_phase "${phase%%:*}" "${phase#*:}" "$@"; fi
done
for j in $(seq 0 $((n - 1))); do
  if [ -n "$real_out" ]; then
    cp /tmp/zoo-g$j.log "/tmp/out-g$j/zoo/" 2>/dev/null
    tar czf "$real_out/zoo-g$j.tgz" -C "/tmp/out-g$j" zoo
  fi
  echo "== job $j: $(tail -3 /tmp/zoo-g$j.log | tr '\n' ' ')"
done
