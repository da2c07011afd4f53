#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: the gated MLP as
# one GEMM (src/kinds/glu) against torch's ops for it, bf16, at the zoo's shapes.
#   llama   `fact realize --rule glu_silu --shape 4096x5632x2048` (B4 T1024, hidden 2048, MLP 5632)
#   qwen2   `fact realize --rule glu_silu --shape 4096x4864x896`
# Each realize compiles the fused kernels (the GEMM kind's sm90 mainloops with fact's paired
# epilogue) and the split ones (the GEMM kind's kernel writing both halves, then one elementwise
# kernel) in one sweep, verifies each against fp64 and times it against the graph's own ops (two
# linears, silu, mul) in the same worker: printed per candidate (status, error, ms, torch/this).
# Then glu_check.py on the sweep's library: every candidate through fact::glu (error, fallbacks),
# and in the same process torch eager, eager over the concatenated weight, torch.compile and
# torch.compile max-autotune of the same function; the last line gives torch.compile / fact's best
# (the issue's target: >= 1.1).
# Usage: benches/device/glu.sh [BUDGET_S (default 560)] [STEP...]   (steps: llama qwen2)
# Logs and JSON under $OUT/glu/; the summary is the last lines of the output. A rerun on a warm
# machine finds compiled kernels in /tmp/fact-cache.
set -uo pipefail
budget=${1:-560}
shift || true
steps=${*:-llama qwen2}
start=$SECONDS
bin=$PWD/.device/fact
export FACT_CACHE_DIR=/tmp/fact-cache FACT_TABLE=$OUT/glu/user_table.json FACT_SHIPPED_TABLE=/nonexistent.json
dir=$OUT/glu
mkdir -p "$dir"
summary=$dir/summary.txt
: > "$summary"
left() { echo $((budget - (SECONDS - start))); }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  python3 -c 'import torch; print("torch", torch.__version__)'
  "$bin" --version
} > "$dir/device.txt" 2>&1

realize_step() { # NAME RULE SHAPE
  local name=$1 rule=$2 shape=$3 t
  t=$(left)
  if (( t < 120 )); then echo "== $name skipped: ${t}s left" | tee -a "$summary"; return; fi
  echo "== $name: $rule bf16 $shape (${t}s left)" | tee -a "$summary"
  timeout $((t - 150)) "$bin" realize --rule "$rule" --dtype bf16 --shape "$shape" --jobs 16 --json \
    --out "$dir/$name" > "$dir/$name.json" 2> "$dir/$name.log"
  echo "   realize rc=$? in $((SECONDS - start))s" | tee -a "$summary"
  python3 - "$dir/$name.json" "$dir/$name.kernels" <<'PY' | tee -a "$summary"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("   no result:", e); sys.exit()
print("   realization:", json.dumps(r.get("realization"))[:300])
e = r.get("entry")
if e:
    run = e["runs"][e["winner_run"]]
    base = run["baseline"]["median_ms"] if run.get("baseline") else None
    print(f"   winner {e['winner']} {e['winner_ms']:.4f} ms, torch (two linears, act, mul) {base:.4f} ms, torch/winner {base / e['winner_ms']:.2f}")
    names = []
    for c in run["candidates"]:
        ms = (c.get("timing") or {}).get("median_ms")
        ratio = f"{base / ms:.2f}" if ms and base else "-"
        err = c.get("max_rel_err")
        names.append(c["kernel"])
        print(f"    {c['kernel']:90s} {c['status']:16s} err {err if err is None else f'{err:.1e}'} ms {ms if ms is None else f'{ms:.4f}'} torch/this {ratio} {(c.get('error') or c.get('log') or '')[:200]}")
    open(sys.argv[2], "w").write(" ".join(names))
PY
  # Each round of the sweep built its own library (sweeps/KEY, KEY_siblings, KEY_knobs); torch
  # takes one fact op library per process, so the check runs once per library, on its kernels,
  # the round holding the winner first.
  local lib winner n=0
  winner=$(python3 -c "import json,sys; e=json.load(open(sys.argv[1])).get('entry'); print(e['winner'] if e else '')" "$dir/$name.json" 2>/dev/null)
  for lib in $( (grep -l -- "${winner:-none}" "$dir/$name"/sweeps/*/libsweep.so 2>/dev/null; ls "$dir/$name"/sweeps/*/libsweep.so 2>/dev/null) | awk '!seen[$0]++'); do
    t=$(left)
    if (( t < 40 )); then echo "   check of $lib skipped: ${t}s left" | tee -a "$summary"; continue; fi
    n=$((n + 1))
    # shellcheck disable=SC2046
    timeout $((t - 5)) python3 benches/device/glu_check.py "$lib" "$shape" silu "$dir/$name.check$n.json" \
      $(cat "$dir/$name.kernels") > "$dir/$name.check$n.log" 2>&1
    echo "   check of $lib rc=$?" | tee -a "$summary"
    tail -n 24 "$dir/$name.check$n.log" | sed 's/^/   /' | tee -a "$summary"
  done
  (( n > 0 )) || echo "   nothing to check (no sweep library, winner ${winner:-none})" | tee -a "$summary"
}

for s in $steps; do
  case $s in
    llama) realize_step llama glu_silu 4096x5632x2048 ;;
    qwen2) realize_step qwen2 glu_silu 4096x4864x896 ;;
    *) echo "unknown step $s (llama qwen2)" ;;
  esac
done
echo "== summary ($((SECONDS - start))s)"
cat "$summary"
true
