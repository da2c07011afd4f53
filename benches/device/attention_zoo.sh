#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: the attention
# shapes of the zoo's models through `fact realize`, each candidate of both kernel families verified
# against fp64 (every sequence and every output row; key lengths drawn per sequence with a full, a
# length-1 and a short one) and timed against torch as the graph calls it (SDPA with k/v repeated
# as Hugging Face's repeat_kv does, and its boolean key-padding mask):
#   llama      bf16 causal, grouped-query 16 heads over 4   sdpa_causal         4x16x1024x1024x128x4
#   llama_pad  the same with each sequence's length         sdpa_causal_padded  4x16x1024x1024x128x4
#   bert       bf16 key-padding mask (BERT-base)            sdpa_padded         32x12x512x512x64
#   gpt2       bf16 causal (GPT-2 small)                    sdpa_causal         8x12x1024x1024x64
#   phi        bf16 causal, head dim 80 (Phi-2)             sdpa_causal         4x32x1024x1024x80
#   llama_tf32 fp32 under tf32, grouped-query               sdpa_causal         4x16x1024x1024x128x4
# First every case's kernels compile at once (`realize --compile-only`), so the cases share the
# cores; then the cases run one by one on the GPU from the build cache; last,
# torch's own SDPA at the grouped shape: k/v repeated vs enable_gqa, causal flag vs bool mask.
# Usage: benches/device/attention_zoo.sh [BUDGET_S (default 470)] [CASE...]
# CANDIDATES=N sweeps the first N candidates only (sm90's first); FACT_BIN names the binary.
# Logs, realize JSON and the summary under $OUT/attention_zoo/; the table is the last lines.
set -uo pipefail
budget=${1:-470}
shift || true
cases=${*:-llama llama_pad bert gpt2 phi llama_tf32}
start=$SECONDS
fact=${FACT_BIN:-$PWD/.device/fact}
export FACT_CACHE_DIR=${FACT_CACHE_DIR:-/tmp/fact-cache} FACT_TABLE=$OUT/attention_zoo/user_table.json FACT_SHIPPED_TABLE=/nonexistent.json
dir=$OUT/attention_zoo
mkdir -p "$dir"
summary=$dir/summary.txt
: > "$summary"
left() { echo $((budget - (SECONDS - start))); }

# name -> "rule dtype precision shape"
declare -A spec=(
  [llama]="sdpa_causal bf16 tf32 4x16x1024x1024x128x4"
  [llama_pad]="sdpa_causal_padded bf16 tf32 4x16x1024x1024x128x4"
  [bert]="sdpa_padded bf16 tf32 32x12x512x512x64"
  [gpt2]="sdpa_causal bf16 tf32 8x12x1024x1024x64"
  [phi]="sdpa_causal bf16 tf32 4x32x1024x1024x80"
  [llama_tf32]="sdpa_causal f32 tf32 4x16x1024x1024x128x4"
)
# The realize arguments of case $1 into $args.
case_args() {
  local rule dtype precision shape
  read -r rule dtype precision shape <<< "${spec[$1]}"
  args=(realize --rule "$rule" --dtype "$dtype" --precision "$precision" --shape "$shape" --json
        ${CANDIDATES:+--candidates "$CANDIDATES"})
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$dir/device.txt" 2>&1
echo "== compile: $cases ($(left)s left)" | tee -a "$summary"
pids=()
for c in $cases; do
  [[ -n "${spec[$c]:-}" ]] || { echo "unknown case $c (${!spec[*]})" | tee -a "$summary"; continue; }
  case_args "$c"
  timeout $(( $(left) - 60 )) "$fact" "${args[@]}" --compile-only --jobs 3 --out "$dir/${c}_compile" \
    > "$dir/$c.compile.json" 2> "$dir/$c.compile.log" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
echo "   compiled in $((SECONDS - start))s" | tee -a "$summary"
for c in $cases; do
  [[ -n "${spec[$c]:-}" ]] || continue
  how=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["realization"])' "$dir/$c.compile.json" 2>/dev/null \
    || tail -n 1 "$dir/$c.compile.log")
  echo "   $c: $how" | tee -a "$summary"
done

for c in $cases; do
  [[ -n "${spec[$c]:-}" ]] || continue
  t=$(left)
  if (( t < 30 )); then echo "== $c skipped: ${t}s left" | tee -a "$summary"; continue; fi
  echo "== $c: ${spec[$c]} (${t}s left)" | tee -a "$summary"
  case_args "$c"
  timeout $((t - 10)) "$fact" "${args[@]}" --jobs 16 --out "$dir/$c" > "$dir/$c.json" 2> "$dir/$c.log"
  echo "   realize rc=$? at $((SECONDS - start))s" | tee -a "$summary"
  python3 - "$dir/$c.json" "$c" <<'PY' | tee -a "$summary"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("   no result:", e); sys.exit()
e = r.get("entry")
if not e:
    print("   realization:", json.dumps(r.get("realization"))[:400]); sys.exit()
run = e["runs"][e["winner_run"]]
base = (run.get("baseline") or {}).get("median_ms")
for c in run["candidates"]:
    ms = (c.get("timing") or {}).get("median_ms")
    err = c.get("max_rel_err")
    ratio = f"{base / ms:.2f}" if ms and base else "-"
    print(f"    {c['kernel']:58s} {c['status']:10s} err {'-' if err is None else f'{err:.1e}'} "
          f"ms {'-' if ms is None else f'{ms:.4f}'} torch/this {ratio} {(c.get('error') or c.get('log') or '')[:160]}")
win = next(c for c in run["candidates"] if c["kernel"] == e["winner"])
print(f"ROW {sys.argv[2]:11s} {e['winner']:58s} err {win.get('max_rel_err') or float('nan'):.1e} "
      f"fact {e['winner_ms']:.4f} ms torch {base if base is None else f'{base:.4f}'} ms "
      f"torch/fact {base / e['winner_ms'] if base else float('nan'):.2f}")
PY
done

t=$(left)
if (( t > 20 )); then
  echo "== torch SDPA at the grouped shape (bf16 4x16x1024x1024x128, 4 k/v heads)" | tee -a "$summary"
  timeout $((t - 5)) python3 - <<'PY' 2>&1 | tee -a "$summary"
import torch
torch.manual_seed(0)
B, H, KV, T, D = 4, 16, 4, 1024, 128
q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(B, KV, T, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
rep = lambda x: x[:, :, None].expand(B, KV, H // KV, T, D).reshape(B, H, T, D)
mask = torch.ones(T, T, device="cuda", dtype=torch.bool).tril()[None, None].expand(B, 1, T, T)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
F = torch.nn.functional.scaled_dot_product_attention
def ms(f):
    for _ in range(3): f()
    out = []
    for _ in range(20):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b))
    return sorted(out)[len(out) // 2]
print(f"   repeat_kv + is_causal    {ms(lambda: F(q, rep(k), rep(v), is_causal=True)):.4f} ms")
print(f"   enable_gqa + is_causal   {ms(lambda: F(q, k, v, is_causal=True, enable_gqa=True)):.4f} ms")
print(f"   repeat_kv + bool mask    {ms(lambda: F(q, rep(k), rep(v), attn_mask=mask)):.4f} ms  (HF's call with a mask)")
PY
fi
echo "== table (winner, its error against fp64, fact and torch ms) at $((SECONDS - start))s" | tee -a "$summary"
grep '^ROW' "$summary" | sed 's/^ROW /   /'
true
