#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: fact's LayerNorm
# kernels (src/kinds/layernorm/templates/layernorm.cu.hbs) against torch's layer_norm.
#   gpt, gpt_bf16  `fact realize --rule layernorm_affine --shape 65536x768` under f32 and bf16: the
#                  GPT block's LayerNorm (B·T = 128·512 rows of C = 768). Every candidate verified
#                  against fp64 (x = 3 + 10·randn, and rows of their own offsets and scales) and
#                  timed against torch's layer_norm in the same worker (the sweep's baseline); then
#                  layernorm_check.py op on the winner: guards through fact::layernorm (row-strided,
#                  [B,T,C], 1 and 3 rows, no parameters, a mean of 100 against a spread of 1; a
#                  transposed view, a misaligned start, f64 and autograd fall back) and the op, torch
#                  and a plain copy (the read+write floor) timed at the shape.
#   wide           the same for `layernorm --shape 8192x8192` f32 (a row over several warps).
#   model          a model of LayerNorms over C = 1024 (affine, none, the weight alone, and one over
#                  the last two dims that stays torch's) traced at batch 2 and composed at 64x512x1024,
#                  which tunes its three LayerNorm problems; then layernorm_check.py composed: the module against
#                  the original on the GPU, the op calls, both forwards timed.
#   block          the GPT block (F.gelu, tf32) composed at 128x512x768 with the shipped table for its
#                  GEMMs and attention (its two LayerNorms tuned here), then benched with
#                  `--without layernorm`: the block with and without fact's LayerNorms, same run.
# Steps run in that order while the time budget lasts (block needs 240 s: on a cold machine run it
# as a call of its own, `layernorm.sh 560 block`, into the same $OUT: it then finds the gpt step's
# LayerNorm entry in the user table); a rerun on a warm machine finds compiled kernels in
# /tmp/fact-cache.
# Usage: benches/device/layernorm.sh [BUDGET_S (default 560)] [STEP...]   (steps: gpt gpt_bf16 wide model block)
# Logs and JSON under $OUT/layernorm/; the summary is the last lines of the output.
set -uo pipefail
budget=${1:-560}
shift || true
steps=${*:-gpt gpt_bf16 wide model block}
start=$SECONDS
bin=$PWD/.device/fact
export FACT_CACHE_DIR=/tmp/fact-cache FACT_TABLE=$OUT/layernorm/user_table.json FACT_SHIPPED_TABLE=/nonexistent.json
dir=$OUT/layernorm
mkdir -p "$dir"
summary=$dir/summary.txt
: > "$summary"
left() { echo $((budget - (SECONDS - start))); }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  python3 -c 'import torch; print("torch", torch.__version__)'
  "$bin" --version
} > "$dir/device.txt" 2>&1

