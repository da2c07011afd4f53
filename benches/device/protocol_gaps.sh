#!/usr/bin/env bash
# On the GPU machine (repo root, after `source .device/env.sh`): the tf32 GPT block (F.gelu) composed
# from the shipped table, then benches/device/protocol_gaps.py on it; JSON in $OUT/protocol_gaps.json.
set -u
export FACT_SHIPPED_TABLE=$PWD/pattern-table/table.json FACT_TABLE=/tmp/gaps_table.json FACT_CACHE_DIR=/tmp/fact-cache
python3 - <<'PY'
import sys; sys.path.insert(0, "benches/device")
from pathlib import Path
import epilogue_suite as es
out = Path("/tmp/gaps"); (out / "models").mkdir(parents=True, exist_ok=True)
f, s = es.models_by_name()["gpt_block_gelu"]
es.trace(out, "gpt_block_gelu", "tf32", f, s)
PY
m=$(ls /tmp/gaps/models/*.pt | grep -v state)
[ -f /tmp/gaps/fact/composed.pt ] || .device/fact compose $m --input 128x512x768:f32 --precision tf32 --jobs 16 --out /tmp/gaps/fact --no-bench 2>&1 | tail -3
python3 benches/device/protocol_gaps.py /tmp/gaps/fact tf32 128x512x768 $OUT/protocol_gaps.json
