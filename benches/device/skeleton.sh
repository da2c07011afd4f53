#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh` (see README,
# "Runs on the GPU machine"). Composes the 4096^3 fp32 matmul (tf32 policy) with a full sweep,
# composes it again (must be a table hit), checks the Python loading path, and composes the
# example MLP. Everything worth keeping lands in $OUT.
set -uo pipefail
# A fresh user table and no shipped one: the first compose must run the whole sweep.
export FACT_CACHE_DIR=/tmp/fact-cache FACT_TABLE=$OUT/user_table.json FACT_SHIPPED_TABLE=/nonexistent.json
rm -f "$FACT_TABLE"
bin=$PWD/.device/fact
log=$OUT/log.txt
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'; nvcc --version | tail -2
} > "$log" 2>&1
python3 tests/fixtures/make_models.py /tmp/models --large >> "$log" 2>&1
step() {
  echo "== $*" | tee -a "$log"; local t0=$(date +%s%N)
  "$@" 2>&1 | tee -a "$log"
  echo "wall $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$log"
}
step "$bin" compose /tmp/models/gemm4096.pt --out /tmp/out/gemm4096 --save-report "$OUT/gemm4096_tf32.json"
step "$bin" compose /tmp/models/gemm4096.pt --out /tmp/out/gemm4096_again --no-bench
cat > /tmp/load.py <<'PY'
import sys, torch
torch.ops.load_library(sys.argv[1]); m = torch.jit.load(sys.argv[2]).cuda()
orig = torch.jit.load(sys.argv[3]).cuda()
torch.set_float32_matmul_precision("high")
a, b = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
with torch.no_grad():
    y, ref = m(a, b), (a.double() @ b.double())
err = ((y.double() - ref).norm() / ref.norm()).item()
print("python load ok: fact::gemm in graph:", "fact::gemm" in str(m.forward.graph), "rel err vs fp64:", err)
PY
step python3 /tmp/load.py /tmp/out/gemm4096/libfact_ops.so /tmp/out/gemm4096/composed.pt /tmp/models/gemm4096.pt
step "$bin" compose examples/mlp.pt --out /tmp/out/mlp --save-report "$OUT/example_mlp_tf32.json"
cp /tmp/out/gemm4096/compose.json "$OUT/gemm4096_compose.json" 2>/dev/null
true
