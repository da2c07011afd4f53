#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: traces small
# GPT-2 (with and without an attention_mask input), Llama (grouped-query, repeat_kv) and BERT (with
# and without one) in bf16 on the GPU, discovers and composes each, then runs every composed model
# on masks of every class (attention_masks.py run): each case's error against the original and the
# op counters (ran / fell_back / why per attention kernel) land in $OUT/log.txt.
# Needs transformers on the device's python. Until the attnkern branch's kernels (grouped-query,
# key lengths, the six-tensor ABI) are merged, every attention call falls back ("the kernel cannot
# implement ...") and padded or grouped problems get no kernel.
set -uo pipefail
export FACT_CACHE_DIR=/tmp/fact-cache FACT_TABLE=$OUT/user_table.json
bin=$PWD/.device/fact
log=$OUT/log.txt
mkdir -p /tmp/hf /tmp/hf_out
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$log" 2>&1
python3 benches/device/attention_masks.py trace /tmp/hf 2>&1 | grep -v Warning | tee -a "$log"
for m in gpt2 gpt2_mask llama bert bert_mask; do
  echo "== $m" | tee -a "$log"
  "$bin" discover /tmp/hf/$m.pt 2>&1 | grep -E "sdpa|unmatched attention" | tee -a "$log"
  "$bin" compose /tmp/hf/$m.pt --out /tmp/hf_out/$m --candidates 4 --jobs 16 --no-bench \
    --save-report "$OUT/${m}_compose.json" > "$OUT/${m}_compose.txt" 2>&1
  grep -E "sdpa|attention" "$OUT/${m}_compose.txt" | tee -a "$log"
  python3 benches/device/attention_masks.py run /tmp/hf/$m.pt /tmp/hf_out/$m 2>&1 | grep -v Warning | tee -a "$log"
done
true
