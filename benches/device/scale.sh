#!/usr/bin/env bash
# Runs on the GPU machine (two GPUs or more: nvidia-h100-x2) from the repository root, after
# `source .device/env.sh`, with $OUT: what a cold compose of a 12-layer zoo transformer costs on
# one GPU and on two (issue 34, part 1), in one call of at most 9 minutes. Steps, each a
# `fact compose MODEL --no-bench` with its own fresh user table and no shipped table
# (FACT_SHIPPED_TABLE=/nonexistent.json: every pattern is tuned), timed on the wall clock:
#   cold_1gpu        --gpus 1, a fresh build cache (nvcc compiles every candidate)
#   cold_2gpu        --gpus 2, another fresh build cache
#   warm_cache_1gpu  --gpus 1 on the build cache the cold steps filled: no compile, only
#                    tuning and linking, what the GPUs alone decide
#   warm_cache_2gpu  --gpus 2 likewise
#   shared_cache     RESERVED for the shared compile cache (sccache, issue 34 part 2): a cold
#                    build cache backed by the shared one; its step writes steps/shared_cache.json
#                    ({"wall_s": ...}) and `assemble` then adds shared_cache_vs_cold
# Usage: bash benches/device/scale.sh [STEPS...]   (default: cold warm; `cold` is cold_1gpu and
#        cold_2gpu, `warm` the two warm_cache steps; `assemble` only rewrites the record; `check`
#        realizes one GEMM with --gpus 2 and writes check.json: each GPU's run of its entry, to
#        see the dealing work before spending a call on the composes, about 2 minutes)
# Environment: SCALE_MODEL (gpt2; bert works too), SCALE_POLICY (bf16), SCALE_FACT_ARGS
# (--candidates 8 --refine 2: fewer candidates than compose's default 12 and 4 so that both cold
# composes fit the call; "" for compose's defaults), SCALE_BUDGET_S (520: no step starts after it,
# a running one is stopped there), SCALE_WORK (/tmp/scale: kept while the machine stays warm, so a
# second call can run the steps the first had no time for), FACT_BIN (.device/fact).
# Writes $OUT/scale/record.json (wall times, two_gpu_vs_one, each winner's speedup over torch
# under one and two GPUs), steps/, compose/ (each step's compose.json), logs/ and user tables.
set -uo pipefail
bin=${FACT_BIN:-$PWD/.device/fact}
model=${SCALE_MODEL:-gpt2}
policy=${SCALE_POLICY:-bf16}
fact_args=${SCALE_FACT_ARGS---candidates 8 --refine 2}
budget=${SCALE_BUDGET_S:-520}
work=${SCALE_WORK:-/tmp/scale}
out=${OUT:?set OUT}/scale
start=$(date +%s)
mkdir -p "$out/steps" "$out/compose" "$out/logs" "$out/tables" "$work/models" "$work/work" "$work/tables"
log=$out/scale_log.txt
[ $# -eq 0 ] && set -- cold warm
{
  echo "== $(date -u) benches/device/scale.sh $* (model $model, policy $policy, fact args '$fact_args')"
  nvidia-smi -L
  nproc
  "$bin" --version
} >> "$log" 2>&1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')

left() { echo $(( budget - ($(date +%s) - start) )); }

trace() { # the zoo's model, traced on the GPU as the zoo traces it (once per work folder)
  local pt=$work/models/${model}_${policy}.pt
  if [ ! -f "$pt" ]; then
    echo "tracing $model ($policy)" | tee -a "$log" >&2
    python3 benches/zoo/run.py "$work" --child trace "$model" "$policy" >> "$log" 2>&1 \
      || { echo "tracing failed: see $log" | tee -a "$log" >&2; return 1; }
  fi
  echo "$pt"
}

compose() { # NAME GPUS CACHE: one timed compose into steps/NAME.json
  local name=$1 n=$2 cache=$3 pt t0 t1 rc limit
  limit=$(left)
  if (( limit < 30 )); then
    echo "$name: not started, $limit s of the budget left" | tee -a "$log"
    python3 -c "import json,sys; json.dump({'skipped': 'budget spent'}, open(sys.argv[1], 'w'))" "$out/steps/$name.json"
    return
  fi
  if (( gpus < n )); then
    echo "$name: needs $n GPUs, $gpus here" | tee -a "$log"
    python3 -c "import json,sys; json.dump({'skipped': 'needs $n GPUs, $gpus here'}, open(sys.argv[1], 'w'))" "$out/steps/$name.json"
    return
  fi
  pt=$(trace) || return
  rm -rf "$work/out-$name" "$work/tables/$name.json"
  echo "$name: fact compose --gpus $n, build cache $cache ($limit s left)" | tee -a "$log"
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  FACT_TABLE=$work/tables/$name.json FACT_SHIPPED_TABLE=/nonexistent.json FACT_CACHE_DIR=$cache \
    timeout "$limit" "$bin" compose "$pt" --out "$work/out-$name" --no-bench --json --precision tf32 \
    --gpus "$n" $fact_args > "$work/out-$name.json" 2> "$out/logs/$name.log"
  rc=$?
  t1=$(date +%s.%N)
  cp "$work/out-$name/compose.json" "$out/compose/$name.json" 2>/dev/null
  cp "$work/tables/$name.json" "$out/tables/$name.json" 2>/dev/null
  python3 - "$out/steps/$name.json" "$name" "$n" "$cache" "$rc" "$t0" "$t1" "$fact_args" "$out/logs/$name.log" <<'PY'
import json, re, sys
path, name, n, cache, rc, t0, t1, args, log = sys.argv[1:10]
text = open(log, errors="replace").read()
# Where the time went, from compose's step lines (whole seconds; builds and measurements that ran
# side by side both count, so these may add up to more than the wall time).
compiled = [(int(k), int(s)) for k, s in re.findall(r"^compiled (\d+) kernels in (\d+) s", text, re.M)]
tuned = [int(s) for s in re.findall(r"^tuned \S+ in (\d+) s", text, re.M)]
json.dump({"step": name, "gpus": int(n), "build_cache": cache, "exit": int(rc), "timed_out": int(rc) in (124, 137),
           "wall_s": round(float(t1) - float(t0), 1), "fact_args": args,
           "builds": len(compiled), "build_s_sum": sum(s for _, s in compiled), "kernels_built": sum(k for k, _ in compiled),
           "measurements": len(tuned), "tune_s_sum": sum(tuned)}, open(path, "w"), indent=1)
PY
  echo "$name: exit $rc after $(python3 -c "print(round($t1 - $t0, 1))") s" | tee -a "$log"
  grep -E "^(tuning|tuned|compiled|prefetch|measuring|gpus)" "$out/logs/$name.log" | tail -4 >> "$log"
}

assemble() { # record.json from every step this work folder ran
  python3 - "$out" "$model" "$policy" "$gpus" <<'PY'
import json, os, sys
out, model, policy, gpus = sys.argv[1:5]
steps = {}
for f in sorted(os.listdir(os.path.join(out, "steps"))):
    steps[f[:-5]] = json.load(open(os.path.join(out, "steps", f)))
def wall(name):
    s = steps.get(name) or {}
    return s.get("wall_s") if s.get("exit") == 0 else None
def ratio(a, b):
    x, y = wall(a), wall(b)
    return round(x / y, 3) if x and y else None
def winners(name):
    """Each distinct problem's winner in the step's compose.json: kernel and torch ms, speedup."""
    path = os.path.join(out, "compose", name + ".json")
    if not os.path.exists(path):
        return {}
    rep = json.load(open(path))
    w = {}
    for p in rep.get("patterns", []):
        if not p.get("key") or p.get("kernel_ms") is None or p.get("torch_ms") is None:
            continue
        key = f"{p['key']['rule']} {p['key']['shape']}"
        w[key] = {"kernel": p["kernel"], "kernel_ms": p["kernel_ms"], "torch_ms": p["torch_ms"],
                  "speedup": round(p["torch_ms"] / p["kernel_ms"], 4), "how": p["realization"]["how"]}
    return w
def compare(one, two):
    a, b = winners(one), winners(two)
    rows = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        r = round(y["speedup"] / x["speedup"], 4) if x and y else None
        rows.append({"problem": k, "one_gpu": x, "two_gpus": y, "two_over_one": r,
                     # the target: each two-GPU winner within 2% of the one-GPU winner's speedup
                     "within_2pct": None if r is None else r >= 0.98})
    ok = [r["within_2pct"] for r in rows if r["within_2pct"] is not None]
    return rows, (all(ok) if ok else None)
def gpus_used(name):
    path = os.path.join(out, "compose", name + ".json")
    if not os.path.exists(path):
        return None
    return [{"index": g.get("index"), "name": g.get("name"), "uuid": g.get("uuid")} for g in json.load(open(path)).get("gpus", [])]
cold_rows, cold_ok = compare("cold_1gpu", "cold_2gpu")
warm_rows, warm_ok = compare("warm_cache_1gpu", "warm_cache_2gpu")
record = {
    "script": "benches/device/scale.sh",
    "model": model, "policy": policy, "layers": 12, "gpus_visible": int(gpus),
    "tables": "no shipped table (FACT_SHIPPED_TABLE=/nonexistent.json), a fresh user table per step: every pattern tuned",
    "steps": steps,
    "gpus_used": {name: gpus_used(name) for name in steps},
    # compose wall time with two GPUs over one, same model, same call of this script
    "two_gpu_vs_one": ratio("cold_2gpu", "cold_1gpu"),
    "two_gpu_vs_one_warm_cache": ratio("warm_cache_2gpu", "warm_cache_1gpu"),
    # the shared compile cache's step (issue 34 part 2) fills this: shared_cache over cold_1gpu
    "shared_cache_vs_cold": ratio("shared_cache", "cold_1gpu"),
    "winners_cold": cold_rows, "winners_within_2pct_cold": cold_ok,
    "winners_warm_cache": warm_rows, "winners_within_2pct_warm_cache": warm_ok,
}
json.dump(record, open(os.path.join(out, "record.json"), "w"), indent=1)
print(json.dumps({k: record[k] for k in ("two_gpu_vs_one", "two_gpu_vs_one_warm_cache", "shared_cache_vs_cold",
                                         "winners_within_2pct_cold", "winners_within_2pct_warm_cache")}))
for name, s in steps.items():
    print(f"  {name}: {s}")
PY
}

for step in "$@"; do
  case $step in
  cold)
    rm -rf "$work/cache-1" "$work/cache-2"
    compose cold_1gpu 1 "$work/cache-1"
    compose cold_2gpu 2 "$work/cache-2"
    assemble | tee -a "$log"
    ;;
  warm)
    # One build cache holding what both cold composes compiled (objects are keyed by content; a
    # .ref names its unit's object in the cache that compiled it, which stays).
    mkdir -p "$work/cache-1"
    [ -d "$work/cache-2" ] && cp -rn "$work/cache-2/." "$work/cache-1/"
    compose warm_cache_1gpu 1 "$work/cache-1"
    compose warm_cache_2gpu 2 "$work/cache-1"
    assemble | tee -a "$log"
    ;;
  assemble) assemble | tee -a "$log" ;;
  check)
    FACT_TABLE=$work/tables/check.json FACT_SHIPPED_TABLE=/nonexistent.json FACT_CACHE_DIR=$work/cache-check \
      timeout "$(left)" "$bin" realize --rule gemm_rcr_bias --dtype bf16 --shape 8192x768x768 --candidates 8 \
      --gpus 2 --out "$work/out-check" --json > "$work/check.json" 2> "$out/logs/check.log"
    echo "check: exit $?" | tee -a "$log"
    python3 - "$work/check.json" "$out/check.json" <<'PY' | tee -a "$log"
import json, sys
r = json.load(open(sys.argv[1]))
e = r.get("entry") or {}
runs = [{"gpu": run["provenance"]["device"].get("index"), "uuid": run["provenance"]["device"].get("uuid"),
         "torch_ms": (run.get("baseline") or {}).get("median_ms"),
         "variants": [c["kernel"] for c in run["candidates"]],
         "ok": sum(c["status"] == "ok" for c in run["candidates"])} for run in e.get("runs", [])]
out = {"realization": r.get("realization"), "winner": e.get("winner"), "winner_ms": e.get("winner_ms"),
       "winner_gpu": runs[e["winner_run"]]["gpu"] if runs else None, "runs": runs, "seconds": r.get("seconds")}
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(json.dumps({k: out[k] for k in ("winner", "winner_gpu", "seconds")}),
      [(x["gpu"], len(x["variants"]), x["torch_ms"]) for x in runs])
PY
    ;;
  *) echo "unknown step $step: use cold, warm, check or assemble" >&2; exit 2 ;;
  esac
done
true
