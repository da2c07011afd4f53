#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: composes the
# epilogue suite's proj+residual model (tf32) from the shipped table, benches it (the bench checks
# that every substituted kernel ran), then benches it again with FACT_DISABLE=1, which must fail
# naming the kernel that never ran.
set -uo pipefail
export FACT_CACHE_DIR=${FACT_CACHE_DIR:-/tmp/fact-cache} FACT_TABLE=$OUT/user_table.json FACT_SHIPPED_TABLE=$PWD/pattern-table/table.json
bin=$PWD/.device/fact
dir=/tmp/opcheck
mkdir -p $dir
python3 - $dir/model.pt <<'PY'
import sys, torch
sys.path.insert(0, "benches/device")
from epilogue_models import suite
f = {n: f for n, f, s in suite()}["gpt_proj_residual"]
torch.manual_seed(0)
with torch.no_grad():
    torch.jit.trace(f().eval(), (torch.randn(2, 4, 768), torch.randn(2, 4, 768))).save(sys.argv[1])
PY
echo "== compose (warm: table hits) with bench"
t0=$(date +%s)
"$bin" compose $dir/model.pt --input 128x512x768 --input 128x512x768 --out $dir/out 2>&1 | tail -12
echo "compose + bench wall $(( $(date +%s) - t0 )) s, exit ${PIPESTATUS[0]}"
echo "== FACT_DISABLE=1 fact bench (must fail)"
FACT_DISABLE=1 "$bin" bench $dir/out 2>&1 | tail -4
echo "exit ${PIPESTATUS[0]}"
cp $dir/out/report.json $OUT/op_calls_report.json 2>/dev/null
true
