# A/B of the shape-arithmetic pass on the GPU machine (repo root, after source .device/env.sh, with
# .device/fact_old built from the commit before it): the tf32 GPT block composed by both builds from
# the shipped table, timed interleaved in one process by host_arithmetic_ab.py.
set -u
export FACT_SHIPPED_TABLE=$PWD/pattern-table/table.json FACT_TABLE=/tmp/ab_table.json FACT_CACHE_DIR=/tmp/fact-cache
python3 - <<'PY'
import sys; sys.path.insert(0, "benches/device")
from pathlib import Path
import epilogue_suite as es
out = Path("/tmp/ab"); (out / "models").mkdir(parents=True, exist_ok=True)
f, s = es.models_by_name()["gpt_block_gelu"]
es.trace(out, "gpt_block_gelu", "tf32", f, s)
PY
m=$(ls /tmp/ab/models/*.pt | grep -v state)
for b in old new; do
  bin=.device/fact; [ $b = old ] && bin=.device/fact_old
  $bin compose $m --input 128x512x768:f32 --precision tf32 --jobs 16 --out /tmp/ab/$b --no-bench 2>&1 | tail -2
done
python3 benches/device/host_arithmetic_ab.py /tmp/ab/old /tmp/ab/new
