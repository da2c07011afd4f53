#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: Nsight Compute's
# view of torch's SDPA and fact's sm90 attention kernels on one bf16 problem, one call each.
#   1. `fact realize` of the problem (the first CANDIDATES candidates; kernels come from
#      /tmp/fact-cache when a call before compiled them);
#   2. ncu over attention90_check.py --ncu-once on the sweep's library: launch statistics,
#      occupancy, speed of light, compute workload and warp states of every kernel in the range.
# Usage: benches/device/attention_ncu.sh RULE SHAPE   (e.g. sdpa 32x12x512x512x64)
# Output under $OUT/ncu/: the realize JSON and log, ncu_RULE_SHAPE.txt, and its summary lines.
set -uo pipefail
rule=$1 shape=$2
export FACT_CACHE_DIR=/tmp/fact-cache FACT_TABLE=$OUT/ncu_table.json FACT_SHIPPED_TABLE=/nonexistent.json
dir=$OUT/ncu
mkdir -p "$dir"
"$PWD/.device/fact" realize --rule "$rule" --dtype bf16 --shape "$shape" --jobs 16 \
  --candidates "${CANDIDATES:-3}" --json --out "$dir/r" > "$dir/realize.json" 2> "$dir/realize.log"
echo "realize rc=$?"
sweep=$(ls -d "$dir"/r/sweeps/*/ | head -1)
ncu --clock-control none --nvtx --nvtx-include "ncu/" --section LaunchStats --section Occupancy \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  python3 benches/device/attention90_check.py "$sweep" /dev/null --ncu-once > "$dir/ncu_${rule}_$shape.txt" 2>&1
echo "ncu rc=$?"
bash benches/device/ncu_summary.sh "$dir/ncu_${rule}_$shape.txt" 120 "Cluster Size|Warp Cycles Per Issued|profiled"
