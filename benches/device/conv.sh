#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: fact's
# convolution kernels (src/kinds/conv) against cuDNN, then composed models.
#   realize  `fact realize` at resnet50's B 64 shapes, bf16 and tf32: a 1x1 (256 -> 64 on 56x56),
#            the bottleneck's last 1x1 with the residual add (64 -> 256), a 3x3 stride 1 (64 on
#            56x56), a 3x3 stride 2 (128 on 56x56) and the 7x7 stem (3 channels, which the kernels
#            read padded with zeros to 16-byte rows; the baseline is torch's C = 3 convolution). Each sweep compiles the generator's tiles (--candidates 6),
#            verifies each against fp64 and times it against torch on the same function (the
#            faster of NCHW and channels-last); printed per candidate (status, error, ms) with the
#            ratio to cuDNN's time in NCHW and in channels-last for the folded function, timed
#            here in the same process (conv_baseline.py's forms).
#   depthwise `fact realize` of depthwise convolutions (groups = C = K, CUTLASS's SIMT direct
#            convolution, src/kinds/conv/templates/sm80_dwconv.cu.hbs) at B 32, bf16 and tf32
#            (f32 tensors; the kernel multiplies in fp32): mobilenet_v3's 3x3 stride 1 on 16
#            channels at 112x112 (+ BatchNorm + ReLU) and on 480 at 14x14 (+ hardswish), and
#            convnext_tiny's 7x7 on 96 channels at 56x56 with its bias (--candidates 8: every
#            tile of its channels, compiled for stride 1 and at run-time stride). Printed per
#            candidate against cuDNN in NCHW and channels-last, as realize's.
#   chain    conv_check.py chain: two convolutions with a max pool between, composed; every call
#            runs its kernel, the first converts x to channels-last, the second reads in place.
#   stem     conv_check.py stem: resnet50's stem (7x7 s2 over 3 channels + BatchNorm + ReLU), max
#            pooling and a 1x1 convolution at B 32, bf16, composed with --keep-slower: both run their
#            kernels, the stem's padding x to 8 channels as it converts it, the 1x1 reading in place;
#            error against fp64; traced and fact timed in turns.
#   stem_alone conv_check.py stem_alone: the stem's convolution, BatchNorm and ReLU alone, cuDNN
#            (NCHW) against the one fact::conv call (pad, kernel, output back to NCHW).
#   resnet50 conv_check.py resnet50 at B 32, bf16: composed (--candidates 2, seeded by the realize
#            step's table), every substituted convolution runs its kernel (no fallbacks), error
#            against fp64, the traced module and fact's timed in turns.
# Usage: benches/device/conv.sh [BUDGET_S (default 470)] [STEP...]   (steps: realize depthwise chain stem stem_alone resnet50)
# Logs and JSON under $OUT/conv/; the summary is the last lines of the output. A rerun on a warm
# machine finds compiled kernels in /tmp/fact-cache and the table in $OUT/conv/user_table.json.
set -uo pipefail
# shellcheck source=benches/device/lib.sh
source "$(dirname "$0")/lib.sh"
bench_init conv 470 "realize chain resnet50" 'print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())' -- "$@"

