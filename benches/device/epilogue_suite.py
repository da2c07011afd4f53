"""The GEMM + elementwise-epilogue benchmark suite: for every model of epilogue_models.suite() and
every precision policy, traces the model, composes it with fact, and measures eager, traced,
torch.compile and fact's composed module against each other and against an fp64 reference.

Runs on the GPU machine from the repository root, after `source .device/env.sh`:

    python3 benches/device/epilogue_suite.py OUT_DIR [--policies tf32,f32,bf16] [--only NAME,...]
                                             [--budget-s SECONDS]

Policies: tf32 (fp32 tensors, matmul precision "high"), f32 (fp32, "highest", fact's
f32-accurate kernels), bf16 (bf16 module and inputs, "high"). For each (model, policy) pair:

- OUT_DIR/models/NAME_POLICY.pt: the module traced on CPU in eval mode on small inputs of the right
  rank, and NAME_POLICY.state.pt its state dict (fact reads the real shapes from --input).
- OUT_DIR/fact/NAME_POLICY: `fact compose ... --no-bench` (composed.pt, libfact_ops.so,
  compose.json); its output goes to OUT_DIR/logs/NAME_POLICY.log.
- A fresh child process (this file with --measure; a process can hold one fact op library)
  verifies eager and fact on three fresh random inputs against the fp64 eager module (relative
  Frobenius error, NaN when an output holds one), then times eager, traced, torch.compile (its
  compile time apart), with --max-autotune torch.compile(mode="max-autotune") too, and fact on
  the same inputs: 5 warm-up runs of each, then 30 iterations in which each module runs once in
  turn, every run bracketed by CUDA events with L2 flushed (256 MB written) before it; the medians
  are the record's (max-autotune, compiled last, is timed in turns with fact's module again:
  fact_ms_beside_max_autotune). Where the composed module holds two or more pattern kinds
  it is timed again with each kind turned off (the op library's fact_disable: that kind's calls
  run the original ops): the record's ablations. --warm-compose composes each pair a second time
  (table hits, warm build cache) and records warm_compose_s. Its output goes to
  OUT_DIR/logs/NAME_POLICY.measure.log, its numbers to OUT_DIR/measure/NAME_POLICY.json.

A record: model, policy, inputs (shapes), eager_ms, traced_ms, compile_ms, fact_ms (medians),
max_rel_err (fact's, the largest over the inputs), eager_rel_err, compile_s, compose_s,
substituted (compose.json's patterns given a kernel: id, rule, kernel, how, any epilogue fields;
null when unreadable), fact_ops (the composed graph's fact:: nodes by kind), op_calls (the op
library's calls per kernel over verification and timing: ran, copied, fell_back) and error (null,
or what failed, stage by stage). OUT_DIR/suite.json holds one record per pair, rewritten after
each; stdout gets a line per record and a final table of fact's speedup (baseline ms / fact ms)
over each baseline with geomeans per policy. A failing pair records its error and the suite goes on.
"""
import argparse
import copy
import json
import shutil
import signal
import sys
import time
from pathlib import Path

import torch

import epilogue_models
from harness import (  # noqa: F401 -- re-exported: coverage.py, profile_composed.py and the probes import them from here
    DTYPE,
    FACT_PRECISION,
    FLUSH_FLOATS,
    ITERATIONS,
    MATMUL_PRECISION,
    POLICIES,
    REPO,
    TOLERANCE,
    VERIFY_INPUTS,
    WARMUP,
    OpLibrary,
    Stages,
    ablations,
    compile_timed,
    fact_ops,
    present_kinds,
    flush_buffer,
    fmt,
    geomean,
    log,
    rel_err,
    run_logged,
    substituted,
    time_interleaved,
    time_ms,
    write_json,
)

SEED = 0


def models_by_name():
    return {name: (factory, shapes) for name, factory, shapes in epilogue_models.suite()}


def tag(name, policy):
    return f"{name}_{policy}"


def example_shape(shape):
    """A small shape of the same rank and feature size for tracing."""
    return (16, shape[-1]) if len(shape) == 2 else (2, 8, shape[-1])


def trace(out_dir, name, policy, factory, shapes):
    """Traces the seeded module on CPU; saves the archive and the state dict under models/."""
    torch.manual_seed(SEED)
    module = factory().to(DTYPE[policy]).eval()
    examples = [torch.randn(example_shape(s), dtype=DTYPE[policy]) for s in shapes]
    with torch.no_grad():
        traced = torch.jit.trace(module, tuple(examples))
    models = out_dir / "models"
    traced.save(str(models / f"{tag(name, policy)}.pt"))
    torch.save(module.state_dict(), models / f"{tag(name, policy)}.state.pt")


