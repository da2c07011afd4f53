"""Checks composed convolutions on the GPU: counters, conversions, errors against fp64, times.

    python3 benches/device/conv_check.py FACT_BIN OUT_DIR STEP [POLICY] [FACT_ARGS...]

STEP `chain`: a two-convolution chain (conv 3x3 + BatchNorm + ReLU, max pooling, conv 1x1 +
BatchNorm + ReLU, a pooled linear head), B 32, 64 channels, 56x56, traced on the GPU in POLICY
(bf16 or tf32: fp32 tensors, TF32 allowed), composed with `fact compose` (FACT_ARGS added, e.g.
`--candidates 2 --jobs 16`), run: every convolution through its kernel (the op's counters: ran,
none fell back), the first converting x to channels-last (copied 1 a call) and the second reading
the first's output in place through the pool (copied 0), the output against the original in
fp64.
STEP `stem`: resnet50's stem (conv 7x7 stride 2 over the image's 3 channels + BatchNorm + ReLU, max
pooling) and the first 1x1 convolution after it (+ BatchNorm + ReLU), pooled and flattened, B 32,
224x224, composed the same way (pass `--keep-slower`, so the padded stem runs its kernel even where
its sweep found cuDNN faster; the pattern lines say which was): both convolutions run their kernels,
the stem's padding x's 3 channels to 16-byte rows as it converts it (copied 1 a call), the 1x1
reading the stem's output in place through the pool (copied 0); the error against fp64; the traced
module and the composed one timed in turns.
STEP `stem_alone`: the stem's convolution, BatchNorm and ReLU alone (its output the graph's, so the
op hands it back NCHW), composed the same way: torch (cuDNN on NCHW, as the model runs) against one
`fact::conv` call that pads and converts x, runs the kernel and converts the output back (copied 1).
STEP `resnet50`: torchvision's resnet50 at B 32 the same way: every substituted convolution runs
its kernel (fell_back 0), the output against the original in fp64, and the traced module and the
composed one timed in turns (medians of CUDA-event timings, L2 flushed before each).
Writes OUT_DIR/conv_check_STEP_POLICY.json; the summary is the last lines.
"""
import ctypes
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import flush_buffer, log, rel_err, time_interleaved, write_json  # noqa: E402

fact_bin, out_dir, step = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
policy = sys.argv[4] if len(sys.argv) > 4 else "bf16"
fact_args = sys.argv[5:]
dev = "cuda"
dtype = torch.bfloat16 if policy == "bf16" else torch.float32
torch.backends.cuda.matmul.allow_tf32 = policy == "tf32"
torch.backends.cudnn.allow_tf32 = policy == "tf32"
torch.manual_seed(0)
out_dir.mkdir(parents=True, exist_ok=True)


