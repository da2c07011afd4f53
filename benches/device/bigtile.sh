export FACT_SHIPPED_TABLE=/nonexistent.json FACT_TABLE=$OUT/bt_table.json FACT_CACHE_DIR=/tmp/fact-cache
# Does CUTLASS's sm90 tf32 GEMM with the TMA epilogue (bias, EVT) run faster on the big tiles
# (128x256, 256x128 cooperative) that the generator instantiates only with the no-smem or
# transposed epilogue? Those tiles beside the space's first six sm90 kernels.
A="python3 $PWD/benches/device/probe_agent.py"
export FACT_PROBE_SPACE=6 FACT_PROBE='[
  {"tile": [128, 256, 32], "cluster": [1, 2, 1], "schedule": "ws_cooperative", "scheduler": "persistent"},
  {"tile": [128, 256, 32], "cluster": [2, 1, 1], "schedule": "ws_cooperative", "scheduler": "persistent"},
  {"tile": [256, 128, 32], "cluster": [1, 2, 1], "schedule": "ws_cooperative", "scheduler": "persistent"},
  {"tile": [256, 128, 32], "cluster": [2, 1, 1], "schedule": "ws_cooperative", "scheduler": "persistent"}]'
run() { timeout 200 .device/fact realize --rule gemm_rcr_bias --dtype f32 --jobs 16 --refine 4 --out /tmp/bt "$@" --agent "$A" 2>&1 | grep -v "^ *$" | tail -6; }
run --shape 65536x2304x768
run --shape 65536x3072x768 --epilogue 'leaves=;v1=gelu(v0)'
run --shape 65536x768x3072 --epilogue 'leaves=full;v1=add(l0,v0)'
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/bt_table.json"))
for e in d["entries"]:
    print(e["key"]["shape"], e["key"]["rule"])
    rows = []
    for r in e["runs"]:
        base = (r.get("baseline") or {}).get("median_ms")
        for c in r["candidates"]:
            t = (c.get("timing") or {}).get("median_ms")
            rows.append((t or 99, c["kernel"], c.get("status"), base))
    for t, k, s, b in sorted(rows)[:10]:
        print(f"  {t:.4f} torch {b:.4f} {s} {k}")
    for t, k, s, b in sorted(rows):
        if s != "ok": print("  FAIL", s, k)
PY
