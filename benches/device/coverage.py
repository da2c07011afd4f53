"""Coverage of GEMM shapes (issue 13): ragged fp32 GEMMs (contiguous dims not multiples of 4) and
shapes at the edges (small K, an outer product, a long K), each a one-matmul model, composed with
fact under a precision policy and measured against the policy's torch baseline in one process.

Runs on the GPU machine from the repository root, after `source .device/env.sh` (see coverage.sh):

    python3 benches/device/coverage.py OUT_DIR [--policies tf32,f32] [--only NAME,...]
                                       [--budget-s SECONDS] [--compose-timeout S] [--fact-args '...']

For each (model, policy) pair not yet in OUT_DIR/suite.json (so a second call resumes):
- the model (x @ w, w a [K, N] parameter: torch's rrr GEMM) traced on CPU on a small input, saved
  under OUT_DIR/models/ with its state dict;
- `fact compose --no-bench` at the real shape (OUT_DIR/fact/TAG, log in OUT_DIR/logs/TAG.log),
  killed after --compose-timeout;
- a child process (one fact op library per process) that loads the module and the composed one,
  checks both against the fp64 module on a fresh random input (relative Frobenius error; an
  output of zeros or NaNs is an error, never timed), then times torch under the policy (tf32:
  matmul precision "high", cuBLAS's tf32; f32: "highest", true fp32) and fact's composed module:
  5 warm-ups, median of 30 CUDA-event timings with L2 flushed before each (epilogue_suite.time_ms).
  fact_op_stats says whether the kernel ran or the op fell back to torch (and why).

A record: model, policy, shape [m, n, k], gflop, torch_ms, fact_ms, speedup, max_rel_err,
torch_rel_err, substituted (compose.json's patterns with a kernel, null when unreadable), op_stats,
compose_s, error. suite.json: {"meta": {...}, "records": [...]}, rewritten after each pair. The
suite stops starting pairs when the time budget would be overrun.
"""
import argparse
import ctypes
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from epilogue_suite import (  # noqa: E402 -- the suite's helpers, one copy of each
    FACT_PRECISION,
    FLUSH_FLOATS,
    ITERATIONS,
    MATMUL_PRECISION,
    TOLERANCE,
    WARMUP,
    rel_err,
    run_logged,
    substituted,
    time_ms,
    write_json,
)

REPO = Path(__file__).resolve().parents[2]
POLICIES = ("tf32", "f32")
# (name, m, n, k): torch's out[m, n] = x[m, k] @ w[k, n]. Ragged ones first (the issue's
# targets), then the edges.
SHAPES = [
    ("ragged_4099x5003x3001", 4099, 5003, 3001),
    ("ragged_6151x2053x4093", 6151, 2053, 4093),
    ("ragged_10007x1021x3067", 10007, 1021, 3067),
    ("smallk_16384x16384x48", 16384, 16384, 48),
    ("outer_ragged_16384x16384x1", 16384, 16384, 1),
    ("largek_512x512x262144", 512, 512, 262144),
]
SEED = 0


def log(*args):
    print(*args, flush=True)


class MatMul(torch.nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(k, n) / k**0.5)

    def forward(self, x):
        return x @ self.w


def shape_of(name):
    for s in SHAPES:
        if s[0] == name:
            return s[1:]
    raise KeyError(name)


def tag(name, policy):
    return f"{name}_{policy}"


def trace(out_dir, name):
    """The model, traced on a small input (fact reads the real shape from --input)."""
    m, n, k = shape_of(name)
    torch.manual_seed(SEED)
    module = MatMul(k, n).eval()
    with torch.no_grad():
        traced = torch.jit.trace(module, (torch.randn(8, k),))
    traced.save(str(out_dir / "models" / f"{name}.pt"))
    torch.save(module.state_dict(), out_dir / "models" / f"{name}.state.pt")


