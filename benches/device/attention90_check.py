"""Checks and times the attention kernels of one realize sweep library through fact::attention, in
one process: shape guards (T = 1, T not a multiple of 8 or of the tile, d below the tile, Tq != Tk,
q/k/v as views of one projection, contiguous, one head [B,T,D], the scale as a device divisor),
each against an fp64 reference with the output's memory poisoned first, whether the kernel ran or
the op fell back; then the sweep's own shape timed: each kernel through the op against torch's
SDPA (default choice, flash only, cuDNN only), medians of CUDA-event timings.

    python3 benches/device/attention90_check.py SWEEP_DIR OUT_JSON [--time-only|--check-only|--ncu-once]

--ncu-once runs one call of torch's SDPA and of each kernel, after a warm-up, inside the NVTX range
"ncu", for `ncu --nvtx --nvtx-include "ncu/"` to profile (benches/device/attention_ncu.sh).

SWEEP_DIR is a `fact realize` sweep folder (libsweep.so and sweep.json).
"""
import ctypes
import json
import math
import re
import sys

import torch

sweep_dir, out_path = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else ""
sweep = json.load(open(f"{sweep_dir}/sweep.json"))
problem = sweep["problem"]["attention"] if "attention" in sweep["problem"] else sweep["problem"]
kernels = [c["kernel"] for c in sweep["run"]["candidates"]]
torch.ops.load_library(f"{sweep_dir}/libsweep.so")
lib = ctypes.CDLL(f"{sweep_dir}/libsweep.so")
lib.fact_op_stats.restype = ctypes.c_char_p
dev = "cuda"
dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[problem["dtype"]]
tol = {"bf16": 1e-2, "f16": 5e-3}[problem["dtype"]]
torch.manual_seed(0)


def kernel_traits(name):
    """(causal or None when the kernel takes both, head-dim bound) from the kernel's name."""
    d = int(re.search(r"_d(\d+)", name).group(1))
    if name.startswith("sm90_"):
        return name.endswith("_causal"), d
    return None, d


def inputs(b, h, tq, tk, d, layout):
    if layout == "qkv":  # views of one projection, as a GPT block's split/view/transpose makes them
        assert tq == tk
        qkv = torch.randn(b, tq, 3 * h * d, device=dev).to(dtype)
        return [z.view(b, tq, h, d).transpose(1, 2) for z in qkv.split(h * d, dim=2)]
    if layout == "btd":  # one head, 3-d
        return [torch.randn(b, t, d, device=dev).to(dtype) for t in (tq, tk, tk)]
    return [torch.randn(b, h, t, d, device=dev).to(dtype) for t in (tq, tk, tk)]


def reference(q, k, v, causal, scale):
    q, k, v = (t.double() for t in (q, k, v))
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=dev).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v


def call(kernel, q, k, v, causal, how):
    """fact::attention in the SDPA form or the explicit form with a device divisor."""
    d = q.shape[-1]
    if how == "sdpa":
        return torch.ops.fact.attention(q, k, v, None, None, "sdpa;causal" if causal else "sdpa", kernel), 1 / math.sqrt(d)
    divisor = torch.tensor(float(d), device=dev) ** 0.5
    if causal:
        keep = torch.tril(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=dev))
        return torch.ops.fact.attention(q, k, v, keep, divisor, "explicit;div=tensor;mask=not", kernel), 1 / math.sqrt(d)
    return torch.ops.fact.attention(q, k, v, None, divisor, "explicit;div=tensor", kernel), 1 / math.sqrt(d)


def check(kernel, b, h, tq, tk, d, layout, how):
    causal_k, _ = kernel_traits(kernel)
    causal = problem["causal"] if causal_k is None else causal_k
    q, k, v = inputs(b, h, tq, tk, d, layout)
    # Poison the block the op's output will get from the caching allocator.
    poison = torch.full((b, tq, h, d), float("nan"), dtype=dtype, device=dev)
    del poison
    lib.fact_op_stats_reset()
    out, scale = call(kernel, q, k, v, causal, how)
    torch.cuda.synchronize()
    stats = json.loads(lib.fact_op_stats()).get(kernel, {})
    ref = reference(q, k, v, causal, scale)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    ok = math.isfinite(err) and err <= tol
    return {"kernel": kernel, "b": b, "h": h, "tq": tq, "tk": tk, "d": d, "layout": layout, "form": how, "causal": causal,
            "ran": stats.get("ran", 0) > 0, "why": stats.get("why", ""), "rel_err": err, "ok": ok}


