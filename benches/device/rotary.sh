#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh` (device-stage):
# fact's rotary kernels (src/kinds/rotary/rotary.cu.hbs) at the zoo's shapes, bf16.
#   llama   `fact realize --rule rotary_halves_qk --shape 4x16x4x1024x128x128` (B·Hq·Hk·T·D·R)
#   qwen2   `rotary_halves_qk 4x14x2x1024x64x64`
#   pythia  `rotary_halves_qk 8x12x12x512x64x16` (partial: the first 16 of each head of 64)
#   gptj    `rotary_pairs_qk 4x16x16x1024x256x64` (pairs, partial)
#   model   a module of Llama's rotary on q and k (16 and 4 heads of 128, cos and sin from random
#           position ids) and GPT-J's partial pairs on v (4 heads of 256, rotary_dim 64), bf16,
#           traced small and composed at B 4, T 1024 (which tunes its two problems); then the
#           composed module against the original on the GPU (the kernels round as the graph's ops
#           do: the outputs should be equal, bit for bit), the op calls (each kernel ran), and both
#           forwards timed.
# Every candidate is verified against the graph's ops in fp64 and timed against them (the sweep's
# baseline: the traced module's kernels, eager); then, for the winner, the bytes it moves (q and k
# read and written once, cos and sin read once) over its time, against the rate a device copy
# (torch's clone of as many bytes) reaches in the same process, and torch.compile's time for the
# same ops. Targets (issue 32): >= 85% of the copy's rate, >= 1.5x the baseline, >= 1.0x compile.
# Usage: benches/device/rotary.sh [BUDGET_S (default 560)] [STEP...]   (steps: llama qwen2 pythia gptj model)
# Logs and JSON under $OUT/rotary/; the summary is the last lines of the output.
set -uo pipefail
# shellcheck source=benches/device/lib.sh
source "$(dirname "$0")/lib.sh"
bench_init rotary 560 "llama qwen2 pythia gptj model" -- "$@"