def measure(out_dir, name, policy):
    """In a child process: verify, then time torch and fact; writes measure/TAG.json."""
    t = tag(name, policy)
    m, n, k = shape_of(name)
    res = {"errors": {}}
    path = out_dir / "measure" / f"{t}.json"
    module = MatMul(k, n)
    module.load_state_dict(torch.load(out_dir / "models" / f"{name}.state.pt"))
    module = module.cuda().eval()
    d = out_dir / "fact" / t
    lib = d / "libfact_ops.so"
    composed, so = None, None
    if lib.exists() and (d / "composed.pt").exists():
        torch.ops.load_library(str(lib))
        so = ctypes.CDLL(str(lib))
        so.fact_op_stats.restype = ctypes.c_char_p
        composed = torch.jit.load(str(d / "composed.pt"), map_location="cuda")
    torch.set_float32_matmul_precision(MATMUL_PRECISION[policy])
    with torch.no_grad():
        gen = torch.Generator(device="cuda").manual_seed(1000)
        x = torch.randn(m, k, generator=gen, device="cuda")
        ref = module.double()(x.double())
        module.float()
        flush = torch.empty(FLUSH_FLOATS, device="cuda")

        def checked(fn, key):
            out = fn(x)
            torch.cuda.synchronize()
            err = rel_err(out, ref)
            if not out.abs().max().item() > 0:
                raise RuntimeError(f"{key} output is all zeros")
            if err != err:
                raise RuntimeError(f"{key} output holds NaN")
            return err

        try:
            res["torch_rel_err"] = checked(module, "torch")
            res["torch_ms"] = time_ms(module, [x], flush)
        except Exception as e:  # noqa: BLE001 -- recorded, fact is still measured
            traceback.print_exc()
            res["errors"]["torch"] = f"{type(e).__name__}: {str(e)[:300]}"
        write_json(path, res)
        if composed is None:
            res["errors"]["fact"] = "no composed module (nothing substituted)"
        else:
            try:
                so.fact_op_stats_reset()
                res["max_rel_err"] = checked(composed, "fact")
                if res["max_rel_err"] > TOLERANCE[policy]:
                    res["errors"]["fact"] = f"error {res['max_rel_err']:.2e} over the policy's {TOLERANCE[policy]:.0e}; not timed"
                else:
                    res["fact_ms"] = time_ms(composed, [x], flush)
                res["op_stats"] = json.loads(so.fact_op_stats())
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                res["errors"]["fact"] = f"{type(e).__name__}: {str(e)[:300]}"
        write_json(path, res)


def run_pair(args, rec):
    name, policy = rec["model"], rec["policy"]
    t = tag(name, policy)
    trace(args.out_dir, name)
    m, n, k = shape_of(name)
    fact_dir = args.out_dir / "fact" / t
    shutil.rmtree(fact_dir, ignore_errors=True)
    cmd = [str(args.fact), "compose", str(args.out_dir / "models" / f"{name}.pt"), "--input", f"{m}x{k}:f32",
           "--precision", FACT_PRECISION[policy], "--out", str(fact_dir), "--no-bench"] + args.fact_args.split()
    rc, rec["compose_s"] = run_logged(cmd, args.out_dir / "logs" / f"{t}.log", args.compose_timeout)
    rec["substituted"] = substituted(fact_dir / "compose.json")
    if rc is None:
        rec["error"] = f"fact compose timed out after {args.compose_timeout:.0f} s"
    elif rc != 0:
        rec["error"] = f"fact compose exited with {rc}"
    result = args.out_dir / "measure" / f"{t}.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, str(args.out_dir), "--measure", name, "--policies", policy]
    mrc, _ = run_logged(cmd, args.out_dir / "logs" / f"{t}.measure.log", args.measure_timeout)
    try:
        res = json.loads(result.read_text())
    except (OSError, ValueError):
        res = {"errors": {"measure": f"the measuring child wrote nothing (exit {mrc}; logs/{t}.measure.log)"}}
    for key in ("torch_ms", "fact_ms", "max_rel_err", "torch_rel_err", "op_stats"):
        rec[key] = res.get(key)
    errors = "; ".join(f"{k}: {v}" for k, v in res.get("errors", {}).items())
    if errors:
        rec["error"] = f"{rec['error']}; {errors}" if rec["error"] else errors
    if rec["torch_ms"] and rec["fact_ms"]:
        rec["speedup"] = rec["torch_ms"] / rec["fact_ms"]


