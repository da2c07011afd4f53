#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: sibling linears
# (q, k, v over one x) as one GEMM (src/kinds/siblings, `--fuse-siblings`), which no GPU has
# measured yet. The zoo's llama and qwen2 under bf16, composed twice into one user table:
#   $OUT/siblings/plain  without the flag (q, k, v as their own GEMM patterns, as today)
#   $OUT/siblings/fused  with --fuse-siblings and --ablations: in that one process fact's module is
#                        timed as composed and again with FACT_DISABLE=siblings (each group then
#                        runs torch's separate linears, the baseline its table entry was judged on)
# Each zoo call times eager, torch.compile and fact in turns in one process per model; compare
# fused's fact_ms with its siblings ablation (same process) and with plain's fact_ms (same GPU,
# another process). Usage: benches/device/siblings.sh [BUDGET_S (default 1500)]
set -uo pipefail
budget=${1:-1500}
out=${OUT:-/tmp/out}/siblings
mkdir -p "$out"
common=(--policies bf16 --models llama,qwen2 --modes eager,compile,fact --table "$out/user_table.json")
python3 benches/zoo/run.py "$out/plain" "${common[@]}" --budget-s $((budget / 2)) \
  --fact-args "--jobs 16" 2>&1 | tail -n 20
python3 benches/zoo/run.py "$out/fused" "${common[@]}" --budget-s $((budget / 2)) --ablations \
  --fact-args "--jobs 16 --fuse-siblings" 2>&1 | tail -n 20
for d in plain fused; do
  echo "== $d"; ls "$out/$d"/records/*.json 2>/dev/null | while read -r r; do
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r.get("model"), {k: r.get(k) for k in ("eager_ms","compile_ms","fact_ms","fact_ops")}, r.get("ablations"))' "$r"
  done
done
