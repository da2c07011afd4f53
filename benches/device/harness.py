"""The measuring harness the GPU benchmarks share (epilogue_suite.py, benches/zoo/run.py, and the
probes that import them): the precision policies, child processes with logs and time limits,
errors against an fp64 reference, timings in turns with L2 flushed, the op library's call
counters and kind switches through ctypes, and stage-by-stage error records. It owns how
correctness and speed are judged for these harnesses; it builds no models and writes no
records of its own.
"""
import ctypes
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
POLICIES = ("tf32", "f32", "bf16")
MATMUL_PRECISION = {"tf32": "high", "f32": "highest", "bf16": "high"}
FACT_PRECISION = {"tf32": "tf32", "f32": "f32", "bf16": "tf32"}
DTYPE = {"tf32": torch.float32, "f32": torch.float32, "bf16": torch.bfloat16}
# fact's own verification bounds per math (README, "What compose does"); the tables mark errors over them.
TOLERANCE = {"tf32": 1e-3, "f32": 1e-4, "bf16": 1e-2}
VERIFY_INPUTS, WARMUP, ITERATIONS = 3, 5, 30
FLUSH_FLOATS = 64 << 20
# The pattern kinds fact_disable names, and the op each kind's calls go through.
# Each pattern kind a composed module's op library can turn off, with the ops its patterns call.
ABLATION_KINDS = {
    "gemm": ("fact::gemm",),
    "epilogue": ("fact::gemm_ep",),
    "attention": ("fact::attention",),
    "layernorm": ("fact::layernorm",),
    "rmsnorm": ("fact::rmsnorm",),
    "rotary": ("fact::rotary", "fact::rotary_qk"),
    "conv": ("fact::conv",),
    "patch": ("fact::patch_conv",),
    "grn": ("fact::grn",),
    "glu": ("fact::glu",),
    "siblings": ("fact::linears2", "fact::linears3", "fact::linears4"),
    # Not a pattern kind: the frame's memo of what the shapes and buffers fix (fact_disable("memo")).
    "memo": ("fact::memo_get",),
}


def present_kinds(ops):
    """The kinds of ABLATION_KINDS whose ops a composed module calls (`ops`: fact_ops's list)."""
    return [kind for kind, names in ABLATION_KINDS.items() if any(n in ops for n in names)]


def log(*args):
    print(*args, flush=True)


def write_json(path, obj):
    """Writes obj to path through a temporary file, so a killed run leaves the previous version."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)


def run_logged(cmd, log_path, timeout_s, stdout_path=None, env=None):
    """Runs cmd from the repo root in a process group of its own, in `env` (None: this process's
    environment), its output in log_path (stdout apart in stdout_path when given). Returns (exit
    code, or None when it ran past timeout_s; seconds). The group is killed when the command
    overruns or this process is interrupted while waiting (SIGINT, or SIGTERM through the caller's
    handler)."""
    with open(log_path, "w") as out:
        out.write(f"$ {shlex.join(cmd)}\n")
        out.flush()
        stdout = open(stdout_path, "w") if stdout_path else out
        start = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=stdout,
                                    stderr=subprocess.STDOUT if stdout is out else out, process_group=0)
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                rc = None
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        finally:
            if stdout is not out:
                stdout.close()
        seconds = time.monotonic() - start
        out.write(f"\n# exit {rc} after {seconds:.1f} s\n")
    return rc, seconds


def last_error(log_path):
    """The last line of a child's log before run_logged's exit line: a Python traceback's
    exception; None when the log is unreadable or empty."""
    try:
        lines = [ln.strip() for ln in Path(log_path).read_text(errors="replace").splitlines()]
    except OSError:
        return None
    lines = [ln for ln in lines if ln and not ln.startswith("# exit ")]
    return lines[-1][:300] if lines else None


def substituted(compose_json):
    """The patterns compose.json says were given a kernel: id, rule, kind, kernel, how they were
    realized and any epilogue fields; None when the file is missing or not in the expected form."""
    try:
        report = json.loads(compose_json.read_text())
        out = []
        for pat in report["patterns"]:
            if not pat.get("kernel"):
                continue
            item = {"id": pat["id"], "rule": pat["rule"], "kernel": pat["kernel"], "how": pat["realization"]["how"]}
            if pat.get("kind"):
                item["kind"] = pat["kind"]
            item.update({k: v for k, v in pat.items() if "epilogue" in k})
            out.append(item)
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def rel_err(out, ref):
    """‖out − ref‖ / ‖ref‖ (Frobenius) in fp64; NaN when either holds a NaN. A reference of zeros
    verifies nothing (every output near zero would pass, 0/0 otherwise): that raises."""
    out = out.double()
    if torch.isnan(out).any() or torch.isnan(ref).any():
        return float("nan")
    scale = ref.norm()
    if scale == 0:
        raise ValueError("the fp64 reference output is all zeros: nothing to verify (a zero-initialised layer?)")
    return ((out - ref).norm() / scale).item()


def flush_buffer():
    """The buffer zeroed before every timed run: 256 MB, five times the H100's 50 MB L2."""
    return torch.empty(FLUSH_FLOATS, device="cuda")


