#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: patch
# embeddings as one GEMM (src/kinds/patch, `--patch-conv`), which no GPU has measured yet. The
# zoo's vit_b_16, swin_t and convnext_tiny under bf16, composed twice into one user table:
#   $OUT/patch/plain  without the flag (each patch embedding the convolution kind's, as today)
#   $OUT/patch/fused  with --patch-conv and --ablations: in that one process fact's module is
#                     timed as composed and again with FACT_DISABLE=patch (each patch embedding
#                     then runs torch's convolution, the baseline its table entry was judged on)
# Each zoo call times eager, torch.compile and fact in turns in one process per model; compare
# fused's fact_ms with its patch ablation (same process) and with plain's fact_ms (same GPU,
# another process). Usage: benches/device/patch.sh [BUDGET_S (default 1500)]
set -uo pipefail
budget=${1:-1500}
out=${OUT:-/tmp/out}/patch
mkdir -p "$out"
common=(--policies bf16 --models vit_b_16,swin_t,convnext_tiny --modes eager,compile,fact --table "$out/user_table.json")
python3 benches/zoo/run.py "$out/plain" "${common[@]}" --budget-s $((budget / 2)) \
  --fact-args "--jobs 16" 2>&1 | tail -n 20
python3 benches/zoo/run.py "$out/fused" "${common[@]}" --budget-s $((budget / 2)) --ablations \
  --fact-args "--jobs 16 --patch-conv" 2>&1 | tail -n 20
for d in plain fused; do
  echo "== $d"; ls "$out/$d"/records/*.json 2>/dev/null | while read -r r; do
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r.get("model"), {k: r.get(k) for k in ("eager_ms","compile_ms","fact_ms","fact_ops")}, r.get("ablations"))' "$r"
  done
done
