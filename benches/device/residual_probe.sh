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
for b in $BINS; do
  name=${b%%=*}; rest=${b#*=}; bin=${rest%%@*}; probe=${rest#*@}
  FACT_BIN=$bin FACT_CACHE_DIR=/tmp/probe-cache-$name FACT_TABLE=$OUT/probe_table_$name.json \
    PROBE_LOG=$OUT/realize_$name.log PROBE_OUT=/tmp/probe_$name \
    bash benches/device/probe_specs.sh "$name" "$shape" "$dtype" "$epi" "$(cat $probe)"
  python3 benches/device/table_print.py $OUT/probe_table_$name.json $name
done
