#!/usr/bin/env bash
# Probe (issue #10 item 4) on the GPU machine, after `source .device/env.sh`: the ping-pong 128x192 tile
# in four cluster shapes against the shipped winners' tiles, for tf32 and bf16 fc + bias + tanh GELU and
# bf16 out + bias + residual, swept through probe_agent.py into one table, then kernel-level parity
# against cuBLAS from that table (benches/results/parity, eleventh stop).
set -u
# No shipped table: the parity step composes from the probe table alone.
export FACT_SHIPPED_TABLE=/tmp/none.json FACT_TABLE=$OUT/t_pp192.json
pp() { echo "{\"tile\":[128,192,$1],\"cluster\":[$2],\"schedule\":\"ws_pingpong\",\"scheduler\":\"persistent\"}"; }
probe() { PROBE_LOGS=$OUT bash benches/device/probe_specs.sh "$@"; }
G="leaves=;v1=gelu_tanh(v0)"; R="leaves=full;v1=add(v0,l0)"
probe fcg 65536x3072x768 f32 "$G" "[{\"tile\":[128,128,32],\"cluster\":[2,2,1],\"schedule\":\"ws_pingpong\",\"scheduler\":\"persistent\"},$(pp 32 1,1,1),$(pp 32 2,1,1),$(pp 32 1,2,1),$(pp 32 2,2,1)]"
probe fcg16 65536x3072x768 bf16 "$G" "[{\"tile\":[128,128,64],\"cluster\":[1,2,1],\"schedule\":\"ws_pingpong\",\"scheduler\":\"persistent\"},$(pp 64 1,1,1),$(pp 64 2,1,1),$(pp 64 1,2,1),$(pp 64 2,2,1)]"
probe outr16 65536x768x3072 bf16 "$R" "[{\"tile\":[128,256,64],\"cluster\":[1,1,1],\"schedule\":\"ws_cooperative\",\"scheduler\":\"persistent\"},$(pp 64 1,1,1),$(pp 64 2,1,1),$(pp 64 1,2,1),$(pp 64 2,2,1)]"
python3 benches/device/table_print.py $FACT_TABLE pp192
grep -h -i "spill\|error" $OUT/log_*.txt | sort | uniq -c | head -20
COMPOSE_PARALLEL=1 REPEATS=2 bash benches/device/gemm_parity.sh fcg:65536:768:3072:f32:gelu fcg16:65536:768:3072:bf16:gelu outr16:65536:3072:768:bf16:residual
