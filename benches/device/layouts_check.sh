#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: operand layouts
# without copies. Traces small models whose GEMM operands are transposed views or broadcast
# batches, composes each at its real shape under tf32 (a small sweep, --keep-slower so the kernel
# is substituted whatever torch's time), then checks on the GPU (benches/device/layouts_check.py)
# that the composed module matches the original and fp64, that every fact call ran its kernel
# without copying an operand (fact_op_stats: ran > 0, copied = 0, fell_back = 0) and that the
# profiler sees no copy kernel in the composed forward; finally that a call whose operand does not
# lie in the kernel's layout is copied, counted and still right. Results in $OUT (layouts_log.txt,
# layouts_check.json, a compose report per model).
# Usage: bash benches/device/layouts_check.sh [CANDIDATES] [MODEL ...]
#   MODEL of at_b, a_bt, at_bt, heads_bmm, t_bmm, bcast (default: all; at CANDIDATES=4 each
#   compose takes a few minutes, so run them in two or three calls sharing $OUT).
set -uo pipefail
export FACT_CACHE_DIR=${FACT_CACHE_DIR:-/tmp/fact-cache} FACT_TABLE=$OUT/user_table.json FACT_SHIPPED_TABLE=/nonexistent.json
bin=$PWD/.device/fact
candidates=${1:-4}
shift || true
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(at_b a_bt at_bt heads_bmm t_bmm bcast)
log=$OUT/layouts_log.txt
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'; "$bin" --version
} >> "$log" 2>&1
dir=/tmp/layouts
mkdir -p "$dir"
for name in "${models[@]}"; do
  inputs=$(python3 benches/device/layouts_check.py trace "$name" "$dir/$name.pt") || { echo "no model $name" | tee -a "$log"; continue; }
  echo "== $name: compose $inputs --candidates $candidates" | tee -a "$log"
  t0=$(date +%s)
  "$bin" compose "$dir/$name.pt" $inputs --precision tf32 --candidates "$candidates" --jobs 16 --keep-slower \
    --out "$dir/$name" --save-report "$OUT/compose_$name.json" 2>&1 | tee -a "$log"
  echo "compose exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - t0 )) s" | tee -a "$log"
  python3 benches/device/layouts_check.py check "$name" "$dir/$name" "$dir/$name.pt" "$OUT/layouts_check.json" 2>&1 | tee -a "$log"
done
python3 - "$OUT/layouts_check.json" <<'PY' 2>&1 | tee -a "$log"
import json, sys
for name, r in json.load(open(sys.argv[1])).items():
    print(f"{name:10} {r['rule_expected']:8} {'OK' if r['ok'] else 'FAILED'}  fact rel err {r.get('rel_err_fact', float('nan')):.2e}"
          f"  calls {r.get('stats_forward')}  {'; '.join(r['problems'])}")
PY
true
