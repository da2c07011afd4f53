#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: tunes the
# attention kernels of the GPT block's attention (B 128, H 8, T 512, D 96, causal, explicit form)
# under each policy with `fact realize`, into the user table $OUT/user_table.json (kept across
# reruns into the same $OUT). Logs and sweep folders under $OUT/attention_realize/.
# Usage: benches/device/attention_realize.sh [SHAPE] [RULE]   (default 128x8x512x512x96 attention_causal)
set -uo pipefail
shape=${1:-128x8x512x512x96}
rule=${2:-attention_causal}
export FACT_CACHE_DIR=/tmp/fact-cache FACT_TABLE=$OUT/user_table.json FACT_SHIPPED_TABLE=$PWD/pattern-table/table.json
dir=$OUT/attention_realize
mkdir -p "$dir"
for policy in tf32:f32:tf32 f32:f32:f32 bf16:bf16:tf32; do
  IFS=: read -r name dtype precision <<< "$policy"
  echo "== $rule $shape $name"
  "$PWD/.device/fact" realize --rule "$rule" --dtype "$dtype" --shape "$shape" --precision "$precision" \
    --jobs 16 --json --out "$dir/$name" > "$dir/$name.json" 2> "$dir/$name.log"
  python3 - "$dir/$name.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no result:", e); sys.exit()
print("  realization:", r["realization"])
e = r.get("entry")
if e:
    run = e["runs"][e["winner_run"]]
    base = run["baseline"]["median_ms"] if run.get("baseline") else None
    print(f"  winner {e['winner']} {e['winner_ms']:.4f} ms, torch {base} ms")
    for c in run["candidates"]:
        print("   ", c["kernel"], c["status"], c.get("max_rel_err"), (c.get("timing") or {}).get("median_ms"), (c.get("error") or c.get("log") or "")[:300])
PY
done
true