def new_record(name, policy, shapes):
    return {
        "model": name, "policy": policy, "inputs": [list(s) for s in shapes],
        "eager_ms": None, "traced_ms": None, "compile_ms": None, "fact_ms": None,
        "max_rel_err": None, "eager_rel_err": None, "compile_s": None, "compose_s": None,
        "substituted": None, "fact_ops": None, "error": None,
    }


def add_error(rec, msg):
    rec["error"] = msg if rec["error"] is None else f"{rec['error']}; {msg}"


def run_pair(args, rec, factory, shapes):
    """Traces, composes and measures one (model, policy) pair into rec."""
    name, policy = rec["model"], rec["policy"]
    t = tag(name, policy)
    trace(args.out_dir, name, policy, factory, shapes)

    fact_dir = args.out_dir / "fact" / t
    shutil.rmtree(fact_dir, ignore_errors=True)
    dtype = "bf16" if policy == "bf16" else "f32"
    cmd = [str(args.fact), "compose", str(args.out_dir / "models" / f"{t}.pt")]
    for s in shapes:
        cmd += ["--input", "x".join(map(str, s)) + f":{dtype}"]
    cmd += ["--precision", FACT_PRECISION[policy], "--out", str(fact_dir), "--no-bench"] + args.fact_args.split()
    rc, rec["compose_s"] = run_logged(cmd, args.out_dir / "logs" / f"{t}.log", args.compose_timeout)
    rec["substituted"] = substituted(fact_dir / "compose.json")
    composed = rc == 0 and (fact_dir / "composed.pt").exists() and (fact_dir / "libfact_ops.so").exists()
    if rc is None:
        add_error(rec, f"fact compose timed out after {args.compose_timeout:.0f} s")
    elif rc != 0:
        add_error(rec, f"fact compose exited with {rc}")
    elif not composed:
        add_error(rec, "fact compose wrote no composed.pt (nothing substituted)")

    result = args.out_dir / "measure" / f"{t}.json"
    result.unlink(missing_ok=True)
    child = [sys.executable, str(Path(__file__).resolve()), str(args.out_dir), "--measure", name, policy]
    if composed:
        child.append("--with-fact")
    if args.max_autotune:
        child.append("--max-autotune")
    if composed and args.warm_compose:
        warm_dir = args.out_dir / "fact" / f"{t}.warm"
        shutil.rmtree(warm_dir, ignore_errors=True)
        warm = [c if c != str(fact_dir) else str(warm_dir) for c in cmd]
        rc_warm, rec["warm_compose_s"] = run_logged(warm, args.out_dir / "logs" / f"{t}.warm.log", args.compose_timeout)
        if rc_warm != 0:
            add_error(rec, f"warm fact compose exited with {rc_warm}")
    rc, _ = run_logged(child, args.out_dir / "logs" / f"{t}.measure.log", args.measure_timeout)
    measured = json.loads(result.read_text()) if result.exists() else {}
    for stage, msg in measured.pop("errors", {}).items():
        add_error(rec, f"{stage}: {msg}")
    rec.update(measured)
    if rc is None:
        add_error(rec, f"measure timed out after {args.measure_timeout:.0f} s")
    elif rc != 0:
        add_error(rec, f"measure exited with {rc}")


# The child: one (model, policy) pair's verification and timings, in a process of its own.


