"""Host time of one fact op call: N back-to-back fact::gemm calls of a linear kernel of a composed
module's op library, looped in TorchScript (no Python per call, as a composed TorchScript module
calls it) and in Python (as an exported program and torch.compile's wrapper call it), against
aten::linear on the same tensors looped alike. Host us per call is the loop's wall time without a sync over N (the launches queue ahead of
a short kernel, so the host is what is timed); GPU us per call from CUDA events over the same loop.
Each linear ("rcr", no epilogue) kernel of the library runs once, on M x N x K; its fact_op_stats
must say it ran (not fell back), or the line says so.

    python3 benches/device/op_host_us.py COMPOSED_DIR [M N K] [CALLS]

Defaults: 8 x 768 x 768 (a decode step's GEMM), 500 calls (fewer than CUDA's launch queue holds).
"""
import ctypes
import json
import sys
import time
from pathlib import Path

import torch

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def linear_kernels(lib_path):
    """(name, dtype) of every linear kernel ("gemm", layout rcr, no epilogue) in the library's
    dispatch table (include/fact_kernels.h: FactKernelInfo opens with name, kind, signature, spec,
    dtype, layout, epilogue)."""
    lib = ctypes.CDLL(str(lib_path))
    lib.fact_kernel_count.restype = ctypes.c_int32
    lib.fact_kernel_info.restype = ctypes.POINTER(ctypes.c_char_p)
    lib.fact_kernel_info.argtypes = [ctypes.c_int32]
    out = []
    for i in range(lib.fact_kernel_count()):
        info = lib.fact_kernel_info(i)
        name, kind, dtype, layout, ep = (info[j].decode() if info[j] else "" for j in (0, 1, 4, 5, 6))
        if kind == "gemm" and layout == "rcr" and ep == "" and dtype in DTYPES:
            out.append((name, dtype))
    return lib, out


def fact_loop(a: torch.Tensor, w: torch.Tensor, kernel: str, n: int) -> torch.Tensor:
    y = a
    for _ in range(n):
        y = torch.ops.fact.gemm(a, w, None, "linear", kernel)
    return y


def aten_loop(a: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    y = a
    for _ in range(n):
        y = torch.nn.functional.linear(a, w)
    return y


def fact_py_loop(a, w, kernel, n):
    op = torch.ops.fact.gemm.default
    y = a
    for _ in range(n):
        y = op(a, w, None, "linear", kernel)
    return y


def aten_py_loop(a, w, n):
    op = torch.ops.aten.linear.default
    y = a
    for _ in range(n):
        y = op(a, w)
    return y


def timed(f, calls):
    """(host us, GPU us) per call of f(calls): host over `calls` launched behind a kernel that
    keeps the GPU busy for longer than they take to launch (so the queue never drains and the
    host is what is timed, at fewer calls than the launch queue holds), GPU from CUDA events over
    the same calls run again without it."""
    f(50)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~100 ms at the H200's clocks
    t0 = time.perf_counter()
    f(calls)
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    f(calls)
    end.record()
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) / calls * 1e3


def main():
    d = Path(sys.argv[1])
    m, n, k = (int(v) for v in sys.argv[2:5]) if len(sys.argv) >= 5 else (8, 768, 768)
    calls = int(sys.argv[5]) if len(sys.argv) >= 6 else 500
    lib_path = d / "libfact_ops.so"
    torch.ops.load_library(str(lib_path))
    # Scripted once the library has defined fact::gemm.
    fact, aten = torch.jit.script(fact_loop), torch.jit.script(aten_loop)
    lib, kernels = linear_kernels(lib_path)
    lib.fact_op_stats.restype = ctypes.c_char_p
    rows = []
    with torch.no_grad():
        for name, dtype in kernels:
            a = torch.randn(m, k, device="cuda", dtype=DTYPES[dtype])
            w = torch.randn(n, k, device="cuda", dtype=DTYPES[dtype])
            lib.fact_op_stats_reset()
            f = timed(lambda c: fact(a, w, name, c), calls)
            stats = json.loads(lib.fact_op_stats()).get(name, {})
            t = timed(lambda c: aten(a, w, c), calls)
            fp = timed(lambda c: fact_py_loop(a, w, name, c), calls)
            tp = timed(lambda c: aten_py_loop(a, w, c), calls)
            ran = stats.get("ran", 0) > 0 and stats.get("fell_back", 0) == 0
            rows.append({"kernel": name, "m": m, "n": n, "k": k, "ran": ran, "stats": stats,
                         "fact_host_us": f[0], "fact_gpu_us": f[1], "aten_host_us": t[0], "aten_gpu_us": t[1],
                         "fact_py_host_us": fp[0], "aten_py_host_us": tp[0]})
            print(f"{name}: fact {f[0]:.2f} us host / {f[1]:.2f} us GPU per call, "
                  f"aten::linear {t[0]:.2f} / {t[1]:.2f}; from Python fact {fp[0]:.2f}, aten {tp[0]:.2f} us host"
                  + ("" if ran else f"  (did not run: {stats})"))
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