class Chain(torch.nn.Module):
    def __init__(self, c=64):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.c2, self.b2 = torch.nn.Conv2d(c, 2 * c, 1, bias=False), torch.nn.BatchNorm2d(2 * c)
        self.fc = torch.nn.Linear(2 * c, 16)
        for bn in (self.b1, self.b2):
            bn.running_mean.normal_(0, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.normal_(1, 0.2)
            bn.bias.data.normal_(0, 0.2)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = F.max_pool2d(y, 3, 2, 1)
        y = F.relu(self.b2(self.c2(y)))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


class Stem(torch.nn.Module):
    def __init__(self, c=64):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(3, c, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(c)
        self.c2, self.b2 = torch.nn.Conv2d(c, c, 1, bias=False), torch.nn.BatchNorm2d(c)
        for bn in (self.bn1, self.b2):
            bn.running_mean.normal_(0, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.normal_(1, 0.2)
            bn.bias.data.normal_(0, 0.2)

    def stem(self, x):
        return F.relu(self.bn1(self.conv1(x)))

    def forward(self, x):
        y = F.max_pool2d(self.stem(x), 3, 2, 1)
        y = F.relu(self.b2(self.c2(y)))
        return F.adaptive_avg_pool2d(y, 1).flatten(1)


class StemOnly(Stem):
    """The stem's convolution, BatchNorm and ReLU alone (its output NCHW, the graph's)."""

    def forward(self, x):
        return self.stem(x)


def model(name):
    if name == "chain":
        return Chain(), torch.randn(32, 64, 56, 56)
    if name == "stem":
        return Stem(), torch.randn(32, 3, 224, 224)
    if name == "stem_alone":
        return StemOnly(), torch.randn(32, 3, 224, 224)
    import torchvision

    return torchvision.models.resnet50(), torch.randn(32, 3, 224, 224)


def compose(traced_path, fact_dir):
    cmd = [fact_bin, "compose", str(traced_path), "--out", str(fact_dir), "--no-bench", "--json"]
    if policy == "tf32":
        cmd += ["--precision", "tf32"]
    cmd += fact_args
    log(" ".join(cmd))
    with open(out_dir / f"compose_{step}_{policy}.log", "w") as err:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    if out.returncode != 0:
        raise SystemExit(f"fact compose failed ({out.returncode}): see {out_dir}/compose_{step}_{policy}.log")
    return json.loads(out.stdout)


def main():
    m, x = model(step)
    m = m.eval().to(dev, dtype)
    x = x.to(dev, dtype)
    path = out_dir / f"{step}_{policy}.pt"
    with torch.no_grad():
        traced = torch.jit.trace(m, (x,))
    traced.save(str(path))
    fact_dir = out_dir / f"fact_{step}_{policy}"
    report = compose(path, fact_dir)["compose"]
    convs = [p for p in report["patterns"] if p.get("kind") == "conv"]
    kept = [p for p in convs if p.get("kernel")]
    for p in convs:
        how, q = p["realization"], p["problem"]
        shape = "x".join(str(q[k]) for k in ("images", "height", "width", "in_channels", "out_channels"))
        shape += "x{}x{}".format(*q["filter"])
        log(f"  {p['id']:4s} {p['rule']:34s} {shape:24s} {how['how']:8s} {p.get('kernel') or '-'} "
            f"{p.get('kernel_ms') or float('nan'):.4f} ms, torch {p.get('torch_ms') or float('nan'):.4f} ms {how.get('reason', '')[:120]}")
    lib_path = report.get("library")
    if not lib_path:
        log(f"{step} {policy}: fact substituted nothing ({len(convs)} conv patterns)")
        write_json(out_dir / f"conv_check_{step}_{policy}.json", {"step": step, "policy": policy, "patterns": convs})
        return
    torch.ops.load_library(lib_path)
    lib = ctypes.CDLL(lib_path)
    lib.fact_op_stats.restype = ctypes.c_char_p
    composed = torch.jit.load(report["composed"], map_location=dev)
    ref_model = torch.jit.load(str(path), map_location=dev).double()
    with torch.no_grad():
        ref = ref_model(x.double())
        lib.fact_op_stats_reset()
        got = composed(x)
        torch.cuda.synchronize()
        stats = json.loads(lib.fact_op_stats())
        eager = traced(x)
    err, err_torch = rel_err(got, ref), rel_err(eager, ref)
    conv_kernels = {p["kernel"] for p in kept}
    conv_stats = {k: v for k, v in stats.items() if k in conv_kernels}
    ran = sum(c["ran"] for c in conv_stats.values())
    fell = sum(c["fell_back"] for c in conv_stats.values())
    copied = sum(c["copied"] for c in conv_stats.values())
    for k, c in sorted(conv_stats.items()):
        log(f"  {k:70s} ran {c['ran']:3d} copied {c['copied']:3d} fell_back {c['fell_back']:3d} {c.get('why', '')}")
    ok = fell == 0 and ran == len(kept) and all(k in stats for k in conv_kernels)
    if step in ("stem", "stem_alone"):
        # Every convolution through its kernel, the stem's among them (its problem keeps C = 3).
        ok = ok and len(kept) == len(convs) == (2 if step == "stem" else 1)
        ok = ok and kept[0]["problem"]["in_channels"] == 3
    if step == "stem_alone" and len(kept) == 1:
        ok = ok and stats[kept[0]["kernel"]]["copied"] == 1
        log(f"  conversions: {stats[kept[0]['kernel']]['copied']} (want 1: x padded and converted, the output back)")
    if step in ("chain", "stem") and len(kept) == 2:
        first, second = kept[0]["kernel"], kept[1]["kernel"]
        # Two kernels, or one kernel serving both calls.
        if first != second:
            ok = ok and stats[first]["copied"] == 1 and stats[second]["copied"] == 0
            log(f"  conversions: first convolution copied {stats[first]['copied']}, second {stats[second]['copied']} (want 1 and 0)")
        else:
            ok = ok and stats[first]["copied"] == 1
            log(f"  conversions: {stats[first]['copied']} over both calls of one kernel (want 1)")
    flush = flush_buffer()
    with torch.no_grad():
        ms = time_interleaved({"traced": lambda t: traced(t), "fact": lambda t: composed(t)}, (x,), flush)
    record = {
        "step": step,
        "policy": policy,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "patterns": convs,
        "op_stats": stats,
        "rel_err": err,
        "rel_err_torch": err_torch,
        "ms": ms,
        "ok": ok,
    }
    write_json(out_dir / f"conv_check_{step}_{policy}.json", record)
    log(
        f"{step} {policy} on {record['device']}: {len(kept)}/{len(convs)} convolutions substituted, {ran} kernel calls, "
        f"{fell} fallbacks, {copied} conversions; error vs fp64 {err:.2e} (torch {err_torch:.2e}); "
        f"traced {ms['traced']:.3f} ms, fact {ms['fact']:.3f} ms ({ms['traced'] / ms['fact']:.2f}x); "
        f"{'OK' if ok else 'NOT OK'}"
    )


main()
