"""Checks and times fact's add + norm kernels (the residual add before an RMSNorm or a LayerNorm,
rules::residual) through their ops on the GPU, in one process.

    python3 benches/device/addnorm_check.py LIB KERNEL[,KERNEL...] RULE ROWSxC OUT_JSON

RULE is the realized rule id (add_[A_B_SUM_]<norm rule>[_sum]); KERNEL a kernel of library LIB
(kind, C and dtypes from its name), checked; further kernels of the library are timed beside it. Through fact::rmsnorm_add[_sum] or fact::layernorm_add[_sum]:
every norm form the kernel takes (its scalars: Llama's cast before the weight, the weight rounded
once, one plus the weight, none, torch's rms_norm; or LayerNorm's weight and bias, the weight alone,
neither), with the sum written and not, on operands as models pass them (rows, a second operand of
one sequence broadcast over a batch as BERT's position embeddings are, rows a stride apart, [B,T,C],
1 and 3 rows): y against fp64 (the norm of the graph's sum, x = 3 + 10·randn) and against the
replaced ops, the sum bit for bit against the graph's add. Calls the kernel cannot take (a
transposed operand, a misaligned start, f64, autograd) must fall back, with their reason, and equal
the replaced ops bit for bit. Then ROWSxC in the rule's form timed: the op; torch's ops eagerly
(the add and the norm); the same module traced (TorchScript's fusers, after its profiling runs);
torch.compile of it; a copy moving as many bytes (the DRAM floor), L2 flushed before each call:
medians of CUDA-event timings around each call, the callables taking turns (what a caller waits),
and medians of the device time of each call's kernels from the profiler (what the GPU spends, with
no host time in it), as ms, GB/s and the share of the copy's rate.
"""
import ctypes
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import flush_buffer, kernel_ms, rel_err, time_interleaved  # noqa: E402
# The RMSNorm forms' replayed ops and fp64 reference, and the timing, as the plain norm's check has them.
from rmsnorm_check import reference as rms_reference, replay as rms_replay  # noqa: E402

dev = "cuda"
torch.manual_seed(0)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
TOL = {"f32": 1e-5, "bf16": 1e-2, "f16": 5e-3}
EPS = 1e-6
RMS_FORMS = {  # form -> the weight's center (None: no weight)
    "rmsnorm_cast_weight": 1.0,
    "rmsnorm_weight": 1.0,
    "rmsnorm_weight1p": 0.0,
    "rmsnorm": None,
    "rms_norm": 1.0,
}
LN_FORMS = {  # form -> (weight, bias)
    "layernorm_affine": (True, True),
    "layernorm_weight": (True, False),
    "layernorm_bias": (False, True),
    "layernorm": (False, False),
}


class Norm(torch.nn.Module):
    """The graph's function: s = a + b (in the sum's dtype), the norm of s as the norm's dtype;
    y, and s where the graph reads it."""

    def __init__(self, kind, form, w, b, sum_dtype, dtype, with_sum):
        super().__init__()
        self.kind, self.form, self.sum_dtype, self.dtype, self.with_sum = kind, form, sum_dtype, dtype, with_sum
        self.w = None if w is None else torch.nn.Parameter(w)
        self.b = None if b is None else torch.nn.Parameter(b)

    def forward(self, a, b):
        s = a.to(self.sum_dtype) + b.to(self.sum_dtype)
        x = s.to(self.dtype)
        if self.kind == "rmsnorm":
            y = rms_replay(x, self.w, self.form)
        else:
            y = torch.nn.functional.layer_norm(x, (x.shape[-1],), self.w, self.b, EPS)
        return (y, s) if self.with_sum else y


