"""Shape guards of a composed module on the GPU machine: the composed module run at other batch
sizes and sequence lengths than it was composed for, on a non-contiguous input and on the CPU,
must give the original module's result (fact's ops run their kernels where a call fits and fall
back to the original ops where not; either way the numbers must match).

    python3 benches/device/shape_guards.py COMPOSED_DIR ORIGINAL.pt POLICY BxTxC [REPORT.json]

POLICY is tf32, f32 or bf16 (the module's dtype and matmul precision, as epilogue_suite.py).
Each case draws a fresh input, runs the original module, its fp64 copy and the composed module,
and checks the composed output against fp64 within the policy's tolerance (and no worse than
three times the original's own error); it records the op library's calls per kernel (ran, fell
back, why), so the log shows which cases ran fact's kernels. Exit status 1 if any case fails.
"""
import ctypes
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from epilogue_suite import DTYPE, MATMUL_PRECISION, TOLERANCE, rel_err  # noqa: E402 -- the suite's, one copy each


def main():
    composed_dir, original_path, policy, shape = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    report = Path(sys.argv[5]) if len(sys.argv) > 5 else None
    b0, t0, c = (int(v) for v in shape.split("x"))
    torch.set_float32_matmul_precision(MATMUL_PRECISION[policy])
    dtype, tol = DTYPE[policy], TOLERANCE[policy]
    lib_path = composed_dir / "libfact_ops.so"
    torch.ops.load_library(str(lib_path))
    lib = ctypes.CDLL(str(lib_path))
    lib.fact_op_stats.restype = ctypes.c_char_p

    def stats():
        s = json.loads(lib.fact_op_stats().decode())
        lib.fact_op_stats_reset()
        return s

    cases = [
        ("as composed", "cuda", (b0, t0), False),
        ("fewer rows", "cuda", (max(1, b0 // 8), t0), False),
        ("T not a multiple of the tile", "cuda", (3, 77), False),
        ("T = 1", "cuda", (4, 1), False),
        ("B = 1, T = 300", "cuda", (1, 300), False),
        ("non-contiguous input", "cuda", (b0 // 4, t0), True),
        ("CPU", "cpu", (2, 64), False),
    ]
    modules = {}
    results, failed = [], 0
    for name, device, (b, t), strided in cases:
        if device not in modules:
            original = torch.jit.load(original_path, map_location=device).eval()
            reference = torch.jit.load(original_path, map_location=device).eval().double()
            composed = torch.jit.load(str(composed_dir / "composed.pt"), map_location=device).eval()
            modules[device] = (original, reference, composed)
        original, reference, composed = modules[device]
        gen = torch.Generator(device=device).manual_seed(b * 1000 + t)
        if strided:
            # The same values as a [b, t, c] tensor, laid out [t, b, c] in memory.
            x = torch.randn(t, b, c, generator=gen, device=device).transpose(0, 1).to(dtype)
        else:
            x = torch.randn(b, t, c, generator=gen, device=device).to(dtype)
        rec = {"case": name, "device": device, "shape": [b, t, c], "contiguous": x.is_contiguous()}
        try:
            with torch.no_grad():
                stats()
                got = composed(x)
                rec["op_calls"] = stats()
                ref = reference(x.double())
                orig = original(x)
            rec["rel_err"], rec["original_rel_err"] = rel_err(got, ref), rel_err(orig, ref)
            rec["ok"] = rec["rel_err"] <= max(tol, 3 * rec["original_rel_err"])
        except Exception as e:  # noqa: BLE001 -- a failing case is reported, the others still run
            rec["ok"], rec["error"] = False, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
        failed += not rec["ok"]
        results.append(rec)
        calls = ", ".join(
            f"{k.split('_')[1] if '_' in k else k}: ran {v['ran']} fell back {v['fell_back']}" + (f" ({v['why']})" if v.get("why") else "")
            for k, v in rec.get("op_calls", {}).items()
        )
        print(
            f"{'OK  ' if rec['ok'] else 'FAIL'} {name:30} {device:4} {b}x{t}x{c} "
            f"err {rec.get('rel_err', float('nan')):.2e} (original {rec.get('original_rel_err', float('nan')):.2e}) "
            f"{rec.get('error', '')} | {calls}",
            flush=True,
        )
    if report:
        report.write_text(json.dumps({"policy": policy, "composed": str(composed_dir), "cases": results}, indent=1) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