def measure(out_dir, name, policy, with_fact, max_autotune_too):
    """Writes measure/NAME_POLICY.json after every stage, so a crash keeps what was measured."""
    t = tag(name, policy)
    dtype = DTYPE[policy]
    torch.set_float32_matmul_precision(MATMUL_PRECISION[policy])
    factory, shapes = models_by_name()[name]
    res = {"errors": {}}
    path = out_dir / "measure" / f"{t}.json"
    stages = Stages(res["errors"], lambda: write_json(path, res), f"logs/{t}.measure.log")

    module = factory().to(dtype)
    module.load_state_dict(torch.load(out_dir / "models" / f"{t}.state.pt"))
    module = module.cuda().eval()
    with torch.no_grad():
        gen = torch.Generator(device="cuda")
        trials = []
        for i in range(VERIFY_INPUTS):
            gen.manual_seed(1000 + i)
            trials.append([torch.randn(s, generator=gen, device="cuda", dtype=dtype) for s in shapes])
        reference = copy.deepcopy(module).double()
        refs = [reference(*[x.double() for x in inputs]) for inputs in trials]
        del reference
        inputs = trials[0]
        flush = flush_buffer()

        # Each stage checks and prepares its module; "timing" then times them all in turns.
        timed = {}
        fact_lib = {}

        def eager():
            res["eager_rel_err"] = max(rel_err(module(*x), r) for x, r in zip(trials, refs))
            timed["eager_ms"] = module

        def traced():
            timed["traced_ms"] = torch.jit.load(str(out_dir / "models" / f"{t}.pt"), map_location="cuda")

        def compiled():
            timed["compile_ms"], res["compile_s"] = compile_timed(module, inputs)

        def max_autotune():
            m, res["max_autotune_compile_s"] = compile_timed(module, inputs, mode="max-autotune")
            # In turns with fact's module where there is one: the max-autotune ratio is of this pair.
            pair = {"max_autotune_ms": m}
            if "fact_ms" in timed:
                pair["fact_ms_beside_max_autotune"] = timed["fact_ms"]
            res.update(time_interleaved(pair, inputs, flush))

        def fact():
            d = out_dir / "fact" / t
            torch.ops.load_library(str(d / "libfact_ops.so"))
            m = torch.jit.load(str(d / "composed.pt"), map_location="cuda")
            res["fact_ops"] = fact_ops(m)
            res["max_rel_err"] = max(rel_err(m(*x), r) for x, r in zip(trials, refs))
            fact_lib["lib"] = OpLibrary(d / "libfact_ops.so")
            timed["fact_ms"] = m

        def timing():
            res.update(time_interleaved(timed, inputs, flush))
            res["timing"] = f"interleaved: {', '.join(timed)} in turns, {ITERATIONS} iterations, median"

        def fact_calls_and_ablations():
            lib, m = fact_lib["lib"], timed["fact_ms"]
            # Calls per kernel so far (verification and timing).
            res["op_calls"] = lib.stats()
            # Ablations: each pattern kind's calls run the original ops (the op library's
            # fact_disable), same module, same inputs, same process.
            present = present_kinds(res["fact_ops"])
            if len(present) < 2:
                return
            res["ablations"] = []
            ablations(lib, m, present, trials[0], refs[0], inputs, flush, res["ablations"])

        stages.run("eager", eager)
        stages.run("traced", traced)
        stages.run("compile", compiled)
        if with_fact:
            stages.run("fact", fact)
        stages.run("timing", timing)
        if "fact_ms" in timed:
            stages.run("fact_calls", fact_calls_and_ablations)
        # Last: its compile takes minutes, and a timeout then keeps what was measured before it.
        if max_autotune_too:
            stages.run("max_autotune", max_autotune)


# Reporting.


def speedup(rec, baseline):
    b, f = rec.get(baseline), rec.get("fact_ms")
    return b / f if b and f else None


def record_line(rec):
    subst = rec["substituted"]
    kernels = "-" if subst is None else f"{len(subst)} pattern(s)"
    ops = rec["fact_ops"]
    calls = "-" if ops is None else " ".join(f"{k}x{n}" for k, n in ops.items()) or "none"
    line = (
        f"{rec['model']} {rec['policy']}: eager {fmt(rec['eager_ms'])} traced {fmt(rec['traced_ms'])} "
        f"compile {fmt(rec['compile_ms'])} fact {fmt(rec['fact_ms'])} ms | fact err {fmt(rec['max_rel_err'], '.2e')} "
        f"eager err {fmt(rec['eager_rel_err'], '.2e')} | compose {fmt(rec['compose_s'], '.1f')} s, {kernels}, "
        f"fact ops in graph: {calls}"
    )
    if rec.get("max_autotune_ms") is not None:
        line += f" | max-autotune {fmt(rec['max_autotune_ms'])} ms"
        if rec.get("fact_ms_beside_max_autotune") is not None:
            line += f" (fact beside it {fmt(rec['fact_ms_beside_max_autotune'])} ms)"
    if rec.get("warm_compose_s") is not None:
        line += f" | warm compose {fmt(rec['warm_compose_s'], '.1f')} s"
    if rec.get("op_calls"):
        ran = sum(c["ran"] for c in rec["op_calls"].values())
        fell_back = sum(c["fell_back"] for c in rec["op_calls"].values())
        line += f" | kernel calls: ran {ran}, fell back {fell_back}"
    for a in rec.get("ablations") or []:
        line += f" | without {a['without']} {fmt(a['ms'])} ms (err {fmt(a['max_rel_err'], '.2e')})"
    return line + (f" | error: {rec['error']}" if rec["error"] else "")


