#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: the GPT block end
# to end (issue: composition, ablations, compose times, shape guards). Steps, each within one
# 600 s device call; results under $OUT/e2e:
#   cold POLICY     compose the block (F.gelu) from nothing: no user or shipped table, an empty build
#                   cache; `fact compose` then benches it (ablations, e2e.svg). Writes
#                   cold_POLICY.json {cold_compose_s, ...} and keeps its user table for later steps.
#   guards POLICY   shape guards (benches/device/shape_guards.py) on the block composed under POLICY
#                   (from the tables at hand) at other batch sizes and lengths, strided and CPU input.
#   suite POLICIES MODELS [ARGS]
#                   benches/device/epilogue_suite.py for MODELS x POLICIES with --warm-compose:
#                   eager, traced, torch.compile, fact, ablations, compose and warm compose times.
#   profile POLICY  the kernels of the block composed under POLICY (benches/device/profile_composed.py)
#   assemble        joins suite.json and the cold runs into gpt_block.json and draws e2e.svg.
set -uo pipefail
step=${1:?usage: e2e.sh cold|guards|profile|suite|assemble ...}
shift
bin=$PWD/.device/fact
out=$OUT/e2e
mkdir -p "$out"
log=$out/e2e_log.txt
export FACT_SHIPPED_TABLE=$PWD/pattern-table/table.json FACT_TABLE=$out/user_table.json FACT_CACHE_DIR=/tmp/fact-cache
# SEED_TABLE: a user table to start from (gzipped or not, as benches/results keeps them).
[ -n "${SEED_TABLE:-}" ] && [ ! -f "$FACT_TABLE" ] && gzip -dcf "$SEED_TABLE" > "$FACT_TABLE"
{
  echo "== e2e $step $* ($(date -u))"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'; "$bin" --version
} >> "$log" 2>&1

trace_block() { # NAME POLICY PATH: the suite's model as the suite traces it (epilogue_suite.trace)
  python3 - "$@" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "benches/device")
import epilogue_suite
name, policy, path = sys.argv[1:4]
out = Path(path).parent
(out / "models").mkdir(parents=True, exist_ok=True)
factory, shapes = epilogue_suite.models_by_name()[name]
epilogue_suite.trace(out, name, policy, factory, shapes)
(out / "models" / f"{epilogue_suite.tag(name, policy)}.pt").replace(path)
PY
}

precision_of() { [ "$1" = f32 ] && echo f32 || echo tf32; }
dtype_of() { [ "$1" = bf16 ] && echo bf16 || echo f32; }

case $step in
cold)
  policy=${1:?cold POLICY}
  dir=/tmp/e2e_cold_$policy
  rm -rf "$dir" /tmp/fact-cache-cold
  mkdir -p "$dir"
  trace_block gpt_block_gelu "$policy" "$dir/model.pt"
  t0=$(date +%s.%N)
  FACT_TABLE=$dir/user_table.json FACT_SHIPPED_TABLE=/nonexistent.json FACT_CACHE_DIR=/tmp/fact-cache-cold \
    "$bin" compose "$dir/model.pt" --input "128x512x768:$(dtype_of "$policy")" --precision "$(precision_of "$policy")" \
    --jobs 16 --out "$dir/out" --no-bench 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  t1=$(date +%s.%N)
  echo "cold compose exit $rc, $(python3 -c "print(round($t1 - $t0, 1))") s" | tee -a "$log"
  "$bin" bench "$dir/out" 2>&1 | tee -a "$log"
  cp "$dir/out/compose.json" "$out/cold_${policy}_compose.json"
  cp "$dir/out/report.json" "$out/cold_${policy}_report.json" 2>/dev/null
  cp "$dir/out/e2e.svg" "$out/cold_${policy}_e2e.svg" 2>/dev/null
  cp "$dir/user_table.json" "$out/cold_${policy}_user_table.json" 2>/dev/null
  # Later steps compose from what this one tuned.
  "$bin" table import "$dir/user_table.json" 2>&1 | tail -1 | tee -a "$log"
  python3 -c "import json,sys; json.dump({'policy': '$policy', 'model': 'gpt_block_gelu', 'cold_compose_s': round($t1 - $t0, 1), 'exit': $rc}, open('$out/cold_$policy.json', 'w'))"
  ;;
guards)
  policy=${1:?guards POLICY}
  dir=/tmp/e2e_guards_$policy
  mkdir -p "$dir"
  trace_block gpt_block_gelu "$policy" "$dir/model.pt"
  "$bin" compose "$dir/model.pt" --input "128x512x768:$(dtype_of "$policy")" --precision "$(precision_of "$policy")" \
    --jobs 16 --out "$dir/out" --no-bench 2>&1 | tail -12 | tee -a "$log"
  python3 benches/device/shape_guards.py "$dir/out" "$dir/model.pt" "$policy" 128x512x768 "$out/guards_$policy.json" 2>&1 | tee -a "$log"
  ;;
profile)
  policy=${1:?profile POLICY}
  dir=/tmp/e2e_guards_$policy
  mkdir -p "$dir"
  trace_block gpt_block_gelu "$policy" "$dir/model.pt"
  t0=$(date +%s.%N)
  "$bin" compose "$dir/model.pt" --input "128x512x768:$(dtype_of "$policy")" --precision "$(precision_of "$policy")" \
    --jobs 16 --out "$dir/out" --no-bench 2>&1 | tail -3 | tee -a "$log"
  echo "compose from the tables: $(python3 -c "import time; print(round(time.time() - $t0, 1))") s" | tee -a "$log"
  python3 benches/device/profile_composed.py "$dir/out" "$policy" 128x512x768 "$out/profile_$policy.json" 2>&1 | tee -a "$log"
  ;;
suite)
  policies=${1:?suite POLICIES MODELS}
  models=${2:?suite POLICIES MODELS}
  shift 2
  python3 benches/device/epilogue_suite.py "$out/suite" --policies "$policies" --only "$models" --warm-compose \
    --fact-args '--jobs 16' "$@" 2>&1 | tee -a "$log"
  # One suite.json per invocation: keep each under its own name for assemble.
  cp "$out/suite/suite.json" "$out/suite_$(echo "$policies$models" | tr -c 'a-z0-9' '_').json"
  ;;
assemble)
  python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
records = []
for f in sorted(glob.glob(f"{out}/suite_*.json")):
    records += json.load(open(f))
cold = {json.load(open(f))["policy"]: json.load(open(f)) for f in glob.glob(f"{out}/cold_*.json") if not f.endswith(("_compose.json", "_report.json", "_user_table.json"))}
for r in records:
    c = cold.get(r["policy"]) if r["model"] == "gpt_block_gelu" else None
    r["cold_compose_s"] = c["cold_compose_s"] if c else None
json.dump({"meta": {"device": os.popen("nvidia-smi --query-gpu=name --format=csv,noheader").read().strip(),
                    "torch": __import__("torch").__version__, "date": os.popen("date -u +%F").read().strip()},
           "records": records}, open(f"{out}/gpt_block.json", "w"), indent=1)
print(f"{len(records)} records")
PY
  "$bin" plot-e2e "$out/gpt_block.json" --out "$out/e2e.svg" --title "GPT block (B 128, T 512, C 768, 8 heads): speedup over eager" | tee -a "$log"
  ;;
*)
  echo "unknown step $step: use cold, guards, profile, suite or assemble" >&2
  exit 2
  ;;
esac
true
