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
export FACT_CACHE_DIR=${CACHE:-/tmp/stagger-cache}
for s in $SETTINGS; do
  if [ "$s" = none ]; then unset FACT_PROBE_STAGGER; else export FACT_PROBE_STAGGER=$s; fi
  name=${tag}_${s//:/_}
  FACT_BIN=$bin FACT_TABLE=$OUT/stagger_table_$name.json PROBE_LOG=$OUT/realize_$name.log \
    PROBE_OUT=/tmp/stagger_$name bash benches/device/probe_specs.sh "$name" "$shape" "$dtype" "$epi" "$PROBE"
  python3 benches/device/table_print.py $OUT/stagger_table_$name.json "$s"
done
