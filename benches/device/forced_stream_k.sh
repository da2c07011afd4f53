#!/usr/bin/env bash
# Issue #10 item 4 (benches/results/parity, eighth stop), on the GPU machine after a build of main
# with benches/device/forced_stream_k.patch applied and
# `source .device/env.sh`: out + bias + residual (65536x768x3072, the add as gemm_parity.sh writes
# it) swept over the 128x256 cooperative Stream-K kernels (1x1x1 and 2x1x1, through
# benches/device/probe_agent.py) in tf32 and bf16, with one cluster round and a knob round whose
# grid holds the forced Stream-K decomposition. The runs go to $OUT/stream_k_table.json (a probe
# build's table: never merge it); each sweep's fastest candidates are printed.
set -u
A="python3 $PWD/benches/device/probe_agent.py"
export FACT_SHIPPED_TABLE=/tmp/forced_sk_no_shipped.json FACT_TABLE=$OUT/stream_k_table.json
for d in f32:32 bf16:64; do
  IFS=: read -r dtype tk <<< "$d"
  k() { echo "{\"tile\":[128,256,$tk],\"cluster\":[$1],\"schedule\":\"ws_cooperative\",\"scheduler\":\"stream_k\"}"; }
  t0=$(date +%s)
  FACT_PROBE="[$(k 1,1,1),$(k 2,1,1)]" .device/fact realize --rule gemm_rcr_bias --dtype $dtype \
      --shape 65536x768x3072 --epilogue "leaves=full;v1=add(v0,l0)" --precision tf32 --jobs 16 \
      --candidates 2 --refine 1 --agent "$A" --out /tmp/forced_sk_$dtype > $OUT/realize_$dtype.log 2>&1 \
    || { echo "$dtype failed"; tail -3 $OUT/realize_$dtype.log; }
  echo "$dtype: $(( $(date +%s) - t0 )) s"
done
python3 - $FACT_TABLE <<'PY'
import json, sys
for e in json.load(open(sys.argv[1]))["entries"]:
    for r in e["runs"]:
        base = (r.get("baseline") or {}).get("median_ms")
        ok = [c for c in r["candidates"] if (c.get("timing") or {}).get("median_ms")]
        for c in sorted(ok, key=lambda c: c["timing"]["median_ms"])[:12]:
            print(f"{e['key']['math']:>5} {c['timing']['median_ms']:.4f} torch {base:.4f} {c['kernel']}")
PY
