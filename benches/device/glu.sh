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
# shellcheck source=benches/device/lib.sh
source "$(dirname "$0")/lib.sh"
bench_init glu 560 "llama qwen2" -- "$@"

realize_step() { # NAME RULE SHAPE
  local name=$1 rule=$2 shape=$3 t
  need_time 120 "$name" || return 0
  realize_run "$name" "$name" "$rule" bf16 "$shape" 150
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
  winner=$(realize_winner "$name")
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
bench_done
