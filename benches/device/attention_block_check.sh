#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: composes the GPT
# block (tf32) with the tables given, benches it (op call counts: which kernels ran), and probes
# fact::attention's checks on the block's tensors (benches/device/attention_probe.py).
# Usage: benches/device/attention_block_check.sh USER_TABLE
set -uo pipefail
export FACT_CACHE_DIR=${FACT_CACHE_DIR:-/tmp/fact-cache} FACT_TABLE=/tmp/block_table.json FACT_SHIPPED_TABLE=$PWD/pattern-table/table.json
cp "$1" $FACT_TABLE
bin=$PWD/.device/fact
dir=/tmp/blockcheck
mkdir -p $dir
python3 - $dir/model.pt <<'PY'
import sys, torch
sys.path.insert(0, "benches/device")
from epilogue_models import suite
f = {n: f for n, f, s in suite()}["gpt_block_gelu"]
torch.manual_seed(0)
with torch.no_grad():
    torch.jit.trace(f().eval(), (torch.randn(2, 4, 768),)).save(sys.argv[1])
PY
"$bin" compose $dir/model.pt --input 128x512x768 --out $dir/out --jobs 16 2>&1 | tail -25
kernel=$(python3 -c "import json;r=json.load(open('$dir/out/compose.json'));print([p['kernel'] for p in r['patterns'] if p['rule'].startswith('attention')][0])")
python3 benches/device/attention_probe.py $dir/out/libfact_ops.so "$kernel" 2>&1 | tail -8
python3 - $dir <<'PY'
import ctypes, json, sys, torch
d = sys.argv[1]
torch.set_float32_matmul_precision("high")
torch.ops.load_library(f"{d}/out/libfact_ops.so")
lib = ctypes.CDLL(f"{d}/out/libfact_ops.so")
lib.fact_op_stats.restype = ctypes.c_char_p
m = torch.jit.load(f"{d}/out/composed.pt", map_location="cuda")
o = torch.jit.load(f"{d}/model.pt", map_location="cuda")
x = torch.randn(128, 512, 768, device="cuda")
with torch.no_grad():
    lib.fact_op_stats_reset()
    y = m(x); torch.cuda.synchronize()
    print("composed block op calls:", json.loads(lib.fact_op_stats()))
    print("max diff to the traced original:", (y - o(x)).abs().max().item())
PY
cp $dir/out/compose.json $dir/out/report.json $OUT/ 2>/dev/null
true
