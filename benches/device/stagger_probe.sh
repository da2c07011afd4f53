#!/usr/bin/env bash
# Probe (issue #10 item 4): are the residual epilogue's lost cycles the burst of every SM reading
# its C tile at once? A build of main with benches/device/stagger_probe.patch delays the first
# epilogue of some CTAs (FACT_PROBE_STAGGER="delay_ns:from:mod"), so their epilogues fall out of
# phase with the rest. On the GPU machine, after `source .device/env.sh`, with $BIN that build:
# each setting in $SETTINGS ("none" is the unpatched behaviour) sweeps the kernels of $PROBE
# (a probe_agent.py JSON list) from one object cache, each into a table of its own under $OUT.
# The kernels keep main's names: never merge these tables anywhere.
set -u
shape=${SHAPE:-65536x768x3072}; dtype=${DTYPE:-f32}; epi=${EPI:-leaves=full;v1=add(v0,l0)}
bin=${BIN:-.device/fact}; tag=${TAG:-$dtype}
export FACT_SHIPPED_TABLE=/tmp/probe_no_shipped.json FACT_CACHE_DIR=${CACHE:-/tmp/stagger-cache}
for s in $SETTINGS; do
  t0=$(date +%s)
  if [ "$s" = none ]; then unset FACT_PROBE_STAGGER; else export FACT_PROBE_STAGGER=$s; fi
  name=${tag}_${s//:/_}
  FACT_PROBE="$PROBE" FACT_TABLE=$OUT/stagger_table_$name.json $bin realize --rule gemm_rcr_bias \
    --dtype $dtype --shape $shape --epilogue "$epi" --precision tf32 --jobs 16 --candidates 20 \
    --refine 0 --agent "python3 $PWD/benches/device/probe_agent.py" --out /tmp/stagger_$name \
    > $OUT/realize_$name.log 2>&1 || echo "$name failed: $(tail -3 $OUT/realize_$name.log)"
  echo "$s: $(( $(date +%s) - t0 )) s"
  python3 benches/device/table_print.py $OUT/stagger_table_$name.json "$s"
done
