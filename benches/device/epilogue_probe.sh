#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: composes some of
# the epilogue suite's models (benches/device/epilogue_models.py) with a small sweep each and keeps
# every sweep.json, so the fused kernels' verification and timings against torch's eager ops (the
# tuner's baseline) come back without the whole suite.
# Usage: bash benches/device/epilogue_probe.sh CANDIDATES NAME:POLICY [NAME:POLICY ...]
#   POLICY is tf32, f32 or bf16 (bf16: the model and its inputs in bfloat16, fact's tf32 policy).
set -uo pipefail
export FACT_CACHE_DIR=${FACT_CACHE_DIR:-/tmp/fact-cache} FACT_TABLE=$OUT/user_table.json FACT_SHIPPED_TABLE=$PWD/pattern-table/table.json
bin=$PWD/.device/fact
candidates=$1
shift
log=$OUT/probe_log.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } >> "$log" 2>&1
for item in "$@"; do
  name=${item%%:*} policy=${item##*:}
  dir=/tmp/probe/$name-$policy
  mkdir -p "$dir"
  inputs=$(python3 - "$name" "$policy" "$dir/model.pt" <<'PY'
import sys, torch
sys.path.insert(0, "benches/device")
from epilogue_models import suite
name, policy, path = sys.argv[1:]
entry = {n: (f, s) for n, f, s in suite()}[name]
torch.manual_seed(0)
dtype = torch.bfloat16 if policy == "bf16" else torch.float32
m = entry[0]().eval().to(dtype)
small = [(8,) + tuple(s[1:]) if len(s) == 2 else (2, 4) + tuple(s[2:]) for s in entry[1]]
with torch.no_grad():
    torch.jit.trace(m, tuple(torch.randn(*s, dtype=dtype) for s in small)).save(path)
suffix = ":bf16" if policy == "bf16" else ""
print(" ".join("--input " + "x".join(map(str, s)) + suffix for s in entry[1]))
PY
)
  precision=$([ "$policy" = f32 ] && echo f32 || echo tf32)
  echo "== $name $policy: compose $inputs --precision $precision --candidates $candidates" | tee -a "$log"
  t0=$(date +%s)
  "$bin" compose "$dir/model.pt" $inputs --precision "$precision" --candidates "$candidates" --jobs 16 \
    --no-bench --out "$dir/out" 2>&1 | tee -a "$log"
  echo "wall $(( $(date +%s) - t0 )) s" | tee -a "$log"
  for s in "$dir"/out/sweeps/*/sweep.json; do
    [ -f "$s" ] && cp "$s" "$OUT/sweep_${name}_${policy}_$(basename "$(dirname "$s")" | tail -c 40).json"
  done
done
true