step() { # NAME RULE SHAPE
  local name=$1 rule=$2 shape=$3 t
  need_time 60 "$name" || return 0
  realize_run "$name" "$name" "$rule" bf16 "$shape" 10
  t=$(left)
  timeout $((t > 20 ? t - 5 : 15)) python3 - "$dir/$name.json" "$rule" "$shape" <<'PY' 2>&1 | tee -a "$summary"
import json, sys, torch
r = json.load(open(sys.argv[1])) if open(sys.argv[1]).read().strip() else {}
rule, shape = sys.argv[2], [int(d) for d in sys.argv[3].split("x")]
b, hq, hk, t, d, rd = shape
e = r.get("entry")
if not e:
    print("   no entry:", json.dumps(r.get("realization"))[:300]); sys.exit()
run = e["runs"][e["winner_run"]]
base = run["baseline"]["median_ms"] if run.get("baseline") else None
nbytes = (2 * b * (hq + hk) * t * d + 2 * b * t * rd) * 2
gbs = nbytes / (e["winner_ms"] * 1e-3) / 1e9
# The copy's rate: clone of as many bytes, median of 50 after warm-up.
x = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")  # its clone reads and writes nbytes
def timed(fn, n=50):
    for _ in range(5): fn()
    ts = []
    for _ in range(n):
        s, f = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); f.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(f))
    return sorted(ts)[n // 2]
copy_ms = timed(lambda: x.clone())
copy_gbs = nbytes / (copy_ms * 1e-3) / 1e9
# torch.compile of the graph's ops on the same layout.
pairs = "pairs" in rule
def rot(x, cos, sin):
    xr, xp = x[..., :rd], x[..., rd:]
    if pairs:
        r = torch.stack((-xr[..., 1::2], xr[..., ::2]), -1).flatten(-2)
    else:
        r = torch.cat((-xr[..., rd // 2:], xr[..., :rd // 2]), -1)
    y = xr * cos + r * sin
    return y if rd == d else torch.cat((y, xp), -1)
def both(q, k, cos, sin):
    return rot(q, cos, sin), rot(k, cos, sin)
dev = dict(device="cuda", dtype=torch.bfloat16)
q = torch.randn(b, t, hq, d, **dev).transpose(1, 2)
k = torch.randn(b, t, max(hk, 1), d, **dev).transpose(1, 2)
ang = torch.rand(b, 1, t, rd, device="cuda") * 100
cos, sin = ang.cos().bfloat16(), ang.sin().bfloat16()
eager_ms = timed(lambda: both(q, k, cos, sin))
comp = torch.compile(both)
comp_ms = timed(lambda: comp(q, k, cos, sin))
print(f"   winner {e['winner']} {e['winner_ms']:.4f} ms, {gbs:.0f} GB/s = {gbs / copy_gbs:.0%} of a copy's {copy_gbs:.0f} GB/s ({nbytes / 1e6:.1f} MB)")
if base:
    print(f"   graph's ops (sweep baseline) {base:.4f} ms: {base / e['winner_ms']:.2f}x; here eager {eager_ms:.4f} ms, torch.compile {comp_ms:.4f} ms: {comp_ms / e['winner_ms']:.2f}x")
for c in run["candidates"]:
    ms = (c.get("timing") or {}).get("median_ms")
    err = c.get("max_rel_err")
    print(f"    {c['kernel']:44s} {c['status']:12s} err {err if err is None else f'{err:.1e}'} ms {ms if ms is None else f'{ms:.4f}'} {(c.get('error') or c.get('log') or '')[:160]}")
PY
}

model_step() {
  local t m=$dir/model
  need_time 120 model || return 0
  t=$(left)
  echo "== model: rotary on q, k (halves) and v (partial pairs), bf16, composed at B 4, T 1024 (${t}s left)" | tee -a "$summary"
  mkdir -p "$m"
  cat > "$m/rotaries.py" <<'PY'
import torch
def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]), dim=-1)
def rotate_every_two(x):
    return torch.stack((-x[:, :, :, 1::2], x[:, :, :, ::2]), dim=-1).flatten(-2)
class Rotaries(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 128, 2).float() / 128)))
        self.register_buffer("inv_freq64", 1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64)))
    def forward(self, hq, hk, hv, pos):
        b, t, _ = hq.shape
        q = hq.view(b, t, 16, 128).transpose(1, 2)
        k = hk.view(b, t, 4, 128).transpose(1, 2)
        freqs = pos[:, :, None].float() * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(hq.dtype).unsqueeze(1), emb.sin().to(hq.dtype).unsqueeze(1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        v = hv.view(b, t, 4, 256)
        f = pos[:, :, None].float() * self.inv_freq64
        sin64 = torch.repeat_interleave(f.sin().to(hq.dtype)[:, :, None, :], 2, 3)
        cos64 = torch.repeat_interleave(f.cos().to(hq.dtype)[:, :, None, :], 2, 3)
        vr, vp = v[:, :, :, :64], v[:, :, :, 64:]
        vr = vr * cos64 + rotate_every_two(vr) * sin64
        return q, k, torch.cat([vr, vp], dim=-1)
def inputs(b, t, device):
    bf = dict(dtype=torch.bfloat16, device=device)
    return (torch.randn(b, t, 2048, **bf), torch.randn(b, t, 512, **bf), torch.randn(b, t, 1024, **bf),
            torch.randint(0, 8192, (b, t), device=device))
PY
  python3 - "$m" <<'PY'
import sys, torch
sys.path.insert(0, sys.argv[1])
from rotaries import Rotaries, inputs
with torch.no_grad():
    torch.jit.trace(Rotaries().eval(), inputs(1, 16, "cpu")).save(sys.argv[1] + "/model.pt")
PY
  timeout $((t - 40)) "$bin" compose "$m/model.pt" --input 4x1024x2048:bf16 --input 4x1024x512:bf16 \
    --input 4x1024x1024:bf16 --input 4x1024:i64 --jobs 16 --out "$m/out" --no-bench > "$m/compose.log" 2>&1
  echo "   compose rc=$?" | tee -a "$summary"
  t=$(left)
  if [[ -f "$m/out/composed.pt" ]] && (( t > 20 )); then
    timeout $((t - 5)) python3 - "$m" <<'PY' 2>&1 | tee -a "$summary"
import ctypes, json, sys, torch
d = sys.argv[1]
sys.path.insert(0, d)
from rotaries import inputs
for p in json.load(open(f"{d}/out/compose.json"))["patterns"]:
    print(f"   {p['id']} {p['rule']:18s} {p['realization']['how']:8s} {p.get('kernel') or '-':44s} kernel {p.get('kernel_ms')} ms, torch {p.get('torch_ms')} ms")
torch.ops.load_library(f"{d}/out/libfact_ops.so")
so = ctypes.CDLL(f"{d}/out/libfact_ops.so")
so.fact_op_stats.restype = ctypes.c_char_p
m = torch.jit.load(f"{d}/out/composed.pt", map_location="cuda")
orig = torch.jit.load(f"{d}/model.pt", map_location="cuda")
g = str(m.forward.graph)
print("   graph: rotary_qk", g.count("fact::rotary_qk("), "rotary", g.count("fact::rotary("))
x = inputs(4, 1024, "cuda")
with torch.no_grad():
    got, want = m(*x), orig(*x)
for name, a, b in zip("qkv", got, want):
    diff = (a.float() - b.float()).abs().max().item()
    print(f"   {name}: equal to the graph's ops: {torch.equal(a, b)} (max diff {diff:.3g}), strides {a.stride()} vs {b.stride()}")
print("   op calls:", json.loads(so.fact_op_stats()))
def timed(fn, n=50):
    for _ in range(5): fn()
    ts = []
    for _ in range(n):
        s, f = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); f.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(f))
    return sorted(ts)[n // 2]
with torch.no_grad():
    tf, to = timed(lambda: m(*x)), timed(lambda: orig(*x))
print(f"   forward: composed {tf:.4f} ms, traced original {to:.4f} ms ({to / tf:.2f}x)")
PY
  fi
}

for s in $steps; do
  case $s in
    llama) step llama rotary_halves_qk 4x16x4x1024x128x128 ;;
    qwen2) step qwen2 rotary_halves_qk 4x14x2x1024x64x64 ;;
    pythia) step pythia rotary_halves_qk 8x12x12x512x64x16 ;;
    gptj) step gptj rotary_pairs_qk 4x16x16x1024x256x64 ;;
    model) model_step ;;
    *) echo "unknown step $s" | tee -a "$summary" ;;
  esac
done
echo "== summary"; cat "$summary"
