"""Checks and times fact's gated-MLP kernels through fact::glu on the GPU, in one process, beside
torch's own forms of the same function.

    python3 benches/device/glu_check.py LIB MxIxK ACT OUT_JSON KERNEL...
        LIB is a sweep library (`fact realize --rule glu_<act>` leaves it in sweeps/*/libsweep.so),
        KERNEL its GLU kernels (fused and split), bf16; those not in LIB (another round's) are
        skipped. For each kernel: act(x.Wg^T) * (x.Wu^T)
        through fact::glu on x [M,K] and weights [I,K] (gate twice up's scale) against fp64,
        then calls it cannot take (a strided x, a view of a wider tensor; autograd)
        must fall back with their reason and equal torch's ops. Then M x I x K timed, medians of
        CUDA-event timings with L2 flushed before each: every kernel through the op; torch eager (two
        linears, the activation, the mul: what the traced graph runs); torch eager on the
        concatenated weight (one GEMM, then the elementwise); torch.compile (default) and
        torch.compile(mode="max-autotune-no-cudagraphs") of the same function, the last (its
        autotuning takes minutes; the default's ratio is printed before it). Prints the ratios the
        issue's target reads (torch.compile / fact's best: >= 1.1 wanted).
"""
import ctypes
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import flush_buffer, kernel_ms  # noqa: E402

dev = "cuda"
torch.manual_seed(0)
lib_path, shape, act, out_path = sys.argv[1:5]
kernels = sys.argv[5:]
m, inter, k = (int(d) for d in shape.split("x"))
dtype = torch.bfloat16
torch.ops.load_library(lib_path)
lib = ctypes.CDLL(lib_path)
lib.fact_op_stats.restype = ctypes.c_char_p


def activation(g):
    if act == "silu":
        return torch.nn.functional.silu(g)
    return torch.nn.functional.gelu(g, approximate="tanh" if act == "gelu_tanh" else "none")


def glu(x, wg, wu):
    return activation(torch.nn.functional.linear(x, wg)) * torch.nn.functional.linear(x, wu)


def interleave(g, u):
    blocks = [g.shape[0] // 8, 1, 8] + list(g.shape[1:])
    return torch.cat([g.reshape(blocks), u.reshape(blocks)], 1).reshape([2 * g.shape[0]] + list(g.shape[1:])).contiguous()


def median_ms(fn, reps=30):
    flush = torch.empty(64 << 20, dtype=torch.float32, device=dev)
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


scale = k ** -0.5
x = torch.randn(m, k, device=dev).to(dtype)
wg = (torch.randn(inter, k, device=dev) * scale * 2).to(dtype)
wu = (torch.randn(inter, k, device=dev) * scale).to(dtype)
w = interleave(wg, wu)
ref = glu(x.double(), wg.double(), wu.double())
torch_err = rel_err(glu(x, wg, wu), ref)


def call(kernel, x_, grad=False):
    lib.fact_op_stats_reset()
    with torch.set_grad_enabled(grad):
        y = torch.ops.fact.glu(x_, wg, None, wu, None, w, None, act, kernel)
    return y, json.loads(lib.fact_op_stats()).get(kernel, {})


report = {"shape": shape, "act": act, "torch_rel_err": torch_err, "kernels": {}}
for kernel in kernels:
    r = {}
    y, stats = call(kernel, x)
    if stats.get("why") == "no op library loaded in this process has the kernel":
        continue
    r["rel_err"] = rel_err(y, ref)
    r["ran"] = stats.get("ran", 0) > 0
    r["why"] = stats.get("why", "")
    wide = torch.randn(m, k + 8, device=dev).to(dtype)
    strided = wide[:, :k]
    y2, s2 = call(kernel, strided)
    r["strided_falls_back"] = s2.get("fell_back", 0) == 1 and torch.equal(y2, glu(strided, wg, wu))
    xg = x.clone().requires_grad_()
    y3, s3 = call(kernel, xg, grad=True)
    r["autograd_falls_back"] = s3.get("fell_back", 0) == 1 and y3.requires_grad
    r["ms"] = median_ms(lambda: torch.ops.fact.glu(x, wg, None, wu, None, w, None, act, kernel)) if r["ran"] else None
    report["kernels"][kernel] = r
    print(f"{kernel:80s} ran {r['ran']} err {r['rel_err']:.2e} ms {r['ms']} falls back: strided {r['strided_falls_back']} autograd {r['autograd_falls_back']} {r['why']}")

w_cat = torch.cat([wg, wu])


def concatenated(x, w_cat):
    h = torch.nn.functional.linear(x, w_cat)
    return activation(h[:, :inter]) * h[:, inter:]


def best_line(timings):
    ran = {kn: r["ms"] for kn, r in report["kernels"].items() if r["ms"] is not None and r["rel_err"] < 2e-2}
    if not ran:
        return
    best = min(ran, key=ran.get)
    report["best"] = best
    line = f"best {best} {ran[best]:.4f} ms; torch eager / fact {timings['torch_eager'] / ran[best]:.2f}, " \
           f"torch.compile / fact {timings['torch_compile'] / ran[best]:.2f} (target >= 1.1)"
    if "torch_compile_max_autotune" in timings:
        line += f", max-autotune / fact {timings['torch_compile_max_autotune'] / ran[best]:.2f}"
    print(line, flush=True)


with torch.no_grad():
    timings = {
        "torch_eager": median_ms(lambda: glu(x, wg, wu)),
        "torch_eager_concatenated": median_ms(lambda: concatenated(x, w_cat)),
    }
    compiled = torch.compile(glu)
    timings["torch_compile"] = median_ms(lambda: compiled(x, wg, wu))
    timings["torch_compile_rel_err"] = rel_err(compiled(x, wg, wu), ref)
    report["timings"] = timings
    print(json.dumps(timings), flush=True)
    best_line(timings)
    # The kernels' own time (profiler): CUDA events around a compiled function's call also count
    # its host time (tens of microseconds), which its kernels do not spend.
    if report.get("best"):
        best = report["best"]
        kt = kernel_ms({
            "fact": lambda: torch.ops.fact.glu(x, wg, None, wu, None, w, None, act, best),
            "torch_compile": lambda: compiled(x, wg, wu),
            "torch_eager": lambda: glu(x, wg, wu),
        }, (), flush_buffer())
        timings["kernel_ms"] = kt
        if kt["fact"] and kt["torch_compile"]:
            print(f"kernel time: fact {kt['fact']:.4f} ms, torch.compile {kt['torch_compile']:.4f} ms; "
                  f"torch.compile / fact {kt['torch_compile'] / kt['fact']:.2f} (target >= 1.1)", flush=True)
    json.dump(report, open(out_path, "w"), indent=1)
    tuned = torch.compile(glu, mode="max-autotune-no-cudagraphs")
    timings["torch_compile_max_autotune"] = median_ms(lambda: tuned(x, wg, wu))
    print(json.dumps(timings), flush=True)
    best_line(timings)
json.dump(report, open(out_path, "w"), indent=1)
