#!/usr/bin/env bash
# Probe for the residual epilogue's cost (issue #10 item 4) on the GPU machine, after
# `source .device/env.sh`: out + bias + residual (tf32, 65536x768x3072) swept over named kernels
# (benches/device/probe_agent.py) by each fact binary in $BINS, one after another, each with its
# own object cache and table under $OUT. BINS: NAME=BINARY@PROBE_JSON_FILE ...
# The variant binaries are builds of main with benches/device/residual_probe.patch applied and its
# PROBE_ARGS set (the arguments of the rebound Sm90TmaWarpSpecialized), e.g. C 3 deep and D apart:
#   git apply benches/device/residual_probe.patch
#   sed -i 's/PROBE_ARGS/3, StagesD, FragmentSize, false, DelayTmaStore/' templates/sm90_gemm_types.hbs
#   cargo build --release && cp target/release/fact /tmp/fact-noreuse3 && git checkout templates/
# Their kernels keep main's names: never merge their tables anywhere.
set -u
shape=${SHAPE:-65536x768x3072}; dtype=${DTYPE:-f32}; epi=${EPI:-leaves=full;v1=add(v0,l0)}
A="python3 $PWD/benches/device/probe_agent.py"
export FACT_SHIPPED_TABLE=/tmp/probe_no_shipped.json
realize() { # NAME BINARY PROBE_JSON
  FACT_PROBE="$3" FACT_CACHE_DIR=/tmp/probe-cache-$1 FACT_TABLE=$OUT/probe_table_$1.json \
    $2 realize --rule gemm_rcr_bias --dtype $dtype --shape $shape --epilogue "$epi" --precision tf32 \
    --jobs 16 --candidates 20 --refine 0 --agent "$A" --out /tmp/probe_$1
}
for b in $BINS; do
  name=${b%%=*}; rest=${b#*=}; bin=${rest%%@*}; probe=${rest#*@}
  t0=$(date +%s)
  realize $name $bin "$(cat $probe)" > $OUT/realize_$name.log 2>&1 || echo "$name failed: $(tail -3 $OUT/realize_$name.log)"
  echo "$name: $(( $(date +%s) - t0 )) s"
  python3 benches/device/table_print.py $OUT/probe_table_$name.json $name
done
