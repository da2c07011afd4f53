#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: patch
# embeddings as one GEMM (src/kinds/patch, on unless --no-patch-conv). The zoo's vit_b_16, swin_t
# and convnext_tiny under bf16, composed twice into one user table:
#   $OUT/patch/conv   with --no-patch-conv (each patch embedding the convolution kind's)
#   $OUT/patch/patch  as compose does by default, with --ablations: in that one process fact's
#                     module is timed as composed and again with FACT_DISABLE=patch (each patch
#                     embedding then runs torch's convolution, the baseline its table entry was
#                     judged on)
# Each zoo call times eager, torch.compile and fact in turns in one process per model; compare
# patch's fact_ms with its patch ablation (same process) and with conv's fact_ms (same GPU,
# another process). Usage: benches/device/patch.sh [BUDGET_S (default 1500)] [FACT_ARGS]
set -uo pipefail
budget=${1:-1500}
extra=${2:-}
out=${OUT:-/tmp/out}/patch
mkdir -p "$out"
common=(--policies bf16 --models vit_b_16,swin_t,convnext_tiny --modes eager,compile,fact --table "$out/user_table.json")
python3 benches/zoo/run.py "$out/conv" "${common[@]}" --budget-s $((budget / 2)) \
  --fact-args "--jobs 16 --no-patch-conv $extra" 2>&1 | tail -n 20
python3 benches/zoo/run.py "$out/patch" "${common[@]}" --budget-s $((budget / 2)) --ablations \
  --fact-args "--jobs 16 $extra" 2>&1 | tail -n 20
for d in conv patch; do
  echo "== $d"; ls "$out/$d"/records/*.json 2>/dev/null | while read -r r; do
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r.get("model"), {k: r.get(k) for k in ("eager_ms","compile_ms","fact_ms","fact_ops")}, r.get("ablations"))' "$r"
  done
done