realize_one() { # NAME RULE DTYPE SHAPE [CANDIDATES]
  local name=$1 rule=$2 dtype=$3 shape=$4 candidates=${5:-6}
  need_time 90 "$name $dtype" || return 0
  realize_run "$name-$dtype" "$name" "$rule" "$dtype" "$shape" 60 --candidates "$candidates"
  python3 - "$dir/$name-$dtype.json" "$rule" "$dtype" "$shape" "$dir/$name-$dtype.log" <<'PY' | tee -a "$summary"
import json, re, sys
import torch
import torch.nn.functional as F
sys.path.insert(0, "benches/device")
from harness import flush_buffer, time_interleaved

path, rule, dtype_name, shape, log = sys.argv[1:6]
try:
    r = json.load(open(path))
except Exception as e:
    tail = open(log).read().strip().splitlines()[-3:]
    print("   no result:", e, "|", " / ".join(tail)); sys.exit()
print("   realization:", json.dumps(r.get("realization"))[:300])
e = r.get("entry")
if not e:
    sys.exit()
# cuDNN on the folded function act(conv2d(x, w, b) + residual), NCHW and channels-last.
n, h, w, c, k, kr, ks = (int(d) for d in shape.split("x"))
m = re.match(r"conv2d_s(\d+)_p(\d+)_d(\d+)(?:_g(\d+))?(_bias)?(_add)?(?:_(\w+))?$", rule)
stride, pad, dil, groups = int(m[1]), int(m[2]), int(m[3]), int(m[4] or 1)
dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
torch.backends.cudnn.allow_tf32 = True
dev = "cuda"
x = torch.randn(n, c, h, w, device=dev, dtype=dtype)
wt = torch.randn(k, c // groups, kr, ks, device=dev, dtype=dtype) / (c // groups * kr * ks) ** 0.5
b = torch.randn(k, device=dev, dtype=dtype) if m[5] else None
p, q = (h + 2 * pad - dil * (kr - 1) - 1) // stride + 1, (w + 2 * pad - dil * (ks - 1) - 1) // stride + 1
res = torch.randn(n, k, p, q, device=dev, dtype=dtype) if m[6] else None
act = {None: lambda y: y, "relu": F.relu, "silu": F.silu, "hardswish": F.hardswish, "gelu": F.gelu,
       "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}[m[7]]
cl = torch.channels_last
def fn(x, wt, res):
    y = F.conv2d(x, wt, b, stride, pad, dil, groups)
    return act(y + res if res is not None else y)
xc, wc, rc = x.contiguous(memory_format=cl), wt.contiguous(memory_format=cl), res.contiguous(memory_format=cl) if res is not None else None
with torch.no_grad():
    ms = time_interleaved({"nchw": lambda: fn(x, wt, res), "cl": lambda: fn(xc, wc, rc)}, (), flush_buffer())
run = e["runs"][e["winner_run"]]
base = run["baseline"]["median_ms"] if run.get("baseline") else float("nan")
print(f"   cuDNN here: NCHW {ms['nchw']:.4f} ms, channels-last {ms['cl']:.4f} ms; the sweep's torch baseline {base:.4f} ms")
print(f"   winner {e['winner']} {e['winner_ms']:.4f} ms: {ms['nchw'] / e['winner_ms']:.2f}x cuDNN NCHW, {ms['cl'] / e['winner_ms']:.2f}x cuDNN channels-last")
for cand in run["candidates"]:
    t = (cand.get("timing") or {}).get("median_ms")
    err = cand.get("max_rel_err")
    ratios = f"{ms['nchw'] / t:.2f}x NCHW {ms['cl'] / t:.2f}x CL" if t else "-"
    print(f"    {cand['kernel']:70s} {cand['status']:16s} err {err if err is None else f'{err:.1e}'} "
          f"ms {t if t is None else f'{t:.4f}'} {ratios} {(cand.get('error') or cand.get('log') or '')[:160]}")
PY
}

realize_step() {
  local dt
  for dt in bf16 f32; do
    realize_one r50_1x1 conv2d_s1_p0_d1_bias_relu $dt 64x56x56x256x64x1x1
    realize_one r50_1x1_add conv2d_s1_p0_d1_bias_add_relu $dt 64x56x56x64x256x1x1
    realize_one r50_3x3 conv2d_s1_p1_d1_bias_relu $dt 64x56x56x64x64x3x3
    realize_one r50_3x3_s2 conv2d_s2_p1_d1_bias_relu $dt 64x56x56x128x128x3x3
    realize_one r50_stem conv2d_s2_p3_d1_bias_relu $dt 64x224x224x3x64x7x7
  done
}

depthwise_step() {
  local dt
  for dt in bf16 f32; do
    realize_one mnv3_dw3x3_c16 conv2d_s1_p1_d1_g16_bias_relu $dt 32x112x112x16x16x3x3 8
    realize_one mnv3_dw3x3_c480 conv2d_s1_p1_d1_g480_bias_hardswish $dt 32x14x14x480x480x3x3 8
    realize_one convnext_dw7x7 conv2d_s1_p3_d1_g96_bias $dt 32x56x56x96x96x7x7 8
  done
}

check_step() { # STEP POLICY FACT_ARGS...
  local step=$1 policy=$2 t
  shift 2
  need_time 120 "$step $policy" || return 0
  t=$(left)
  echo "== $step $policy (${t}s left)" | tee -a "$summary"
  timeout $((t - 10)) python3 benches/device/conv_check.py "$bin" "$dir" "$step" "$policy" "$@" \
    > "$dir/check_${step}_${policy}.log" 2>&1
  echo "   rc=$? in $((SECONDS - start))s" | tee -a "$summary"
  tail -n 30 "$dir/check_${step}_${policy}.log" | sed 's/^/   /' | tee -a "$summary"
}

for s in $steps; do
  case $s in
    realize) realize_step ;;
    depthwise) depthwise_step ;;
    chain) check_step chain bf16 --candidates 2 --jobs 16 ;;
    stem) check_step stem bf16 --candidates 4 --jobs 16 --keep-slower ;;
    stem_alone) check_step stem_alone bf16 --candidates 4 --jobs 16 --keep-slower ;;
    resnet50) check_step resnet50 bf16 --candidates 2 --jobs 16 ;;
    *) echo "unknown step $s (realize depthwise chain stem stem_alone resnet50)" ;;
  esac
done
bench_done