def cases(kernel):
    causal, bound = kernel_traits(kernel)
    dims = sorted({bound, problem["head_dim"], 32} & set(range(8, bound + 1, 8)))
    out = []
    for d in dims:
        for t in (1, 8, 77, 136, 520):
            out.append((4, 8, t, t, d, "qkv", "sdpa"))
        out.append((4, 8, 136, 136, d, "bhtd", "sdpa"))
    d = problem["head_dim"]
    out.append((4, 8, 264, 264, d, "qkv", "explicit"))
    out.append((4, 1, 200, 200, d, "btd", "sdpa"))
    if causal is not True:  # Tq != Tk without a mask, and with one where queries are fewer
        out += [(4, 8, 64, 200, d, "bhtd", "sdpa"), (4, 8, 200, 64, d, "bhtd", "sdpa")]
    if causal is not False:
        out.append((4, 8, 64, 200, d, "bhtd", "sdpa"))
    return out


def median_ms(fn, reps=50):
    for _ in range(10):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return t[len(t) // 2]


def timings():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    p = problem
    b, h, t, d, causal = p["batch"], p["heads"], p["seq_q"], p["head_dim"], p["causal"]
    q, k, v = inputs(b, h, t, t, d, "qkv")
    rows = {}
    for name, backends in [("sdpa", None), ("sdpa_flash", [SDPBackend.FLASH_ATTENTION]), ("sdpa_cudnn", [SDPBackend.CUDNN_ATTENTION])]:
        def f():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        try:
            if backends is None:
                rows[name] = median_ms(f)
            else:
                with sdpa_kernel(backends):
                    rows[name] = median_ms(f)
        except Exception as e:  # a backend that does not take this shape
            rows[name] = f"unavailable: {str(e)[:120]}"
    ref = reference(q, k, v, causal, 1 / math.sqrt(d))
    for kernel in kernels:
        lib.fact_op_stats_reset()
        out = torch.ops.fact.attention(q, k, v, None, None, "sdpa;causal" if causal else "sdpa", kernel)
        torch.cuda.synchronize()
        if json.loads(lib.fact_op_stats()).get(kernel, {}).get("ran", 0) == 0:
            rows[kernel] = "fell back"
            continue
        err = ((out.double() - ref).norm() / ref.norm()).item()
        ms = median_ms(lambda: torch.ops.fact.attention(q, k, v, None, None, "sdpa;causal" if causal else "sdpa", kernel))
        rows[kernel] = {"ms": ms, "rel_err": err}
    return rows


def ncu_once():
    p = problem
    q, k, v = inputs(p["batch"], p["heads"], p["seq_q"], p["seq_q"], p["head_dim"], "qkv")
    how = "sdpa;causal" if p["causal"] else "sdpa"
    calls = [lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=p["causal"])]
    calls += [lambda kn=kn: torch.ops.fact.attention(q, k, v, None, None, how, kn) for kn in kernels]
    for f in calls:
        f()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("ncu")
    for f in calls:
        f()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print("profiled: sdpa, then", ", ".join(kernels))


with torch.no_grad():
    result = {"problem": problem, "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if mode == "--ncu-once":
        ncu_once()
        sys.exit()
    if mode != "--time-only":
        checks = [check(kn, *c) for kn in kernels if kn.startswith("sm90_") for c in cases(kn)]
        result["checks"] = checks
        bad = [c for c in checks if not c["ok"]]
        ran = sum(c["ran"] for c in checks)
        print(f"checks: {len(checks)} ({ran} ran the kernel, {len(checks) - ran} fell back), {len(bad)} wrong")
        for c in checks:
            if not c["ok"] or (c["tq"] % 8 == 0 and not c["ran"]):
                print("  ", "WRONG" if not c["ok"] else "fell back", {x: c[x] for x in ("kernel", "tq", "tk", "d", "layout", "form", "rel_err", "why")})
        fellback = sorted({(c["tq"], c["tk"]) for c in checks if not c["ran"]})
        print("   (Tq, Tk) that fell back:", fellback)
    if mode != "--check-only":
        rows = timings()
        result["timings_ms"] = rows
        base = rows["sdpa"] if isinstance(rows["sdpa"], float) else None
        for name, r in rows.items():
            if isinstance(r, dict):
                print(f"  {name:55s} {r['ms']:.4f} ms  err {r['rel_err']:.1e}  sdpa/this {base / r['ms']:.2f}" if base else f"  {name} {r}")
            else:
                print(f"  {name:55s} {r if isinstance(r, str) else f'{r:.4f} ms'}")
    json.dump(result, open(out_path, "w"), indent=1)
