#!/usr/bin/env bash
# GEMM + bias parity on the GPU machine (repo root, after `source .device/env.sh`): composes a
# traced Linear per case from the shipped table with --keep-slower (fact's own winner runs), then
# benches/device/gemm_parity.py times torch linear, torch mm and fact in one process; Nsight Compute
# captures one call of each of NCU_CASES into $OUT/ncu_NAME.txt.
# Cases: NAME:M:K:N:DTYPE[:EPI] (dtype f32 under tf32, or bf16; EPI bias (the default), none (a
# Linear without bias: fact's plain GEMM), gelu (tanh GELU after the linear) or residual (the
# linear plus a second input)).
set -u
export FACT_SHIPPED_TABLE=${FACT_SHIPPED_TABLE:-$PWD/pattern-table/table.json} FACT_TABLE=${FACT_TABLE:-/tmp/parity_table.json} FACT_CACHE_DIR=/tmp/fact-cache
dir=/tmp/parity; mkdir -p $dir/models
# REALIZE: shapes (MxNxK[:DTYPE[:RULE]], f32 under tf32 unless bf16 is named; RULE gemm_rcr_bias
# unless gemm_rcr is named) to tune first, so their composes hit a winner of their own shape
# rather than a bucket neighbour's.
# REALIZE_FRESH=1 sweeps them even where the shipped table has a winner; FACT_SHIPPED_TABLE=/tmp/none
# (a missing file) sweeps every case's compose too.
for r in ${REALIZE:-}; do
  IFS=: read -r s rdt rule <<< "$r"; rdt=${rdt:-f32}; rule=${rule:-gemm_rcr_bias}
  shipped=$FACT_SHIPPED_TABLE; [ -n "${REALIZE_FRESH:-}" ] && shipped=/tmp/parity_no_shipped.json
  FACT_SHIPPED_TABLE=$shipped .device/fact realize --rule $rule --dtype $rdt --shape $s --precision tf32 \
      --jobs 16 --candidates ${CANDIDATES:-12} --out $dir/realize_${s}_${rdt}_$rule > $dir/realize_${s}_${rdt}_$rule.log 2>&1 || echo "realize $rule $s $rdt failed"
  mkdir -p $OUT/realize && cp $dir/realize_${s}_${rdt}_$rule.log $OUT/realize/
  tail -4 $dir/realize_${s}_${rdt}_$rule.log
done
compose() {
  .device/fact compose $dir/models/$1.pt --precision tf32 --keep-slower --no-bench --jobs 16 --candidates ${CANDIDATES:-12} \
      --out $dir/fact/$1 > $dir/compose_$1.log 2>&1 || { echo "compose $1 failed"; tail -5 $dir/compose_$1.log; }
}
for c in "$@"; do
  IFS=: read -r name m k n dt epi <<< "$c"
  python3 - "$dir/models/$name.pt" $m $k $n $dt ${epi:-bias} <<'PY'
import sys, torch
path, m, k, n, dt, epi = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5], sys.argv[6]
dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dt]
x = torch.randn(m, k, device="cuda", dtype=dtype)
if epi in ("bias", "none"):
    torch.jit.trace(torch.nn.Linear(k, n, bias=epi == "bias").cuda().to(dtype), x).save(path)
else:
    class Fused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(k, n)

        def forward(self, x, r):
            y = self.lin(x)
            return torch.nn.functional.gelu(y, approximate="tanh") if epi == "gelu" else y + r

    r = torch.randn(m, n, device="cuda", dtype=dtype)
    torch.jit.trace(Fused().cuda().to(dtype), (x, r)).save(path)
PY
  # COMPOSE_PARALLEL=1 composes the cases at once: only where each hits a table winner (sweeps
  # at once would time their kernels on one GPU together).
  if [ -n "${COMPOSE_PARALLEL:-}" ]; then compose $name & else compose $name; fi
done
wait
for c in "$@"; do
  name=${c%%:*}
  echo "$name: $(grep -h -i "winner\|kernel\|left to torch" $dir/compose_$name.log | tail -3)"
done
# REPEATS=N times every case in N processes, one after the other, and prints each case's
# kernel-level ratios with their median: one run's ratio moves 2-3% on some shapes.
rm -f $dir/parity.jsonl
for i in $(seq ${REPEATS:-1}); do
  for c in "$@"; do python3 benches/device/gemm_parity.py $dir "$c" 2>&1 | tee -a $OUT/parity.txt; done
done
if [ "${REPEATS:-1}" -gt 1 ]; then
  python3 - $dir/parity.jsonl <<'PY' | tee -a $OUT/parity.txt
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    # A run whose kernels the profiler did not see has no kernel ratio: it is left out.
    ratio = r.get("kernel_fact_vs_mm")
    runs.setdefault((r["case"], r["epilogue"], r["dtype"]), []).extend([ratio] if ratio else [])
print("| case | dtype | kernel mm/fact, each run | median |")
for (case, epi, dt), v in runs.items():
    median = f"{statistics.median(v):.3f}" if v else "-"
    print(f"| {case} ({epi}) | {dt} | {', '.join(f'{x:.3f}' for x in v)} | {median} |")
PY
fi
# NCU_CASES: the names to capture with Nsight Compute (clocks left alone).
for name in ${NCU_CASES:-}; do
    c=$(printf '%s\n' "$@" | grep "^$name:")
    ncu --clock-control none --nvtx --nvtx-include "ncu_$name/" --section SpeedOfLight --section LaunchStats \
        --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats \
        python3 benches/device/gemm_parity.py $dir "$c" --ncu-once > $OUT/ncu_$name.txt 2>&1
    bash benches/device/ncu_summary.sh $OUT/ncu_$name.txt ${NCU_LINES:-70} "Cluster|DRAM Throughput|L2 Hit|Elapsed Cycles|SM Active Cycles|Warp Cycles Per Issued"
done
