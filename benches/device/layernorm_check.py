"""Checks and times fact's LayerNorm kernels through fact::layernorm on the GPU, in one process.

    python3 benches/device/layernorm_check.py op LIB KERNEL ROWSxC OUT_JSON
        guards through the op with kernel KERNEL of library LIB (C and dtype from the kernel's name):
        contiguous rows, rows a stride apart, [B,T,C], 1 and 3 rows, no weight or bias, a mean of 100
        against a spread of 1 (where E[x^2] - mean^2 in fp32 loses three digits; there the tolerance
        is fp32's mean rounding, 1e-4, and torch's own error is printed beside), each against fp64
        with the output's memory poisoned first; calls the kernel cannot take (a transposed view, a
        misaligned start, f64, autograd) must fall back, with their reason, and equal torch's
        layer_norm. Then ROWSxC timed: the op, torch's layer_norm and a plain copy
        (the read+write floor), medians of CUDA-event timings with L2 flushed before each.
    python3 benches/device/layernorm_check.py composed OUT_DIR MODEL INPUT OUT_JSON
        the composed module of a compose folder against the original MODEL on the GPU at INPUT
        (e.g. 64x512x1024), with the op calls (which kernels ran).
"""
import ctypes
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import flush_buffer, rel_err, time_interleaved  # noqa: E402

mode = sys.argv[1]
dev = "cuda"
torch.manual_seed(0)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
TOL = {"f32": 1e-5, "bf16": 1e-2, "f16": 5e-3}


def load(path):
    torch.ops.load_library(path)
    lib = ctypes.CDLL(path)
    lib.fact_op_stats.restype = ctypes.c_char_p
    return lib


def median_ms(fn, reps=30):
    """fn's median of `reps` timings, L2 flushed before each (the harness's loop)."""
    return time_interleaved({"ms": fn}, (), flush_buffer(), iterations=reps, warmup=5)["ms"]


def op_checks(lib_path, kernel, shape, out_path):
    lib = load(lib_path)
    dname, c = re.match(r"ln_(\w+?)_c(\d+)_", kernel).groups()
    c, dtype, tol = int(c), DTYPES[dname], TOL[dname]
    rows = int(shape.split("x")[0])

    def x_of(*lead, scale=10.0, offset=3.0):
        return (torch.randn(*lead, c, device=dev) * scale + offset).to(dtype)

    w = (torch.randn(c, device=dev) * 0.5 + 1).to(dtype)
    b = (torch.randn(c, device=dev) * 0.5).to(dtype)

    def call(x, weight, bias):
        # Poison the block the output will get from the caching allocator.
        poison = torch.full(x.shape, float("nan"), dtype=x.dtype, device=dev)
        del poison
        lib.fact_op_stats_reset()
        y = torch.ops.fact.layernorm(x, [c], weight, bias, 1e-5, kernel)
        torch.cuda.synchronize()
        return y, json.loads(lib.fact_op_stats()).get(kernel, {})

    def ref(x, weight, bias):
        up = lambda t: None if t is None else t.double()
        return torch.nn.functional.layer_norm(x.double(), [c], up(weight), up(bias), 1e-5)

    cases = []
    base = torch.randn(256, c + 16, device=dev).mul(10).add(3).to(dtype)
    flat = x_of(257).reshape(-1)
    # (case, x, weight, bias, whether the kernel must run, tolerance)
    runs = [
        ("contiguous", x_of(4096), w, b, True),
        ("rows a stride apart", base[:, :c], w, b, True),
        ("[B,T,C]", x_of(8, 64), w, b, True),
        ("one row", x_of(1), w, b, True),
        ("three rows", x_of(3), w, b, True),
        ("no weight or bias", x_of(512), None, None, True),
        ("weight alone", x_of(512), w, None, True),
        ("bias alone", x_of(512), None, b, True),
        ("offset 100, spread 1", x_of(512, scale=1.0, offset=100.0), w, b, True, max(tol, 1e-4)),
        ("a transposed view", x_of(64, 8).transpose(0, 1), w, b, False),
        ("a misaligned start", flat[1 : 1 + 256 * c].view(256, c), w, b, False),
        ("f64", x_of(64).to(torch.float64), None, None, False),
    ]
    for name, x, weight, bias, want_ran, *case_tol in runs:
        y, stats = call(x, weight, bias)
        r = ref(x, weight, bias)
        err = rel_err(y, r)
        ran = stats.get("ran", 0) > 0
        torch_y = torch.nn.functional.layer_norm(x, [c], weight, bias, 1e-5)
        ok = err <= (case_tol or [tol])[0] if ran else torch.equal(y, torch_y)
        cases.append({"case": name, "ran": ran, "want_ran": want_ran, "why": stats.get("why", ""), "rel_err": err,
                      "torch_rel_err": rel_err(torch_y, r), "ok": ok and ran == want_ran})
    # Autograd keeps torch's op.
    x = x_of(64).requires_grad_()
    with torch.enable_grad():
        y, stats = call(x, w, b)
    cases.append({"case": "autograd", "ran": stats.get("ran", 0) > 0, "want_ran": False, "why": stats.get("why", ""), "rel_err": 0.0,
                  "torch_rel_err": 0.0, "ok": stats.get("ran", 0) == 0 and y.requires_grad})
    bad = [k for k in cases if not k["ok"]]
    print(f"{kernel}: {len(cases)} guards, {sum(k['ran'] for k in cases)} ran the kernel, {len(bad)} wrong")
    for k in cases:
        print(f"   {'ok   ' if k['ok'] else 'WRONG'} {k['case']:24s} {'ran' if k['ran'] else 'fell back':10s} "
              f"err {k['rel_err']:.1e} (torch {k['torch_rel_err']:.1e}) {k['why']}")

    x = x_of(rows)
    timings = {
        "fact": median_ms(lambda: torch.ops.fact.layernorm(x, [c], w, b, 1e-5, kernel)),
        "torch": median_ms(lambda: torch.nn.functional.layer_norm(x, [c], w, b, 1e-5)),
        "copy": median_ms(lambda: x.clone()),
    }
    lib.fact_op_stats_reset()
    torch.ops.fact.layernorm(x, [c], w, b, 1e-5, kernel)
    ran = json.loads(lib.fact_op_stats()).get(kernel, {}).get("ran", 0) > 0
    print(f"   {shape} {dname}: fact {timings['fact']:.4f} ms ({'kernel' if ran else 'FELL BACK'}), torch {timings['torch']:.4f} ms, "
          f"copy {timings['copy']:.4f} ms; torch/fact {timings['torch'] / timings['fact']:.2f}, copy/fact {timings['copy'] / timings['fact']:.2f}")
    json.dump({"kernel": kernel, "shape": shape, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "checks": cases, "timings_ms": timings, "timed_ran_kernel": ran}, open(out_path, "w"), indent=1)


