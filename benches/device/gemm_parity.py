"""GEMM + bias parity probe (issue #10, item 4): for each composed Linear (fact compose
--keep-slower, so fact's own winner runs even where torch measured faster), time torch's
linear + bias (cuBLAS), torch's plain mm (cuBLAS, no bias) and the composed module in one
process, after checking the composed module against fp64. With --ncu-once, run each once in an
NVTX range instead of timing them (for `ncu --launch-skip`-free captures of the three kernels).

    python3 gemm_parity.py OUT_DIR NAME:M:K:N:DTYPE[:EPI]   (OUT_DIR/fact/NAME holds the compose;
                                                      one case a process, appended to parity.jsonl)

EPI is what follows the linear in the composed model (gemm_parity.sh): bias (nothing), none (no
bias either: fact's plain GEMM, so "linear" is cuBLAS's plain GEMM too), gelu (tanh
GELU) or residual (+ a second input); then "eager" times torch's linear and that epilogue too, and
"vendor" cuBLAS's own fused equivalent (its GELU_BIAS epilogue; a GEMM reading the residual as C).
"""
import argparse
import ctypes
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from epilogue_suite import time_interleaved  # noqa: E402 -- one copy of the suite's timing


def kernel_ms(fns, flush, reps=30):
    """Median GPU time per call of each of `fns` summed over the kernels it launches, from
    torch.profiler (L2 flushed before each call, flush kernels left out): the kernels alone,
    without the host time a TorchScript module call adds before its kernel starts. The calls run
    in turns, one of each per round, so clock drift within the process falls on all alike (run
    in blocks, one cuBLAS kernel timed 0.792 ms as linear and 0.818 as the mm after it). With
    each, what a call launched (kernel and memset names) and each one's median ms."""
    from torch.profiler import ProfilerActivity, profile

    def device_events(prof):
        evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return sorted(evs, key=lambda e: e.time_range.start)

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        flush.zero_()
        torch.cuda.synchronize()
    flush_names = {e.name for e in device_events(prof)}
    order = list(fns)
    for fn in fns.values():
        for _ in range(5):
            fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for name in order:
                flush.zero_()
                fns[name]()
        torch.cuda.synchronize()
    # The kernels between one flush and the next are one call's, the calls in `order`'s turns.
    segments, cur = [], None
    for e in device_events(prof):
        if e.name in flush_names:
            if cur is not None:
                segments.append(cur)
            cur = []
        elif cur is not None:
            cur.append(e)
    if cur is not None:
        segments.append(cur)
    if len(segments) != reps * len(order):
        sys.exit(f"kernel_ms: {len(segments)} flush-separated calls, expected {reps * len(order)}: "
                 "a timed call launches the flush's kernel itself")
    out = {}
    for i, name in enumerate(order):
        mine = segments[i::len(order)]
        calls = sorted(c for c in (sum(e.time_range.elapsed_us() for e in seg) / 1e3 for seg in mine) if c > 0)
        launched = {}
        for seg in mine:
            for e in seg:
                launched.setdefault(e.name[:120], []).append(e.time_range.elapsed_us() / 1e3)
        kernels = {k: sorted(v)[len(v) // 2] for k, v in launched.items()}
        out[name] = (calls[len(calls) // 2] if calls else None, kernels)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--ncu-once", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    # Inference, as users run a composed module: under autograd every fact op falls back.
    torch.set_grad_enabled(False)
    # The L2 flush both timings zero before each run (256 MB, five times the H100's L2).
    flush = torch.empty(64 << 20, dtype=torch.int32, device="cuda")
    for case in args.cases:
        name, m, k, n, dt, *rest = case.split(":")
        epi = rest[0] if rest else "bias"
        m, k, n = int(m), int(k), int(n)
        dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dt]
        d = args.out_dir / "fact" / name
        # One library per process: every composed library registers the same fact:: ops.
        torch.ops.load_library(str(d / "libfact_ops.so"))
        mod = torch.jit.load(str(d / "composed.pt"), map_location="cuda")
        ops = [x.kind() for x in mod.inlined_graph.nodes() if x.kind().startswith("fact::")]
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
        # EPI none: a Linear without bias (fact's plain GEMM against cuBLAS's).
        b = None if epi == "none" else torch.randn(n, device="cuda", dtype=dtype)
        sd = {kk: v for kk, v in mod.state_dict().items()}
        with torch.no_grad():
            sd[[kk for kk in sd if kk.endswith("weight")][0]].copy_(w)
            if b is not None:
                sd[[kk for kk in sd if kk.endswith("bias")][0]].copy_(b)
        res = torch.randn(m, n, device="cuda", dtype=dtype)
        gelu = lambda y: torch.nn.functional.gelu(y, approximate="tanh")
        ref = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
        ref = {"bias": ref, "none": ref, "gelu": gelu(ref), "residual": ref + res.double()}[epi]
        inputs = (x,) if epi in ("bias", "none") else (x, res)
        out = mod(*inputs)
        err = ((out.double() - ref).norm() / ref.norm()).item()
        lin = lambda: torch.nn.functional.linear(x, w, b)
        mm = lambda: torch.mm(x, w.t())
        fact = lambda: mod(*inputs)
        fns = {"linear": lin, "mm": mm, "fact": fact}
        # "vendor": cuBLAS's own GEMM with the same epilogue, where it has one: cuBLASLt's
        # GELU_BIAS epilogue (torch._addmm_activation), and for a residual a GEMM reading a
        # same-shape C with beta = 1 (the bias folded into C beforehand, outside the timing), which
        # moves the residual's bytes as fact's kernel does.
        vendor = None
        if epi == "gelu":
            fns["eager"] = lambda: gelu(torch.nn.functional.linear(x, w, b))
            vendor = lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)
        elif epi == "residual":
            fns["eager"] = lambda: torch.nn.functional.linear(x, w, b) + res
            res_b = res + b
            vendor = lambda: torch.addmm(res_b, x, w.t())
        r = {"case": name, "epilogue": epi, "m": m, "k": k, "n": n, "dtype": dt, "fact_ops": ops, "rel_err": err}
        if vendor is not None:
            fns["vendor"] = vendor
            v = vendor().double()
            r["vendor_rel_err"] = ((v - ref).norm() / ref.norm()).item()
        if args.ncu_once:
            # Under Nsight Compute only the capture: the profiler's timing cannot share CUPTI with it.
            for fn in fns.values():
                fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(f"ncu_{name}")
            lin(); mm(); fact()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            continue
        # Two rounds: the spread between them says what a ratio can resolve.
        for rnd in (1, 2):
            t = time_interleaved(fns, (), flush, iterations=60, warmup=10)
            for kk, v in t.items():
                r[f"{kk}_ms_{rnd}"] = v
        # The kernels alone, from the profiler (the ratio the parity target is about).
        kt = kernel_ms(fns, flush)
        for kk, (v, launched) in kt.items():
            r[f"{kk}_kernel_ms"] = v
            r[f"{kk}_launched"] = launched
        kt = {kk: v for kk, (v, _) in kt.items()}
        if kt["fact"]:
            r["kernel_fact_vs_mm"] = kt["mm"] / kt["fact"]
            if kt.get("vendor"):
                r["kernel_fact_vs_vendor"] = kt["vendor"] / kt["fact"]
                r["kernel_vendor_vs_mm"] = kt["mm"] / kt["vendor"]
        r["fact_vs_mm"] = min(r["mm_ms_1"], r["mm_ms_2"]) / min(r["fact_ms_1"], r["fact_ms_2"])
        r["fact_vs_linear"] = min(r["linear_ms_1"], r["linear_ms_2"]) / min(r["fact_ms_1"], r["fact_ms_2"])
        # Say what ran: a call that fell back timed torch, not fact.
        lib = ctypes.CDLL(str(d / "libfact_ops.so"))
        lib.fact_op_stats.restype = ctypes.c_char_p
        r["op_calls"] = json.loads(lib.fact_op_stats())
        fell_back = sum(c.get("fell_back", 0) for c in r["op_calls"].values()) if isinstance(r["op_calls"], dict) else None
        if fell_back:
            r["error"] = f"{fell_back} fact calls fell back: fact_ms timed torch"
        rows.append(r)
        print(json.dumps(r), flush=True)
    if args.ncu_once:
        return 0
    with open(args.out_dir / "parity.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print("| case | dtype | linear ms | mm ms | fact ms | mm/fact | linear/fact | kernels: linear, mm, fact ms | mm/fact | err |")
    for r in rows:
        f = min(r["fact_ms_1"], r["fact_ms_2"])
        print(f"| {r['case']} ({r['epilogue']}) | {r['dtype']} | {r['linear_ms_1']:.3f}/{r['linear_ms_2']:.3f} | "
              f"{r['mm_ms_1']:.3f}/{r['mm_ms_2']:.3f} | {r['fact_ms_1']:.3f}/{r['fact_ms_2']:.3f} | "
              f"{r['fact_vs_mm']:.3f} | {r['fact_vs_linear']:.3f} | "
              f"{r['linear_kernel_ms']:.4f}, {r['mm_kernel_ms']:.4f}, {r['fact_kernel_ms']:.4f} | "
              f"{r.get('kernel_fact_vs_mm', 0):.3f} | {r['rel_err']:.1e} |"
              + (f" eager kernels {r['eager_kernel_ms']:.4f} ms" if r.get("eager_kernel_ms") else "")
              + (f"; cuBLAS fused {r['vendor_kernel_ms']:.4f} ms (mm/it {r['kernel_vendor_vs_mm']:.3f}, "
                 f"it/fact {r['kernel_fact_vs_vendor']:.3f}, err {r['vendor_rel_err']:.1e})"
                 if r.get("kernel_fact_vs_vendor") else ""))


if __name__ == "__main__":
    sys.exit(main())
