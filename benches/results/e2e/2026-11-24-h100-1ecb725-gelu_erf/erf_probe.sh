#!/usr/bin/env bash
# Probe: the F.gelu (erf) GEMM epilogue through fact_erf_approx, four kernels per policy; then the merge and both suites.
set -u
export FACT_TABLE=$OUT/t_erf.json
probe() { bash benches/device/probe_specs.sh "$@"; }
probe erf_tf32 65536x3072x768 f32 'leaves=;v1=gelu(v0)' '[{"tile": [128, 128, 32], "cluster": [2, 1, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "along_m", "swizzle": 1, "splits": 1}}, {"tile": [128, 128, 32], "cluster": [1, 2, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "along_m", "swizzle": 1, "splits": 1}}, {"tile": [128, 192, 32], "cluster": [1, 1, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "along_m", "swizzle": 1, "splits": 1}}, {"tile": [128, 192, 32], "cluster": [2, 1, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "along_m", "swizzle": 1, "splits": 1}}]'
probe erf_bf16 65536x3072x768 bf16 'leaves=;v1=gelu(v0)' '[{"tile": [128, 128, 64], "cluster": [2, 1, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "along_m", "swizzle": 1, "splits": 1}}, {"tile": [128, 128, 64], "cluster": [1, 2, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "along_m", "swizzle": 1, "splits": 1}}, {"tile": [128, 192, 64], "cluster": [1, 1, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "along_m", "swizzle": 1, "splits": 1}}, {"tile": [128, 192, 64], "cluster": [2, 1, 1], "schedule": "ws_pingpong", "scheduler": "persistent", "knobs": {"raster": "along_m", "swizzle": 1, "splits": 1}}]'
python3 benches/device/table_print.py $FACT_TABLE erf
.device/fact table merge --out pattern-table/table.json pattern-table/table.json $FACT_TABLE | tail -1
for p in bf16 tf32; do timeout 200 bash benches/device/e2e.sh suite $p gpt_block_gelu --budget-s 150 > $OUT/suite_$p.txt 2>&1; tail -2 $OUT/suite_$p.txt; done