def composed(out_dir, model, shape, out_path):
    lib = load(f"{out_dir}/libfact_ops.so")
    m = torch.jit.load(f"{out_dir}/composed.pt", map_location=dev)
    o = torch.jit.load(model, map_location=dev)
    # A copy of its own for fp64: the executor specializes a module to the dtypes of its first runs.
    o64 = torch.jit.load(model, map_location=dev).double()
    graph = str(m.forward.graph)
    x = torch.randn(*map(int, shape.split("x")), device=dev) * 10 + 3
    with torch.no_grad():
        lib.fact_op_stats_reset()
        got = m(x)
        torch.cuda.synchronize()
        calls = json.loads(lib.fact_op_stats())
        want = o(x)
        ref = o64(x.double())
    errs = [rel_err(g, r) for g, r in zip(got, ref)]
    base = [rel_err(w, r) for w, r in zip(want, ref)]
    print(f"composed: {graph.count('fact::layernorm(')} fact::layernorm, {graph.count('aten::layer_norm(')} aten::layer_norm in the graph")
    print(f"   op calls: {calls}")
    print(f"   composed vs fp64: {['%.1e' % e for e in errs]}; torch vs fp64: {['%.1e' % e for e in base]}")
    with torch.no_grad():
        t_fact = median_ms(lambda: m(x))
        t_orig = median_ms(lambda: o(x))
    print(f"   forward at {shape}: composed {t_fact:.4f} ms, original {t_orig:.4f} ms, original/composed {t_orig / t_fact:.2f}")
    json.dump({"shape": shape, "device": torch.cuda.get_device_name(), "torch": torch.__version__, "op_calls": calls,
               "rel_err": errs, "torch_rel_err": base, "composed_ms": t_fact, "original_ms": t_orig}, open(out_path, "w"), indent=1)


if mode == "op":
    op_checks(*sys.argv[2:6])
elif mode == "composed":
    composed(*sys.argv[2:6])
else:
    sys.exit(__doc__)
