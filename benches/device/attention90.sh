#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: the sm90 fused
# attention (examples/88) against sm80's and torch's SDPA under bf16.
#   1. `fact realize` of bf16 SDPA problems with both attention families in the sweep: causal
#      128x8x512x512x96 (the GPT block), causal 16x12x1024x1024x64 (GPT-2 small), non-causal
#      128x8x512x512x64, and causal 16x12x256x256x32 (the 32 tile); each candidate verified against
#      fp64 and timed against torch's SDPA in the same worker process (the sweep's baseline).
#   2. attention90_check.py on each sweep's library: shape guards through fact::attention (T = 1,
#      T = 77, T not a multiple of the tile, d below the tile, Tq != Tk, strided/contiguous/3-d
#      inputs, a device divisor) against fp64, and the shape timed through the op against SDPA's
#      default, flash and cuDNN backends in one process.
# Steps run in that order while the time budget lasts (each is cut at what is left); a rerun into
# the same $OUT on a warm machine finds the compiled kernels in /tmp/fact-cache.
# Usage: benches/device/attention90.sh [BUDGET_S (default 560)] [STEP...]   (steps: gpt gpt2 full enc d32;
# enc is the attention suite's encoder, non-causal 32x12x512x512x64)
# CANDIDATES=N sweeps the first N candidates only (the sm90 kernels come first).
# Logs and JSON under $OUT/attention90/; the summary is the last lines of the output.
set -uo pipefail
budget=${1:-560}
shift || true
steps=${*:-gpt gpt2 full d32}
start=$SECONDS
export FACT_CACHE_DIR=/tmp/fact-cache FACT_TABLE=$OUT/user_table.json FACT_SHIPPED_TABLE=/nonexistent.json
dir=$OUT/attention90
mkdir -p "$dir"
summary=$dir/summary.txt
: > "$summary"
left() { echo $((budget - (SECONDS - start))); }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$dir/device.txt" 2>&1

run_step() {
  local name=$1 rule=$2 shape=$3
  local t
  t=$(left)
  # A sweep compiles for about two minutes on 16 cores before it measures anything.
  if (( t < 150 )); then echo "== $name skipped: ${t}s left" | tee -a "$summary"; return; fi
  echo "== $name: $rule bf16 $shape (${t}s left)" | tee -a "$summary"
  timeout $((t - 10)) "$PWD/.device/fact" realize --rule "$rule" --dtype bf16 --shape "$shape" \
    --jobs 16 ${CANDIDATES:+--candidates "$CANDIDATES"} --json --out "$dir/$name" > "$dir/$name.json" 2> "$dir/$name.log"
  echo "   realize rc=$? in $((SECONDS - start))s" | tee -a "$summary"
  python3 - "$dir/$name.json" <<'PY' | tee -a "$summary"
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
    print(f"   winner {e['winner']} {e['winner_ms']:.4f} ms, torch SDPA {base:.4f} ms, sdpa/winner {base / e['winner_ms']:.2f}")
    for c in run["candidates"]:
        ms = (c.get("timing") or {}).get("median_ms")
        ratio = f"{base / ms:.2f}" if ms and base else "-"
        err = c.get("max_rel_err")
        print(f"    {c['kernel']:55s} {c['status']:10s} err {err if err is None else f'{err:.1e}'} ms {ms if ms is None else f'{ms:.4f}'} sdpa/this {ratio} {(c.get('error') or c.get('log') or '')[:200]}")
PY
  local sweep
  sweep=$(ls -d "$dir/$name"/sweeps/*/ 2>/dev/null | head -1)
  t=$(left)
  if [[ -n "$sweep" && -f "$sweep/libsweep.so" && -f "$sweep/sweep.json" ]] && (( t > 30 )); then
    timeout $((t - 5)) python3 benches/device/attention90_check.py "$sweep" "$dir/$name.check.json" \
      > "$dir/$name.check.log" 2>&1
    echo "   check rc=$?" | tee -a "$summary"
    tail -n 20 "$dir/$name.check.log" | sed 's/^/   /' | tee -a "$summary"
  else
    echo "   no sweep library to check (${t}s left)" | tee -a "$summary"
  fi
}

for s in $steps; do
  case $s in
    gpt) run_step gpt sdpa_causal 128x8x512x512x96 ;;
    gpt2) run_step gpt2 sdpa_causal 16x12x1024x1024x64 ;;
    full) run_step full sdpa 128x8x512x512x64 ;;
    enc) run_step enc sdpa 32x12x512x512x64 ;;
    d32) run_step d32 sdpa_causal 16x12x256x256x32 ;;
    *) echo "unknown step $s (gpt gpt2 full enc d32)" ;;
  esac
done
echo "== summary ($((SECONDS - start))s)"
cat "$summary"
true
