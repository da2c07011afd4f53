#!/usr/bin/env bash
# The kernel ABI (v5: every kind over FactOpArgs) on the GPU machine (repo root, after
# `source .device/env.sh`): sweeps whose every candidate must verify against fp64 (a plumbing
# mismatch shows as cannot_implement or a wrong result). Results in $OUT/abi (realize logs, and
# each sweep's candidate statuses printed from its sweep.json).
set -uo pipefail
export FACT_CACHE_DIR=/tmp/fact-cache FACT_TABLE=/tmp/abi_table.json FACT_SHIPPED_TABLE=/nonexistent.json
out=$OUT/abi; mkdir -p "$out"
bin=$PWD/.device/fact
step() { # NAME ARGS...: one realize, its statuses counted from its sweep.json
  local name=$1; shift
  timeout 200 "$bin" realize --jobs 16 --out /tmp/abi_$name "$@" > "$out/$name.log" 2>&1
  echo "== $name (exit $?): $(tail -2 "$out/$name.log" | head -1)"
  python3 - /tmp/abi_$name <<'PY'
import json, sys, glob, collections
for f in glob.glob(sys.argv[1] + "/**/sweep.json", recursive=True) + glob.glob(sys.argv[1] + "/sweep.json"):
    d = json.load(open(f))
    cands = [c for r in d.get("runs") or [d["run"]] for c in r["candidates"]]
    print("  ", f.split("/")[-2], dict(collections.Counter(c.get("status") for c in cands)),
          "max err", max((c.get("max_rel_err") or 0) for c in cands if c.get("status") == "ok") if cands else None)
PY
}
step gemm_f32 --rule gemm_rcr_bias --dtype f32 --shape 4096x4096x4096 --candidates 4
step leaves_bf16 --rule gemm_rcr_bias --dtype bf16 --shape 65536x768x768 --candidates 4 \
  --epilogue 'leaves=full,row,col,scalar;v1=mul(v0,l1);v2=add(v1,l2);v3=div(v2,l3);v4=add(v3,l0)'
step split_ragged --rule gemm_rrr --dtype f32 --shape 4099x5003x3001 --precision f32 --candidates 4
step bmm_bf16 --rule bmm_rrr --dtype bf16 --shape 8x512x512x64 --candidates 3
