"""Host time of a fact op call from each of Inductor's wrappers, on any machine (no GPU needed):
a chain of CALLS fact::gemm calls on tiny tensors (each call's input the last one's output, so
none is dropped), compiled by torch.compile with its Python wrapper, with its C++ wrapper
(`cpp_wrapper`, which calls a custom op back through Python), and with its C++ wrapper after
`fact.use_c_shims` (the op library's C shim per call), beside the same chain eagerly from Python
and the same chain of aten::linear under the Python wrapper. On the CPU every fact call runs its
fallback (aten::linear), the same work in every mode, so the differences between modes are what
each wrapper spends on a call. Prints a table and writes JSON.

    python3 benches/device/shim_host.py LIB [--calls 200] [--out shim_host.json]

LIB: an op library (libfact_ops.so, or a composed output folder holding one).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import fact  # noqa: E402


def chain(calls, op):
    def f(x, w):
        for _ in range(calls):
            x = op(x, w)
        return x

    return f


def per_call_us(fn, args, calls, repeats=30):
    """Median over `repeats` forwards of the wall time, per call, in microseconds (after 3 warm-up
    forwards)."""
    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lib")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("shim_host.json"))
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)
    torch._inductor.config.fx_graph_cache = False
    fact.load_library(args.lib)
    gemm = torch.ops.fact.gemm.default

    def fact_gemm(x, w):
        return gemm(x, w, None, "linear", "a")  # "a": no kernel of that name, the fallback runs

    x, w = torch.randn(1, 8), torch.randn(8, 8) / 8
    modes = {}
    want = chain(args.calls, fact_gemm)(x, w)

    def timed(key, fn, check):
        # Each mode compiles anew: the chains share one code object, whose compiled entries
        # Dynamo would otherwise reuse across modes (a C++ wrapper compiled before the shims were
        # registered, for one).
        torch._dynamo.reset()
        got = fn(x, w)
        assert torch.allclose(got, check(x, w), rtol=1e-4, atol=1e-6), key
        modes[key] = round(per_call_us(fn, (x, w), args.calls), 2)
        print(f"{key:32s} {modes[key]:8.2f} us a call", flush=True)

    fact_chain, aten_chain = chain(args.calls, fact_gemm), chain(args.calls, torch.nn.functional.linear)
    timed("fact_eager_python", fact_chain, lambda *a: want)
    timed("aten_python_wrapper", torch.compile(aten_chain), aten_chain)
    timed("aten_cpp_wrapper", torch.compile(chain(args.calls, torch.nn.functional.linear), options={"cpp_wrapper": True}), aten_chain)
    timed("fact_python_wrapper", torch.compile(fact_chain), lambda *a: want)
    timed("fact_cpp_wrapper", torch.compile(chain(args.calls, fact_gemm), options={"cpp_wrapper": True}), lambda *a: want)
    shims = fact.use_c_shims(args.lib)
    assert "gemm" in shims, shims
    timed("fact_cpp_wrapper_c_shims", torch.compile(chain(args.calls, fact_gemm), options={"cpp_wrapper": True}), lambda *a: want)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    record = {
        "what": "host microseconds per fact::gemm call (1x8 @ 8x8, CPU fallback) from each wrapper",
        "calls": args.calls,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads": 1,
        "torch": torch.__version__,
        "fact_commit": commit,
        "date": time.strftime("%Y-%m-%d"),
        "us_per_call": modes,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