def main():
    lib_path, kernels, rule, shape, out_path = sys.argv[1:6]
    # The first kernel is checked; every one is timed beside torch's (other shapes or reads of the
    # same library, compared in one process).
    kernel, *others = kernels.split(",")
    torch.ops.load_library(lib_path)
    lib = ctypes.CDLL(lib_path)
    lib.fact_op_stats.restype = ctypes.c_char_p
    kprefix, dname, c = re.match(r"(rms|ln)_(\w+?)_c(\d+)_", kernel).groups()
    kind = {"rms": "rmsnorm", "ln": "layernorm"}[kprefix]
    dtype, c = DTYPES[dname], int(c)
    m = re.match(r"add_(?:(f32|bf16|f16)_(f32|bf16|f16)_(f32|bf16|f16)_)?(.+?)(_sum)?$", rule)
    da, db, ds = (m.group(1), m.group(2), m.group(3)) if m.group(1) else (dname, dname, dname)
    rule_form, rule_sum = m.group(4), m.group(5) is not None
    ta, tb, ts = DTYPES[da], DTYPES[db], DTYPES[ds]
    rows = int(shape.split("x")[0])
    results = {"kernel": kernel, "rule": rule, "shape": shape, "checks": [], "fallbacks": [], "timings": {}}
    failed = 0

    def stats():
        s = json.loads(lib.fact_op_stats()).get(kernel, {})
        lib.fact_op_stats_reset()
        return s

    def params(form):
        if kind == "rmsnorm":
            center = RMS_FORMS[form]
            w = None if center is None else (torch.randn(c, device=dev) * 0.5 + center).to(dtype)
            return w, None
        on_w, on_b = LN_FORMS[form]
        w = (torch.randn(c, device=dev) * 0.5 + 1).to(dtype) if on_w else None
        b = torch.randn(c, device=dev).to(dtype) if on_b else None
        return w, b

    def call(a, b, w, bias, form, with_sum, kernel=kernel):
        dtypes = f"{ds},{dname}"
        if kind == "rmsnorm":
            op = torch.ops.fact.rmsnorm_add_sum if with_sum else torch.ops.fact.rmsnorm_add
            out = op(a, b, w, repr(EPS), form, dtypes, kernel)
        else:
            op = torch.ops.fact.layernorm_add_sum if with_sum else torch.ops.fact.layernorm_add
            out = op(a, b, [c], w, bias, EPS, dtypes, kernel)
        return out if with_sum else (out, None)

    def graph(a, b, w, bias, form):
        """The replaced ops: the sum, and y."""
        s = a.to(ts) + b.to(ts)
        x = s.to(dtype)
        if kind == "rmsnorm":
            return rms_replay(x, w, form), s
        return torch.nn.functional.layer_norm(x, (c,), w, bias, EPS), s

    def reference(s, w, bias, form):
        x = s.to(dtype)
        if kind == "rmsnorm":
            return rms_reference(x, w, form)
        xd = x.double()
        return torch.nn.functional.layer_norm(
            xd, (c,), None if w is None else w.double(), None if bias is None else bias.double(), EPS)

    operands = {
        "rows": lambda: (torch.randn(rows, c, device=dev) * 10 + 3, torch.randn(rows, c, device=dev) * 2),
        "b one sequence for a batch": lambda: (torch.randn(4, 64, c, device=dev) * 10 + 3,
                                               torch.randn(1, 64, c, device=dev) * 2),
        "strided rows": lambda: ((torch.randn(rows, 2 * c, device=dev) * 10 + 3)[:, :c],
                                 torch.randn(rows, c, device=dev) * 2),
        "[B,T,C]": lambda: (torch.randn(4, 7, c, device=dev) * 10 + 3, torch.randn(4, 7, c, device=dev) * 2),
        "1 row": lambda: (torch.randn(1, c, device=dev) * 10 + 3, torch.randn(1, c, device=dev) * 2),
        "3 rows": lambda: (torch.randn(3, c, device=dev) * 10 + 3, torch.randn(3, c, device=dev) * 2),
    }
    forms = RMS_FORMS if kind == "rmsnorm" else LN_FORMS
    with torch.no_grad():
        for form in forms:
            w, bias = params(form)
            for with_sum in (True, False):
                for what, make in operands.items():
                    a, b = make()
                    a, b = a.to(ta), b.to(tb)
                    y, s = call(a, b, w, bias, form, with_sum)
                    st = stats()
                    gy, gs = graph(a, b, w, bias, form)
                    ref = reference(gs, w, bias, form)
                    err = rel_err(y, ref)
                    torch_err = rel_err(gy, ref)
                    sum_ok = s is None or (s.dtype == gs.dtype and torch.equal(s, gs))
                    ok = st.get("ran") == 1 and err < TOL[dname] and sum_ok and y.shape == gy.shape
                    failed += not ok
                    results["checks"].append({"form": form, "sum": with_sum, "operands": what, "err": err,
                                              "torch_err": torch_err, "sum_exact": sum_ok, "stats": st})
                    print(f"{'ok  ' if ok else 'FAIL'} {form:20s} sum={with_sum!s:5s} {what:27s} err {err:.1e} "
                          f"(torch's ops {torch_err:.1e}) sum exact {sum_ok} {st}")
        form = rule_form
        w, bias = params(form)
        fallbacks = {
            "a transposed operand": lambda: (torch.randn(c, 8, device=dev).to(ta).t(), torch.randn(8, c, device=dev).to(tb)),
            "a misaligned start": lambda: (torch.randn(8 * c + 1, device=dev).to(ta)[1:].view(8, c),
                                           torch.randn(8, c, device=dev).to(tb)),
            "f64 operands": lambda: (torch.randn(8, c, device=dev, dtype=torch.float64),
                                     torch.randn(8, c, device=dev, dtype=torch.float64)),
        }
        for what, make in fallbacks.items():
            a, b = make()
            y, s = call(a, b, w, bias, form, True)
            st = stats()
            gy, gs = graph(a, b, w, bias, form)
            ok = st.get("fell_back") == 1 and torch.equal(y, gy) and torch.equal(s, gs)
            failed += not ok
            results["fallbacks"].append({"operands": what, "stats": st, "ok": ok})
            print(f"{'ok  ' if ok else 'FAIL'} falls back on {what}: {st}")
    a = torch.randn(8, c, device=dev).to(ta).requires_grad_()
    b = torch.randn(8, c, device=dev).to(tb)
    y, s = call(a, b, w, bias, form, True)
    st = stats()
    gy, gs = graph(a.detach(), b, w, bias, form)
    ok = st.get("fell_back") == 1 and torch.equal(y.detach(), gy) and torch.equal(s.detach(), gs)
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} falls back under autograd: {st}")

    # Timings at ROWSxC in the rule's form (the sum written where the rule says).
    size = lambda t: torch.tensor([], dtype=t).element_size()
    per_row = size(ta) + size(tb) + size(dtype) + (size(ts) if rule_sum else 0)
    nparams = sum(p is not None for p in params(form))
    gb = (rows * c * per_row + nparams * c * size(dtype)) / 1e9
    with torch.no_grad():
        a = (torch.randn(rows, c, device=dev) * 10 + 3).to(ta)
        b = (torch.randn(rows, c, device=dev) * 2).to(tb)
        w, bias = params(form)
        module = Norm(kind, form, w, bias, ts, dtype, rule_sum).eval()
        traced = torch.jit.trace(module, (a, b))
        compiled = torch.compile(module)
        # A copy moving as many bytes as the kernel: half of them read, half written.
        src = torch.empty(int(gb * 1e9 / 2) // 16 * 4, dtype=torch.float32, device=dev)
        dst = torch.empty_like(src)
        op_name = f"fact::{kind}_add{'_sum' if rule_sum else ''}"
        runs = {f"{op_name} {k}": (lambda k=k: call(a, b, w, bias, form, rule_sum, k)) for k in [kernel, *others]}
        runs |= {
            "torch eager (the add and the norm's ops)": lambda: module(a, b),
            "traced module (TorchScript)": lambda: traced(a, b),
            "torch.compile": lambda: compiled(a, b),
            "copy of as many bytes (the DRAM floor)": lambda: dst.copy_(src),
        }
        for _ in range(3):
            traced(a, b)  # the profiling executor's runs before it fuses
        # Taking turns within each iteration (CUDA events around each call: what a caller waits),
        # then each call's kernels alone (the profiler's device time: what the GPU spends).
        results["timings"] = time_interleaved(runs, (), flush_buffer(), iterations=50, warmup=10)
        results["kernel_timings"] = kernel_ms(runs, (), flush_buffer())
    stats()
    names = list(runs)
    print(f"timings at {rows}x{c}, {rule} ({gb * 1e3:.1f} MB moved); span: events around the call, "
          "taking turns; kernels: the profiler's device time of its kernels:")
    for what, timings in (("span", results["timings"]), ("kernels", results["kernel_timings"])):
        fact, copy = timings[names[0]], timings[names[-1]]
        for name, ms in timings.items():
            if ms is None or fact is None or copy is None:
                print(f"  {what:7s} {name:52s} -")
                continue
            print(f"  {what:7s} {name:52s} {ms:.4f} ms  {gb / ms * 1e3:6.0f} GB/s  {copy / ms:5.1%} of the copy's "
                  f"rate  {names[0].split()[-1]} is {ms / fact:.2f}x faster")
    results["failed"] = failed
    json.dump(results, open(out_path, "w"), indent=1)
    print("all checks passed" if failed == 0 else f"{failed} checks FAILED")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
