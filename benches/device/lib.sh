# shellcheck shell=bash
# What benches/device's realize harnesses (rmsnorm.sh, rotary.sh, glu.sh, conv.sh) share, sourced
# by each after `set -uo pipefail`: one function per job. Each script keeps its steps, its own
# checks and its own summary of a realize's JSON.
#
#   bench_init NAME DEFAULT_BUDGET "DEFAULT STEPS" [TORCH_PRINT] -- "$@"
#       the script's arguments ([BUDGET_S] [STEP...]) read into $budget and $steps; $start, $bin
#       (.device/fact), $dir ($OUT/NAME), $summary ($dir/summary.txt, emptied); FACT_CACHE_DIR,
#       FACT_TABLE ($dir/user_table.json) and FACT_SHIPPED_TABLE (none) exported; $dir/device.txt
#       (nvidia-smi's card, torch's version or what python's TORCH_PRINT prints after `import
#       torch`, fact's version).
#   left                      the budget's seconds left
#   need_time MIN LABEL       false, with "== LABEL skipped: Ns left" in the summary, when fewer
#                             than MIN seconds are left
#   realize_run KEY LABEL RULE DTYPE SHAPE MARGIN [ARGS...]
#                             `fact realize ... ARGS --jobs 16 --json --out $dir/KEY` within the
#                             seconds left less MARGIN: $dir/KEY.json, $dir/KEY.log
#   realize_winner KEY        the winner's kernel name in $dir/KEY.json ('' if none)
#   bench_done                the summary, last in the output

bench_init() {
  local name=$1 default_budget=$2 default_steps=$3 torch_print='print("torch", torch.__version__)'
  shift 3
  if [[ ${1:-} != -- ]]; then torch_print=$1; shift; fi
  shift # --
  budget=${1:-$default_budget}
  shift || true
  steps=${*:-$default_steps}
  start=$SECONDS
  bin=$PWD/.device/fact
  dir=$OUT/$name
  mkdir -p "$dir"
  export FACT_CACHE_DIR=/tmp/fact-cache FACT_TABLE=$dir/user_table.json FACT_SHIPPED_TABLE=/nonexistent.json
  summary=$dir/summary.txt
  : > "$summary"
  {
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
    python3 -c "import torch; $torch_print"
    "$bin" --version
  } > "$dir/device.txt" 2>&1
}

left() { echo $((budget - (SECONDS - start))); }

need_time() { # MIN LABEL
  local t
  t=$(left)
  if (( t < $1 )); then echo "== $2 skipped: ${t}s left" | tee -a "$summary"; return 1; fi
}

realize_run() { # KEY LABEL RULE DTYPE SHAPE MARGIN [ARGS...]
  local key=$1 label=$2 rule=$3 dtype=$4 shape=$5 margin=$6 t
  shift 6
  t=$(left)
  echo "== $label: $rule $dtype $shape (${t}s left)" | tee -a "$summary"
  timeout $((t - margin)) "$bin" realize --rule "$rule" --dtype "$dtype" --shape "$shape" "$@" --jobs 16 --json \
    --out "$dir/$key" > "$dir/$key.json" 2> "$dir/$key.log"
  echo "   realize rc=$? in $((SECONDS - start))s" | tee -a "$summary"
}

realize_winner() { # KEY
  python3 -c "import json,sys; e=json.load(open(sys.argv[1])).get('entry'); print(e['winner'] if e else '')" \
    "$dir/$1.json" 2>/dev/null
}

bench_done() {
  echo "== summary ($((SECONDS - start))s)"
  cat "$summary"
  true
}
