#!/usr/bin/env bash
# Probe: the bf16 GPT block's fused keys' shipped winners against ping-pong 128x192 1x1x1, one run each; then the
# merge into the shipped table and the bf16 suite.
set -u
export FACT_SHIPPED_TABLE=/tmp/none.json FACT_CACHE_DIR=/tmp/fact-cache FACT_TABLE=$OUT/t_bf16.json
A="python3 $PWD/benches/device/probe_agent.py"
probe() { # name shape dtype epi json
  t0=$(date +%s)
  FACT_PROBE="$5" .device/fact realize --rule gemm_rcr_bias --dtype $3 --shape $2 ${4:+--epilogue "$4"} --precision tf32 \
    --jobs 16 --candidates 20 --refine 0 --agent "$A" --out /tmp/p_$1 > /tmp/log_$1.txt 2>&1 || tail -3 /tmp/log_$1.txt
  echo "== $1: $(( $(date +%s) - t0 )) s $(grep -h 'compiled' /tmp/log_$1.txt | tail -1)"
}
probe b768r 65536x768x3072 bf16 'leaves=full;v1=add(l0,v0)' '[{"family": "sm90_gemm", "arch": "sm90", "layout": "rcr", "math": "bf16", "dtype": "bf16", "tile": [128, 256, 64], "cluster": [2, 1, 1], "schedule": "ws_cooperative", "scheduler": "persistent", "bias": true, "align": 8, "knobs": {"raster": "along_m", "swizzle": 1, "splits": 1}}, {"tile": [128, 192, 64], "cluster": [1, 1, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "heuristic", "swizzle": 1, "splits": 1}}, {"tile": [128, 192, 64], "cluster": [1, 1, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "along_m", "swizzle": 1, "splits": 1}}]'
probe b768r2 65536x768x768 bf16 'leaves=full;v1=add(l0,v0)' '[{"family": "sm90_gemm", "arch": "sm90", "layout": "rcr", "math": "bf16", "dtype": "bf16", "tile": [128, 256, 64], "cluster": [2, 1, 1], "schedule": "ws_cooperative", "scheduler": "stream_k", "bias": true, "align": 8}, {"tile": [128, 192, 64], "cluster": [1, 1, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "heuristic", "swizzle": 1, "splits": 1}}, {"tile": [128, 192, 64], "cluster": [1, 1, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "along_m", "swizzle": 1, "splits": 1}}]'
probe b3072g 65536x3072x768 bf16 'leaves=;v1=gelu(v0)' '[{"family": "sm90_gemm", "arch": "sm90", "layout": "rcr", "math": "bf16", "dtype": "bf16", "tile": [128, 128, 64], "cluster": [2, 1, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "bias": true, "align": 8, "knobs": {"raster": "along_m", "swizzle": 1, "splits": 1}}, {"tile": [128, 192, 64], "cluster": [1, 1, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "heuristic", "swizzle": 1, "splits": 1}}, {"tile": [128, 192, 64], "cluster": [1, 1, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "along_m", "swizzle": 1, "splits": 1}}]'
python3 benches/device/table_print.py $FACT_TABLE bf16block
.device/fact table merge --out pattern-table/table.json pattern-table/table.json $FACT_TABLE | tail -1
timeout 280 bash benches/device/e2e.sh suite bf16 gpt_block_gelu --budget-s 180 > $OUT/suite_bf16.txt 2>&1; tail -4 $OUT/suite_bf16.txt