def table(records):
    log("\nfact speedup = baseline ms / fact ms (> 1: fact faster); '!' marks an error over the policy's bound")
    head = (
        f"{'model':28} {'policy':6} {'eager':>8} {'traced':>8} {'compile':>8} {'fact':>8} "
        f"{'x eager':>8} {'x traced':>9} {'x compile':>10} {'fact err':>10}"
    )
    log(head)
    log("-" * len(head))
    for r in records:
        err = r["max_rel_err"]
        flag = "!" if err is not None and not err <= TOLERANCE[r["policy"]] else " "
        log(
            f"{r['model']:28} {r['policy']:6} {fmt(r['eager_ms']):>8} {fmt(r['traced_ms']):>8} {fmt(r['compile_ms']):>8} "
            f"{fmt(r['fact_ms']):>8} {fmt(speedup(r, 'eager_ms'), '.2f'):>8} {fmt(speedup(r, 'traced_ms'), '.2f'):>9} "
            f"{fmt(speedup(r, 'compile_ms'), '.2f'):>10} {fmt(err, '.2e'):>9}{flag}"
        )
    for policy in POLICIES:
        rows = [r for r in records if r["policy"] == policy]
        if not rows:
            continue
        means = {b: geomean([s for r in rows if (s := speedup(r, b)) is not None]) for b in ("eager_ms", "traced_ms", "compile_ms")}
        label = f"geomean ({sum(r['fact_ms'] is not None for r in rows)} of {len(rows)})"
        log(
            f"{label:28} {policy:6} {'':>8} {'':>8} {'':>8} {'':>8} "
            f"{fmt(means['eager_ms'], '.2f'):>8} {fmt(means['traced_ms'], '.2f'):>9} {fmt(means['compile_ms'], '.2f'):>10}"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated, of tf32,f32,bf16")
    ap.add_argument("--only", help="comma-separated model names (default: the whole suite)")
    ap.add_argument("--budget-s", type=float, help="start no new pair once this many seconds have passed")
    ap.add_argument("--fact", type=Path, default=REPO / ".device" / "fact", help="the fact binary")
    ap.add_argument("--fact-args", default="", help="extra arguments for fact compose, e.g. '--candidates 8 --jobs 16'")
    ap.add_argument("--compose-timeout", type=float, default=1800, help="seconds per fact compose")
    ap.add_argument("--measure-timeout", type=float, default=900, help="seconds per measuring child")
    ap.add_argument("--max-autotune", action="store_true", help="also time torch.compile(mode='max-autotune') (minutes of compile per pair)")
    ap.add_argument("--warm-compose", action="store_true", help="compose each pair a second time (all table hits, warm build cache) and record warm_compose_s")
    ap.add_argument("--measure", nargs=2, metavar=("NAME", "POLICY"), help=argparse.SUPPRESS)
    ap.add_argument("--with-fact", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out_dir = args.out_dir.resolve()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.measure:
        measure(args.out_dir, *args.measure, args.with_fact, args.max_autotune)
        return

    policies = args.policies.split(",")
    if bad := [p for p in policies if p not in POLICIES]:
        ap.error(f"unknown policies {bad}: use {','.join(POLICIES)}")
    suite = epilogue_models.suite()
    if args.only:
        names = args.only.split(",")
        if bad := sorted(set(names) - {n for n, _, _ in suite}):
            ap.error(f"unknown models {bad}: the suite has {', '.join(n for n, _, _ in suite)}")
        suite = [e for e in suite if e[0] in names]
    for sub in ("models", "fact", "logs", "measure"):
        (args.out_dir / sub).mkdir(parents=True, exist_ok=True)

    pairs = [(entry, policy) for entry in suite for policy in policies]
    log(f"{len(pairs)} pairs ({len(suite)} models x {','.join(policies)}) into {args.out_dir}")
    records = []
    start = time.monotonic()
    for i, ((name, factory, shapes), policy) in enumerate(pairs):
        elapsed = time.monotonic() - start
        if args.budget_s is not None and elapsed > args.budget_s:
            left = ", ".join(tag(n, p) for (n, _, _), p in pairs[i:])
            log(f"budget of {args.budget_s:.0f} s spent ({elapsed:.0f} s elapsed): {len(pairs) - i} pairs not started: {left}")
            break
        rec = new_record(name, policy, shapes)
        try:
            run_pair(args, rec, factory, shapes)
        except Exception as e:  # noqa: BLE001 -- a failing pair is recorded, the suite goes on
            add_error(rec, f"{type(e).__name__}: {e}")
        records.append(rec)
        write_json(args.out_dir / "suite.json", records)
        log(record_line(rec))
    table(records)


if __name__ == "__main__":
    main()