def time_interleaved(fns, inputs, flush, iterations=ITERATIONS, warmup=WARMUP):
    """Median of `iterations` CUDA-event timings of each callable of `fns` (a dict: result key to
    callable), after `warmup` runs of each, L2 flushed before every run. The callables take turns
    within each iteration, so the GPU's clock and power drift over a run (a tf32 GEMM holds it at
    its power limit) falls on all of them alike, and their ratios do not depend on their order."""
    for fn in fns.values():
        for _ in range(warmup):
            fn(*inputs)
    torch.cuda.synchronize()
    samples = {k: [] for k in fns}
    for _ in range(iterations):
        for k, fn in fns.items():
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            end.synchronize()
            samples[k].append(start.elapsed_time(end))
    return {k: statistics.median(v) for k, v in samples.items()}


def kernel_ms(fns, inputs, flush, iterations=20, warmup=3):
    """The GPU's own time for each callable of `fns` (a dict: result key to callable): the median
    over `iterations` calls of the summed device time of the kernels one call launches, from the
    profiler, L2 flushed before each call as `time_interleaved` does. Unlike CUDA events around the
    call, it leaves out the host's time when the GPU waits on it (a compiled module's guards, an
    op's dispatch), so a kernel's own speed is compared with another's. The callables launch no
    kernel of the flush's name: a call whose kernels cannot be told apart so gives None."""
    from torch.profiler import ProfilerActivity, profile

    for fn in fns.values():
        for _ in range(warmup):
            fn(*inputs)
    torch.cuda.synchronize()
    out = {}
    for k, fn in fns.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iterations):
                flush.zero_()
                fn(*inputs)
            torch.cuda.synchronize()
        timeline = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                          key=lambda e: e.time_range.start)
        # The flush is the first kernel of every call: the calls lie between flushes.
        flush_name = timeline[0].name if timeline else None
        calls, current = [], None
        for e in timeline:
            if e.name == flush_name:
                current = 0.0
                calls.append(current)
            elif current is not None:
                calls[-1] += e.device_time / 1e3
        out[k] = statistics.median(calls) if len(calls) == iterations else None
    return out


def time_ms(fn, inputs, flush):
    return time_interleaved({"ms": fn}, inputs, flush)["ms"]


def compile_timed(module, inputs, **kwargs):
    """torch.compile(module, **kwargs) and its first call (which compiles): (module, seconds)."""
    m = torch.compile(module, **kwargs)
    start = time.monotonic()
    m(*inputs)
    torch.cuda.synchronize()
    return m, time.monotonic() - start


