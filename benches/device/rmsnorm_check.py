"""Checks and times fact's RMSNorm kernels through fact::rmsnorm on the GPU, in one process.

    python3 benches/device/rmsnorm_check.py LIB KERNEL ROWSxC OUT_JSON

Guards through the op with kernel KERNEL of library LIB (C and dtype from the kernel's name): each
form (Llama's cast before the weight, the weight rounded once, one plus the weight, no weight,
torch's rms_norm with and without eps) on contiguous rows, rows a stride apart, [B,T,C] and 1 and 3
rows, each against fp64 (x = 3 + 10·randn) with the output poisoned first, and against the
replaced ops themselves; calls the kernel cannot take (a transposed view, a misaligned start, f64,
autograd) must fall back, with their reason, and equal the replaced ops bit for bit. Then ROWSxC
(Llama's form) timed: the op; torch's written-out ops eagerly; the same module traced
(TorchScript's fusers, after its profiling runs); torch.compile of it; a plain copy of x (the
read+write floor): medians of CUDA-event timings with L2 flushed before each, as ms, GB/s (x read,
y written, the weight read) and the share of the copy's rate.
"""
import ctypes
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import flush_buffer, kernel_ms, rel_err, time_interleaved  # noqa: E402

dev = "cuda"
torch.manual_seed(0)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
TOL = {"f32": 1e-5, "bf16": 1e-2, "f16": 5e-3}
EPS = 1e-6


class Llama(torch.nn.Module):
    """LlamaRMSNorm's forward as transformers writes it."""

    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * h.to(dtype)


def replay(x, w, form):
    """What each form's replaced ops compute."""
    if form == "rms_norm":
        return torch.rms_norm(x, (x.shape[-1],), w, EPS)
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    if form == "rmsnorm_cast_weight":
        return w * n.to(x.dtype)
    if form == "rmsnorm_weight":
        return (n * w).to(x.dtype)
    if form == "rmsnorm_weight1p":
        return (n * (w.float() + 1.0)).to(x.dtype)
    return n.to(x.dtype)


def reference(x, w, form):
    xd = x.double()
    n = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS)
    if w is None:
        return n
    return n * (w.double() + 1.0) if form == "rmsnorm_weight1p" else n * w.double()


def median_ms(fn, reps=50):
    """fn's median of `reps` timings, L2 flushed before each (the harness's loop)."""
    return time_interleaved({"ms": fn}, (), flush_buffer(), iterations=reps, warmup=10)["ms"]


