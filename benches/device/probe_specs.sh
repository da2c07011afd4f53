#!/usr/bin/env bash
# One sweep of named kernels on the GPU machine, after `source .device/env.sh` (the probes of issue
# #10 item 4): bash probe_specs.sh NAME SHAPE DTYPE EPILOGUE JSON realizes gemm_rcr_bias at SHAPE
# (MxNxK) and DTYPE, with the fused EPILOGUE program ('' for none), over exactly the kernels of
# JSON (probe_agent.py's FACT_PROBE: spec overrides of the space's first sm90 kernel), into
# $FACT_TABLE, with no shipped table and one round; prints its wall time and nvcc line.
# FACT_BIN: the fact binary (.device/fact; a probe build for residual_probe.sh, stagger_probe.sh).
# PROBE_LOG: its log (${PROBE_LOGS:-/tmp}/log_NAME.txt); PROBE_OUT: its --out folder (/tmp/p_NAME).
set -u
name=$1 shape=$2 dtype=$3 epi=$4 probe=$5
log=${PROBE_LOG:-${PROBE_LOGS:-/tmp}/log_$name.txt}
export FACT_SHIPPED_TABLE=/tmp/none.json FACT_CACHE_DIR=${FACT_CACHE_DIR:-/tmp/fact-cache}
t0=$(date +%s)
FACT_PROBE="$probe" "${FACT_BIN:-.device/fact}" realize --rule gemm_rcr_bias --dtype "$dtype" --shape "$shape" \
  ${epi:+--epilogue "$epi"} --precision tf32 --jobs 16 --candidates 20 --refine 0 \
  --agent "python3 $PWD/benches/device/probe_agent.py" --out "${PROBE_OUT:-/tmp/p_$name}" > "$log" 2>&1 \
  || echo "$name failed: $(tail -3 "$log")"
echo "== $name: $(( $(date +%s) - t0 )) s $(grep -h 'compiled' "$log" | tail -1)"