class Stages:
    """Runs the stages of a measuring child: a failing stage records its error (first line, with
    where the traceback went) and the others still run; `save` is called after every stage, so a
    crash keeps what was measured."""

    def __init__(self, errors, save, log_name):
        self.errors, self.save, self.log_name = errors, save, log_name

    def run(self, key, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- a failing stage is recorded, the others still run
            traceback.print_exc()
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            self.errors[key] = f"{type(e).__name__}: {first} (traceback in {self.log_name})"
        self.save()


def fact_ops(module):
    """The composed graph's fact:: nodes by op."""
    kinds = [n.kind() for n in module.inlined_graph.nodes() if n.kind().startswith("fact::")]
    return {k: kinds.count(k) for k in sorted(set(kinds))}


class OpLibrary:
    """A composed module's op library through ctypes: its per-kernel call counters and its switch
    that turns pattern kinds off (their calls run the original ops). Load it with
    torch.ops.load_library first: a process holds one fact op library."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(str(path))
        self.lib.fact_op_stats.restype = ctypes.c_char_p
        self.lib.fact_disable.argtypes, self.lib.fact_disable.restype = [ctypes.c_char_p], ctypes.c_int32

    def stats(self):
        """{kernel: {ran, copied, fell_back, why?}} since the library was loaded or last reset: a
        call the kernel could not implement ran the original ops and counts as fell_back; a call
        of few rows whose kernel operand chose torch's ops (compose's small rows) as torch."""
        return json.loads(self.lib.fact_op_stats())

    def reset(self):
        self.lib.fact_op_stats_reset()

    def disable(self, kinds):
        """Turns the kinds named (comma-separated) off and every other on; "" turns all on."""
        assert self.lib.fact_disable(kinds.encode()) == 0, kinds


def ablations(lib, module, present, trial, ref, inputs, flush, out):
    """Appends to `out` the module with nothing turned off and with each kind of `present` turned
    off, timed in turns with one another (same module, inputs and process, so the ratios are the
    kinds' worth and not the clock's drift between separate timings): {without, ms, max_rel_err},
    "none" first."""
    def variant(kind):
        def run(*xs):
            lib.disable(kind)
            return module(*xs)
        return run

    errs = {}
    try:
        for kind in ["none"] + present:
            lib.disable("" if kind == "none" else kind)
            errs[kind] = rel_err(module(*trial), ref)
        times = time_interleaved({k: variant("" if k == "none" else k) for k in errs}, inputs, flush)
        out.extend({"without": k, "ms": times[k], "max_rel_err": errs[k]} for k in errs)
    finally:
        lib.disable("")


def fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def kernel_profile(fn, inputs, iters=5, top=25):
    """Where one forward's GPU time goes: every CUDA kernel of `fn(*inputs)` summed over `iters`
    profiled forwards (per forward), the back-to-back wall time against the kernels' sum (the gap
    is launch and host work the GPU waits on), and the idle gaps over 5 us by the kernel before
    them, and each op's host time per call (a pass of its own), and one call as the timed runs make
    it (`cold_call`). {wall_ms, kernels_ms, idle_ms, kernels: [{ms, calls, name}], gaps_after:
    [...], host_ops: [{name, calls, us_per_call, ...}], cold_call: {host_ms, span_ms}}."""
    import time
    from collections import defaultdict
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(*inputs)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        fn(*inputs)
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) / 10 * 1e3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn(*inputs)
        torch.cuda.synchronize()
    cuda = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = defaultdict(lambda: [0.0, 0])
    for e in cuda:
        # By the whole name: CUTLASS GEMMs of different tiles share their first hundreds of characters.
        k = kernels[e.name]
        k[0] += e.device_time / 1e3 / iters
        k[1] += 1
    timeline = sorted(cuda, key=lambda e: e.time_range.start)
    gaps = defaultdict(lambda: [0.0, 0])
    for a, b in zip(timeline, timeline[1:]):
        idle = (b.time_range.start - a.time_range.end) / 1e3
        if idle > 0.005:
            g = gaps[a.name]
            g[0] += idle / iters
            g[1] += 1
    rows = sorted(((ms, n // iters, name) for name, (ms, n) in kernels.items()), reverse=True)
    gap_rows = sorted(((ms, n // iters, name) for name, (ms, n) in gaps.items()), reverse=True)
    # The host side, in a pass of its own (recording CPU ops slows the forward): each op's host
    # time per call with what it calls, fact's ops first, then the others by their own time.
    with profile(activities=[ProfilerActivity.CPU]) as host:
        for _ in range(iters):
            fn(*inputs)
        torch.cuda.synchronize()
    ops = host.key_averages()
    mine = sorted((e for e in ops if e.key.startswith("fact::")), key=lambda e: -e.cpu_time_total)
    others = sorted((e for e in ops if not e.key.startswith("fact::")), key=lambda e: -e.self_cpu_time_total)
    host_ops = [{"name": e.key, "calls": e.count // iters, "us_per_call": e.cpu_time_total / max(e.count, 1),
                 "self_us_per_forward": e.self_cpu_time_total / iters} for e in mine + others[:top]]
    return {"wall_ms": wall_ms, "kernels_ms": sum(r[0] for r in rows), "idle_ms": sum(r[0] for r in gap_rows),
            "kernels": [{"ms": ms, "calls": n, "name": shorten(name)} for ms, n, name in rows[:top]],
            "gaps_after": [{"ms": ms, "count": n, "name": shorten(name)} for ms, n, name in gap_rows[:top]],
            "host_ops": host_ops, "cold_call": cold_call(fn, inputs)}


def shorten(name, keep=200):
    """A kernel's name for a table: its start and end, which tell CUTLASS's instantiations apart
    (their tile and schedule come last)."""
    return name if len(name) <= keep else name[: keep // 2] + " ... " + name[-keep // 2 :]


def cold_call(fn, inputs, calls=10):
    """One forward as the timed runs see it: L2 flushed and the GPU idle when the call starts, so
    host work the GPU waits on shows as time. No profiler (it slows the host several times over):
    {host_ms: the call's own host time (it returns before the GPU is done where the host keeps
    ahead), span_ms: CUDA events around the call, the GPU's view}, medians of `calls`. Against the
    profile's kernels_ms, span - kernels is what the GPU spent waiting."""
    flush = flush_buffer()
    host, span = [], []
    for _ in range(calls):
        flush.zero_()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn(*inputs)
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        end.synchronize()
        span.append(start.elapsed_time(end))
    return {"host_ms": statistics.median(host), "span_ms": statistics.median(span)}
