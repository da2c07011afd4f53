#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: GEMMs read through
# views (issue 31, part 2). Traces GPT-2's MLP on Conv1D (tests/fixtures' Conv1DMlp at C 768) and,
# where transformers is installed, GPT2LMHeadModel(n_layer=2), both at B 8, T 1024 on the GPU;
# composes each under tf32 (a small sweep, --keep-slower so every kernel is substituted); then
# checks on the GPU (benches/device/views_check.py) that the composed graph calls fact::gemm_ep for
# every Conv1D epilogue (2 and 6), that each fact kernel ran on every call (fact_op_stats: no
# fallback), and that the output is within 1e-2 of the original's fp32. Results in $OUT
# (views_log.txt, views_check.json, a compose report per model).
# Usage: bash benches/device/views_check.sh [CANDIDATES] [MODEL ...]   (MODEL: conv1d_mlp, gpt2)
set -uo pipefail
export FACT_CACHE_DIR=${FACT_CACHE_DIR:-/tmp/fact-cache} FACT_TABLE=$OUT/user_table.json FACT_SHIPPED_TABLE=$PWD/pattern-table/table.json
bin=$PWD/.device/fact
candidates=${1:-4}
shift || true
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(conv1d_mlp gpt2)
log=$OUT/views_log.txt
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'; "$bin" --version
} >> "$log" 2>&1
dir=/tmp/views
mkdir -p "$dir"
for name in "${models[@]}"; do
  python3 benches/device/views_check.py trace "$name" "$dir/$name.pt" >> "$log" 2>&1 || { echo "cannot trace $name" | tee -a "$log"; continue; }
  echo "== $name: discover" | tee -a "$log"
  "$bin" discover "$dir/$name.pt" 2>&1 | grep -E '^[0-9]+ |^     (addmm|linear)|^unmatched' | tee -a "$log"
  echo "== $name: compose --candidates $candidates" | tee -a "$log"
  t0=$(date +%s)
  "$bin" compose "$dir/$name.pt" --precision tf32 --candidates "$candidates" --jobs 16 --keep-slower --no-bench \
    --out "$dir/$name" 2>&1 | tail -20 | tee -a "$log"
  echo "compose exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - t0 )) s" | tee -a "$log"
  cp "$dir/$name/compose.json" "$OUT/compose_views_$name.json" 2>/dev/null
  python3 benches/device/views_check.py check "$name" "$dir/$name" "$dir/$name.pt" "$OUT/views_check.json" 2>&1 | tee -a "$log"
done
true