def meta(args):
    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    return {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "fact": out([str(args.fact), "--version"]),
        "cutlass": os.environ.get("CUTLASS_DIR"),
        "nvcc": out(["nvcc", "--version"]).splitlines()[-1] if out(["nvcc", "--version"]) else None,
        "host": platform.node(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "method": f"{WARMUP} warm-ups, median of {ITERATIONS} CUDA-event timings, L2 flushed before each; "
                  "torch and fact in one process; errors against the fp64 module",
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--only", default="")
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no pair that could run past this")
    ap.add_argument("--compose-timeout", type=float, default=240.0)
    ap.add_argument("--measure-timeout", type=float, default=120.0)
    ap.add_argument("--fact", type=Path, default=REPO / ".device" / "fact")
    ap.add_argument("--fact-args", default="--candidates 8 --refine 2 --jobs 16")
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    if args.measure:
        measure(args.out_dir, args.measure, policies[0])
        return
    start = time.monotonic()
    for sub in ("models", "fact", "logs", "measure"):
        (args.out_dir / sub).mkdir(parents=True, exist_ok=True)
    suite_path = args.out_dir / "suite.json"
    suite = json.loads(suite_path.read_text()) if suite_path.exists() else {"meta": {}, "records": []}
    suite.setdefault("runs", []).append(meta(args))
    suite["meta"] = suite["runs"][0]
    # A pair is done once measured or failed for a reason other than running out of time.
    done = {(r["model"], r["policy"]) for r in suite["records"] if r.get("fact_ms") or (r.get("error") and "timed out" not in r["error"])}
    only = {s for s in args.only.split(",") if s}
    # Ragged pairs first under both policies, then the edges.
    pairs = [(name, p) for name, *_ in SHAPES for p in policies if not only or name in only]
    pairs.sort(key=lambda np: (not np[0].startswith("ragged"), policies.index(np[1])))
    for name, policy in pairs:
        if (name, policy) in done:
            log(f"{name} {policy}: in suite.json already")
            continue
        left = args.budget_s - (time.monotonic() - start)
        if left < args.compose_timeout + args.measure_timeout:
            log(f"{name} {policy}: skipped, {left:.0f} s of the budget left (rerun with the same OUT to resume)")
            continue
        m, n, k = shape_of(name)
        rec = {"model": name, "policy": policy, "shape": [m, n, k], "gflop": 2e-9 * m * n * k,
               "torch_ms": None, "fact_ms": None, "speedup": None, "max_rel_err": None, "torch_rel_err": None,
               "substituted": None, "op_stats": None, "compose_s": None, "error": None}
        try:
            run_pair(args, rec)
        except Exception as e:  # noqa: BLE001 -- a failing pair is recorded, the suite goes on
            traceback.print_exc()
            rec["error"] = f"{type(e).__name__}: {e}"
        suite["records"] = [r for r in suite["records"] if (r["model"], r["policy"]) != (name, policy)] + [rec]
        write_json(suite_path, suite)
        ran = sum(s.get("ran", 0) for s in (rec["op_stats"] or {}).values())
        log(f"{name} {policy}: torch {rec['torch_ms']} ms, fact {rec['fact_ms']} ms, x{rec['speedup'] and round(rec['speedup'], 3)}, "
            f"err {rec['max_rel_err']}, kernel calls {ran}, {len(rec['substituted'] or [])} substituted, "
            f"compose {rec['compose_s'] and round(rec['compose_s'])} s" + (f" | error: {rec['error']}" if rec["error"] else ""))
    log(f"\n{'model':30} {'policy':6} {'torch ms':>9} {'fact ms':>9} {'speedup':>8} {'err':>9}  kernel")
    for r in suite["records"]:
        kernel = ",".join(s["kernel"] for s in r["substituted"] or []) or "-"
        f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
        log(f"{r['model']:30} {r['policy']:6} {f(r['torch_ms'], '.3f'):>9} {f(r['fact_ms'], '.3f'):>9} "
            f"{f(r.get('speedup'), '.3f'):>8} {f(r['max_rel_err'], '.1e'):>9}  {kernel}")


if __name__ == "__main__":
    main()