realize_step() { # NAME RULE DTYPE SHAPE
  local name=$1 rule=$2 dtype=$3 shape=$4 t
  t=$(left)
  if (( t < 90 )); then echo "== $name skipped: ${t}s left" | tee -a "$summary"; return; fi
  echo "== $name: $rule $dtype $shape (${t}s left)" | tee -a "$summary"
  timeout $((t - 10)) "$bin" realize --rule "$rule" --dtype "$dtype" --shape "$shape" --jobs 16 --json \
    --out "$dir/$name" > "$dir/$name.json" 2> "$dir/$name.log"
  echo "   realize rc=$? in $((SECONDS - start))s" | tee -a "$summary"
  python3 - "$dir/$name.json" <<'PY' | tee -a "$summary"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("   no result:", e); sys.exit()
print("   realization:", json.dumps(r.get("realization"))[:300])
e = r.get("entry")
if e:
    run = e["runs"][e["winner_run"]]
    base = run["baseline"]["median_ms"] if run.get("baseline") else None
    print(f"   winner {e['winner']} {e['winner_ms']:.4f} ms, torch layer_norm {base:.4f} ms, torch/winner {base / e['winner_ms']:.2f}")
    for c in run["candidates"]:
        ms = (c.get("timing") or {}).get("median_ms")
        ratio = f"{base / ms:.2f}" if ms and base else "-"
        err = c.get("max_rel_err")
        print(f"    {c['kernel']:30s} {c['status']:16s} err {err if err is None else f'{err:.1e}'} ms {ms if ms is None else f'{ms:.4f}'} torch/this {ratio} {(c.get('error') or c.get('log') or '')[:200]}")
PY
  local sweep winner
  sweep=$(ls -d "$dir/$name"/sweeps/*/ 2>/dev/null | head -1)
  winner=$(python3 -c "import json,sys; e=json.load(open(sys.argv[1])).get('entry'); print(e['winner'] if e else '')" "$dir/$name.json" 2>/dev/null)
  t=$(left)
  if [[ -n "$sweep" && -f "$sweep/libsweep.so" && -n "$winner" ]] && (( t > 30 )); then
    timeout $((t - 5)) python3 benches/device/layernorm_check.py op "$sweep/libsweep.so" "$winner" "$shape" "$dir/$name.check.json" \
      > "$dir/$name.check.log" 2>&1
    echo "   check rc=$?" | tee -a "$summary"
    tail -n 20 "$dir/$name.check.log" | sed 's/^/   /' | tee -a "$summary"
  else
    echo "   nothing to check (sweep ${sweep:-none}, winner ${winner:-none}, ${t}s left)" | tee -a "$summary"
  fi
}

model_step() {
  local t m=$dir/model
  t=$(left)
  if (( t < 120 )); then echo "== model skipped: ${t}s left" | tee -a "$summary"; return; fi
  echo "== model: LayerNorms over C = 1024 composed at 64x512x1024 (${t}s left)" | tee -a "$summary"
  mkdir -p "$m"
  python3 - "$m/model.pt" <<'PY'
import sys, torch
class LayerNorms(torch.nn.Module):
    def __init__(self, c=1024):
        super().__init__()
        self.c = c
        self.ln = torch.nn.LayerNorm(c)
        self.ln_weight = torch.nn.LayerNorm(c, bias=False)
    def forward(self, x):
        c = self.c
        return self.ln(x), torch.nn.functional.layer_norm(x, (c,)), self.ln_weight(x), torch.nn.functional.layer_norm(x, (512, c))
torch.manual_seed(0)
f = LayerNorms()
with torch.no_grad():
    for p in f.parameters():
        p.normal_()
    torch.jit.trace(f.eval(), (torch.randn(2, 512, 1024),)).save(sys.argv[1])
PY
  timeout $((t - 40)) "$bin" compose "$m/model.pt" --input 64x512x1024 --jobs 16 --out "$m/out" --no-bench \
    > "$m/compose.log" 2>&1
  echo "   compose rc=$?" | tee -a "$summary"
  python3 - "$m/out/compose.json" <<'PY' | tee -a "$summary"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("   no report:", e); sys.exit()
for p in r["patterns"]:
    print(f"   {p['id']} {p['rule']:18s} {p['realization']['how']:8s} {p.get('kernel') or '-':30s} kernel {p.get('kernel_ms')} ms, torch {p.get('torch_ms')} ms")
PY
  t=$(left)
  if [[ -f "$m/out/composed.pt" ]] && (( t > 20 )); then
    timeout $((t - 5)) python3 benches/device/layernorm_check.py composed "$m/out" "$m/model.pt" 64x512x1024 "$dir/model.check.json" \
      > "$dir/model.check.log" 2>&1
    echo "   check rc=$?" | tee -a "$summary"
    tail -n 8 "$dir/model.check.log" | sed 's/^/   /' | tee -a "$summary"
  fi
}

block_step() {
  local t b=$dir/block
  t=$(left)
  if (( t < 240 )); then echo "== block skipped: ${t}s left" | tee -a "$summary"; return; fi
  echo "== block: the GPT block, tf32, 128x512x768, shipped table for GEMMs and attention (${t}s left)" | tee -a "$summary"
  mkdir -p "$b"
  python3 - "$b/model.pt" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "benches/device")
import epilogue_suite
out = Path(sys.argv[1]).parent
(out / "models").mkdir(parents=True, exist_ok=True)
factory, shapes = epilogue_suite.models_by_name()["gpt_block_gelu"]
epilogue_suite.trace(out, "gpt_block_gelu", "tf32", factory, shapes)
(out / "models" / f"{epilogue_suite.tag('gpt_block_gelu', 'tf32')}.pt").replace(sys.argv[1])
PY
  FACT_SHIPPED_TABLE=$PWD/pattern-table/table.json timeout $((t - 10)) "$bin" compose "$b/model.pt" --input 128x512x768 \
    --precision tf32 --jobs 16 --out "$b/out" --without layernorm > "$b/compose.log" 2>&1
  echo "   compose + bench rc=$? in $((SECONDS - start))s" | tee -a "$summary"
  python3 - "$b/out" <<'PY' | tee -a "$summary"
import json, sys
d = sys.argv[1]
try:
    c = json.load(open(f"{d}/compose.json"))
    for p in c["patterns"]:
        if p["rule"].startswith("layernorm"):
            print(f"   {p['id']} {p['rule']} {p['realization']['how']} {p.get('kernel')} kernel {p.get('kernel_ms')} ms, torch {p.get('torch_ms')} ms")
    r = json.load(open(f"{d}/report.json"))
except Exception as e:
    print("   no report:", e); sys.exit()
print(f"   block: eager {r['baseline_ms']:.3f} ms, fact {r['fact_ms']:.3f} ms ({r['speedup']:.2f}x), err {r['max_rel_err']:.1e} (torch {r['baseline_rel_err']:.1e})")
for a in r.get("ablations", []):
    print(f"   fact without {a['without']}: {a['ms']:.3f} ms (the LayerNorms' share of the gain: {a['slowdown']:.3f}x)")
print("   op calls:", {k: (v["ran"], v["fell_back"]) for k, v in r.get("op_calls", {}).items() if k.startswith("ln_")})
PY
  cp "$b/out/compose.json" "$dir/block_compose.json" 2>/dev/null
  cp "$b/out/report.json" "$dir/block_report.json" 2>/dev/null
}

for s in $steps; do
  case $s in
    gpt) realize_step gpt layernorm_affine f32 65536x768 ;;
    gpt_bf16) realize_step gpt_bf16 layernorm_affine bf16 65536x768 ;;
    wide) realize_step wide layernorm f32 8192x8192 ;;
    model) model_step ;;
    block) block_step ;;
    *) echo "unknown step $s (gpt gpt_bf16 wide model block)" ;;
  esac
done
echo "== summary ($((SECONDS - start))s)"
cat "$summary"
true