def main():
    lib_path, kernel, shape, out_path = sys.argv[1:5]
    torch.ops.load_library(lib_path)
    lib = ctypes.CDLL(lib_path)
    lib.fact_op_stats.restype = ctypes.c_char_p
    dname, c = re.match(r"rms_(\w+?)_c(\d+)_", kernel).groups()
    dtype, c = DTYPES[dname], int(c)
    rows = int(shape.split("x")[0])
    op = torch.ops.fact.rmsnorm
    results = {"kernel": kernel, "shape": shape, "checks": [], "fallbacks": [], "timings": {}}
    failed = 0

    def stats():
        s = json.loads(lib.fact_op_stats()).get(kernel, {})
        lib.fact_op_stats_reset()
        return s

    forms = [("rmsnorm_cast_weight", 1.0), ("rmsnorm_weight", 1.0), ("rmsnorm_weight1p", 0.0), ("rmsnorm", None),
             ("rms_norm", 1.0)]
    xs = {
        "rows": lambda: torch.randn(rows, c, device=dev) * 10 + 3,
        "strided rows": lambda: (torch.randn(rows, 2 * c, device=dev) * 10 + 3)[:, :c],
        "[B,T,C]": lambda: torch.randn(4, 7, c, device=dev) * 10 + 3,
        # Each head of q sliced from a fused qkv output (Qwen3's q_norm): heads c apart, tokens 6c
        # apart, so the rows are not one stride apart: the op copies them into one run first.
        # Made in the dtype before slicing: a cast after it would pack the rows again.
        "heads of a fused qkv": lambda: (torch.randn(4, 7, 6 * c, device=dev) * 10 + 3).to(dtype)[..., : 3 * c].unflatten(-1, (3, c)),
        "1 row": lambda: torch.randn(1, c, device=dev) * 10 + 3,
        "3 rows": lambda: torch.randn(3, c, device=dev) * 10 + 3,
    }
    with torch.no_grad():
        for form, center in forms:
            w = None if center is None else (torch.randn(c, device=dev) * 0.5 + center).to(dtype)
            for what, make in xs.items():
                x = make().to(dtype)
                got = op(x, w, repr(EPS), form, kernel)
                s = stats()
                err = rel_err(got, reference(x, w, form))
                torch_err = rel_err(replay(x, w, form), reference(x, w, form))
                copied = what == "heads of a fused qkv"
                ok = s.get("ran") == 1 and (s.get("copied", 0) == 1) == copied and err < TOL[dname]
                failed += not ok
                results["checks"].append({"form": form, "x": what, "err": err, "torch_err": torch_err, "stats": s})
                print(f"{'ok  ' if ok else 'FAIL'} {form:20s} {what:13s} err {err:.1e} (torch's ops {torch_err:.1e}) {s}")
        w = (torch.randn(c, device=dev) * 0.5 + 1).to(dtype)
        fallbacks = {
            "a transposed view": lambda: (torch.randn(c, 8, device=dev)).to(dtype).t(),
            "a misaligned start": lambda: torch.randn(8 * c + 1, device=dev).to(dtype)[1:].view(8, c),
            "f64": lambda: torch.randn(8, c, device=dev, dtype=torch.float64),
        }
        for what, make in fallbacks.items():
            x = make()
            wx = w.to(x.dtype)
            got = op(x, wx, repr(EPS), "rmsnorm_cast_weight", kernel)
            s = stats()
            ok = s.get("fell_back") == 1 and torch.equal(got, replay(x, wx, "rmsnorm_cast_weight"))
            failed += not ok
            results["fallbacks"].append({"x": what, "stats": s, "ok": ok})
            print(f"{'ok  ' if ok else 'FAIL'} falls back on {what}: {s}")
    xg = torch.randn(8, c, device=dev).to(dtype).requires_grad_()
    got = op(xg, w, repr(EPS), "rmsnorm_cast_weight", kernel)
    s = stats()
    ok = s.get("fell_back") == 1 and torch.equal(got.detach(), replay(xg.detach(), w, "rmsnorm_cast_weight"))
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} falls back under autograd: {s}")

    # Timings at ROWSxC, Llama's form.
    gb = (2 * rows * c + c) * torch.tensor([], dtype=dtype).element_size() / 1e9
    with torch.no_grad():
        x = (torch.randn(rows, c, device=dev) * 10 + 3).to(dtype)
        w = (torch.randn(c, device=dev) * 0.5 + 1).to(dtype)
        module = Llama(w.clone()).eval()
        traced = torch.jit.trace(module, (x,))
        compiled = torch.compile(module)
        y = torch.empty_like(x)
        runs = {
            "fact::rmsnorm": lambda: op(x, w, repr(EPS), "rmsnorm_cast_weight", kernel),
            "torch eager (the written-out ops)": lambda: module(x),
            "traced module (TorchScript)": lambda: traced(x),
            "torch.compile": lambda: compiled(x),
            "copy of x (read + write floor)": lambda: y.copy_(x),
        }
        for _ in range(3):
            traced(x)  # the profiling executor's runs before it fuses
        for name, fn in runs.items():
            results["timings"][name] = median_ms(fn)
        # The kernels' own time: torch.compile's module call spends tens of microseconds of host
        # time at these sizes, which the events above count and its kernel does not.
        results["kernel_timings"] = kernel_ms(runs, (), flush_buffer())
    stats()
    copy = results["timings"]["copy of x (read + write floor)"]
    fact = results["timings"]["fact::rmsnorm"]
    print(f"timings at {rows}x{c} {dname} ({gb * 1e3:.1f} MB moved):")
    kernels = results["kernel_timings"]
    for name, ms in results["timings"].items():
        print(f"  {name:36s} {ms:.4f} ms  {gb / ms * 1e3:6.0f} GB/s  {copy / ms:5.1%} of the copy's rate  fact is {ms / fact:.2f}x faster")
    print("kernel time (profiler, host time left out):")
    for name, ms in kernels.items():
        if ms is None or kernels["fact::rmsnorm"] is None:
            print(f"  {name:36s} -")
            continue
        print(f"  {name:36s} {ms:.4f} ms  fact is {ms / kernels['fact::rmsnorm']:.2f}x faster")
    results["failed"] = failed
    json.dump(results, open(out_path, "w"), indent=1)
    print("all checks passed" if failed == 0 else f"{failed} checks FAILED")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
