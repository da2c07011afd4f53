#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: fact's RMSNorm
# kernels (src/kinds/rmsnorm/rmsnorm.cu.hbs) at the Llama-style zoo's shapes, bf16, with Llama's
# rounding (`rmsnorm_cast_weight`: the normalized value cast to bf16 before the weight).
#   llama  `fact realize --rule rmsnorm_cast_weight --dtype bf16 --shape 4096x2048` (B 4 · T 1024
#          rows of hidden 2048): every candidate verified against fp64 and timed against the
#          written-out ops in the same worker (the sweep's baseline); then rmsnorm_check.py on the
#          winner: each form through fact::rmsnorm against fp64, the calls that must fall back, and
#          the op, torch's eager ops, the traced module (TorchScript's fused kernels), torch.compile
#          and a plain copy of the same bytes timed, each as GB/s and as a share of the copy's rate.
#   qwen   the same at 4096x896 (Qwen2-0.5B's hidden size).
# The residual add before the norm as one kernel (rules::residual), bf16, realized the same way
# and checked by addnorm_check.py (every form through fact::rmsnorm_add[_sum] or
# fact::layernorm_add[_sum] against fp64, the sum bit for bit against the graph's add, the
# fallbacks; the op, eager, traced, torch.compile and a copy of as many bytes timed):
#   llama_add  `add_rmsnorm_cast_weight_sum` at 4096x2048: a + b, the sum written for the next
#              residual (a pre-norm decoder whose add no GEMM epilogue takes: Gemma's sandwich)
#   qwen_add   the same at 4096x896
#   bert_add   `add_layernorm_affine` at 16384x768 (B 32 · T 512): BERT's embeddings and their
#              LayerNorm, the sum read by the norm alone
# Usage: benches/device/rmsnorm.sh [BUDGET_S (default 560)] [STEP...]
#   (steps: llama qwen llama_add qwen_add bert_add; default llama qwen)
#   The add steps alone in about 5 minutes: benches/device/rmsnorm.sh 300 llama_add qwen_add bert_add
# Logs and JSON under $OUT/rmsnorm/; the summary is the last lines of the output.
set -uo pipefail
# shellcheck source=benches/device/lib.sh
source "$(dirname "$0")/lib.sh"
bench_init rmsnorm 560 "llama qwen" -- "$@"

realize_step() { # NAME RULE DTYPE SHAPE
  local name=$1 rule=$2 dtype=$3 shape=$4 t
  need_time 90 "$name" || return 0
  realize_run "$name" "$name" "$rule" "$dtype" "$shape" 10
  python3 - "$dir/$name.json" "$shape" "$rule" <<'PY' | tee -a "$summary"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("   no result:", e); sys.exit()
rows, cols = map(int, sys.argv[2].split("x"))
rule = sys.argv[3]
# bf16: x (or the add's two operands) read once, y (and the sum, for `_sum`) written once, the
# norm's parameters (one, LayerNorm's two) read once.
tensors = 2 if not rule.startswith("add_") else 3 + rule.endswith("_sum")
params = 2 if rule.endswith("layernorm_affine") else 1
gb = (tensors * rows * cols + params * cols) * 2 / 1e9
print("   realization:", json.dumps(r.get("realization"))[:300])
e = r.get("entry")
if e:
    run = e["runs"][e["winner_run"]]
    base = run["baseline"]["median_ms"] if run.get("baseline") else None
    print(f"   winner {e['winner']} {e['winner_ms']:.4f} ms = {gb / e['winner_ms'] * 1e3:.0f} GB/s; torch's ops {base:.4f} ms = {gb / base * 1e3:.0f} GB/s; torch/winner {base / e['winner_ms']:.2f}")
    for c in run["candidates"]:
        ms = (c.get("timing") or {}).get("median_ms")
        rate = f"{gb / ms * 1e3:5.0f} GB/s" if ms else "-"
        err = c.get("max_rel_err")
        print(f"    {c['kernel']:30s} {c['status']:16s} err {err if err is None else f'{err:.1e}'} ms {ms if ms is None else f'{ms:.4f}'} {rate} {(c.get('error') or c.get('log') or '')[:200]}")
PY
  local sweep winner
  sweep=$(ls -d "$dir/$name"/sweeps/*/ 2>/dev/null | head -1)
  winner=$(realize_winner "$name")
  t=$(left)
  if [[ -n "$sweep" && -f "$sweep/libsweep.so" && -n "$winner" ]] && (( t > 30 )); then
    if [[ $rule == add_* ]]; then
      # The winner checked, and timed beside the fastest candidate of each other order of reads.
      local timed
      timed=$(python3 - "$dir/$name.json" "$winner" <<'PY'
import json, re, sys
run = (e := json.load(open(sys.argv[1]))["entry"])["runs"][e["winner_run"]]
best = {}
for c in run["candidates"]:
    ms = (c.get("timing") or {}).get("median_ms")
    reads = re.search(r"_r\d+(_es)?_", c["kernel"] + "_").group(1) or ""
    if c["status"] == "ok" and ms and (reads not in best or ms < best[reads][0]):
        best[reads] = (ms, c["kernel"])
print(",".join([sys.argv[2]] + sorted({k for _, k in best.values()} - {sys.argv[2]})))
PY
)
      timeout $((t - 5)) python3 benches/device/addnorm_check.py "$sweep/libsweep.so" "${timed:-$winner}" "$rule" "$shape" \
        "$dir/$name.check.json" > "$dir/$name.check.log" 2>&1
    else
      timeout $((t - 5)) python3 benches/device/rmsnorm_check.py "$sweep/libsweep.so" "$winner" "$shape" "$dir/$name.check.json" \
        > "$dir/$name.check.log" 2>&1
    fi
    echo "   check rc=$?" | tee -a "$summary"
    tail -n 20 "$dir/$name.check.log" | sed 's/^/   /' | tee -a "$summary"
  else
    echo "   nothing to check (sweep ${sweep:-none}, winner ${winner:-none}, ${t}s left)" | tee -a "$summary"
  fi
}

for s in $steps; do
  case $s in
    llama) realize_step llama rmsnorm_cast_weight bf16 4096x2048 ;;
    qwen) realize_step qwen rmsnorm_cast_weight bf16 4096x896 ;;
    llama_add) realize_step llama_add add_rmsnorm_cast_weight_sum bf16 4096x2048 ;;
    qwen_add) realize_step qwen_add add_rmsnorm_cast_weight_sum bf16 4096x896 ;;
    bert_add) realize_step bert_add add_layernorm_affine bf16 16384x768 ;;
    *) echo "unknown step $s (llama qwen llama_add qwen_add bert_add)" ;;
  esac
done
bench_done
