"""Runs the zoo (benches/zoo/models.py) on the GPU machine as a user would: for each (model,
policy), builds the model on the GPU, traces it there, composes the trace with the fact CLI, and
times eager, the traced module, torch.compile (default and max-autotune) and fact's composed
module in turns in one process, with errors against fp64 and the op library's call counters.
Owns the zoo's records; the measuring itself is benches/device/harness.py's.

From the repository root on the GPU machine, after `source .device/env.sh`:

    python3 benches/zoo/run.py OUT [--policies tf32,bf16] [--models gpt2,llama]
        [--modes eager,traced,compile,max-autotune,fact] [--fact .device/fact] [--fact-args '--jobs 16']
        [--budget-s 480] [--table FILE] [--seed-table FILE] [--cache-dir DIR] [--ablations]

Policies: tf32 (fp32 model and inputs, matmul precision "high", `fact compose --precision tf32`),
f32 (fp32, "highest", f32-accurate), bf16 (the model and its float inputs in bfloat16). For each
pair, under OUT:

- models/NAME_POLICY.pt: the wrapper traced on the GPU under no_grad with
  `torch.jit.trace(wrapper, inputs, strict=False)` (a child process: `--child trace`).
- fact/NAME_POLICY/: `fact compose models/NAME_POLICY.pt --out fact/NAME_POLICY --no-bench --json
  --precision P`, its wall clock the record's compose_s, its log logs/NAME_POLICY.compose.log and
  its JSON logs/NAME_POLICY.compose.json. FACT_TABLE (default OUT/user_table.json, --table),
  FACT_CACHE_DIR (default /tmp/fact-cache, --cache-dir) and FACT_SHIPPED_TABLE (the repository's)
  are kept across pairs and calls, so a later call composes from what an earlier one tuned.
- A measuring child (`--child measure`, a process can hold one fact op library): the fp64
  reference (the eager model in float64 on the GPU, same weights, VERIFY_INPUTS fresh inputs of
  the traced shape), each mode's error against it (the largest relative Frobenius error over
  those inputs), fact's op counters over one forward of the traced inputs, then every mode timed
  in turns (harness.time_interleaved: warm-ups, then ITERATIONS rounds, L2 flushed, CUDA events,
  medians); max-autotune last, timed in turns with fact again (fact_ms_beside_max_autotune).
  Its log: logs/NAME_POLICY.measure.log.
- records/NAME_POLICY.json: the record (schema in benches/zoo/README.md), written after every
  stage; OUT/zoo.json joins every record under OUT/records (so calls that run different pieces
  into one OUT add up) and OUT/zoo.svg draws fact against torch.compile (`fact plot-e2e --over`).

A failing stage records its error and the run goes on. --budget-s bounds the whole call: no pair
starts after it, and a running stage is stopped when it runs out. Calls into one OUT add up: a
pair's record keeps what earlier calls measured for the modes this call does not run (on the
same GPU), and --resume skips pairs whose record already has every time the modes measure.
fact_ms is fact timed in turns with eager, traced and torch.compile; a call that runs
max-autotune and fact without them times fact beside max-autotune only
(fact_ms_beside_max_autotune) and keeps the earlier fact_ms.

--stage compose traces and composes each pair and stops there; a later --stage measure into the
same OUT measures what it left (the traced module and the composed folder, their record fields
kept). Jobs side by side on one host's GPUs (benches/zoo/gpus.sh) run every job's compose stage,
then every job's measure stage, so no timed run shares the host's cores with another job's nvcc.
"""
import argparse
import copy
import datetime
import gzip
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

import models

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benches" / "device"))
from harness import (  # noqa: E402 -- the shared measuring harness, one copy of each helper
    DTYPE,
    FACT_PRECISION,
    ITERATIONS,
    MATMUL_PRECISION,
    POLICIES,
    TOLERANCE,
    VERIFY_INPUTS,
    OpLibrary,
    Stages,
    ablations,
    compile_timed,
    fact_ops,
    present_kinds,
    flush_buffer,
    fmt,
    kernel_profile,
    geomean,
    last_error,
    log,
    rel_err,
    run_logged,
    substituted,
    time_interleaved,
    write_json,
)

MODES = ("eager", "traced", "compile", "max-autotune", "fact")
# Each mode's time and error keys in a record.
MS_KEY = {"eager": "eager_ms", "traced": "traced_ms", "compile": "compile_ms", "max-autotune": "max_autotune_ms", "fact": "fact_ms"}
ERR_KEY = {m: k.replace("_ms", "_err") for m, k in MS_KEY.items()}
MODE_OF = {k: m for m, k in MS_KEY.items()}
# The optional measuring stages, each a flag of the parent passed on to the measuring child.
EXTRAS = ("ablations", "profile")
# The kind of a pattern whose compose.json entry names none (older fact): from its rule id.
KIND_PREFIXES = (("attention", "attention"), ("sdpa", "attention"), ("layernorm", "layernorm"))


def tag(name, policy):
    return f"{name}_{policy}"


def versions():
    out = {"torch": torch.__version__}
    for lib in ("transformers", "torchvision"):
        try:
            out[lib] = __import__(lib).__version__
        except ImportError:
            out[lib] = None
    return out


def inputs_for(model, policy, seed):
    """The model's inputs of the GPU run on the GPU, float ones in the policy's dtype."""
    xs = model.inputs(ci=False, device="cuda", seed=seed)
    return tuple(x.to(DTYPE[policy]) if x.is_floating_point() else x for x in xs)


def pattern_kind(pattern):
    if pattern.get("kind"):
        return pattern["kind"]
    rule = pattern["rule"]
    for prefix, kind in KIND_PREFIXES:
        if rule.startswith(prefix):
            return kind
    return "epilogue" if "_ep_" in rule else "gemm"


# The children: one (model, policy) pair's trace and measurement, each in a process of its own.


def child_trace(out, name, policy):
    """Builds the model on the GPU and traces it there as a user would; writes models/T.pt and
    work/T.trace.json."""
    model = models.by_name()[name]
    t = tag(name, policy)
    torch.set_float32_matmul_precision(MATMUL_PRECISION[policy])
    info = {"inputs": None, "trace_s": None}
    wrapper = models.build(model, ci=False, device="cuda", dtype=DTYPE[policy])
    inputs = inputs_for(model, policy, models.SEED)
    info["inputs"] = models.describe_inputs(inputs)
    start = time.monotonic()
    with torch.no_grad():
        traced = torch.jit.trace(wrapper, inputs, strict=False)
    traced.save(str(out / "models" / f"{t}.pt"))
    info["trace_s"] = time.monotonic() - start
    write_json(out / "work" / f"{t}.trace.json", info)


def child_measure(out, name, policy, modes, with_fact, extras):
    """Writes work/T.measure.json after every stage, so a crash keeps what was measured.
    `extras`: the optional stages asked for, of EXTRAS."""
    model = models.by_name()[name]
    t = tag(name, policy)
    torch.set_float32_matmul_precision(MATMUL_PRECISION[policy])
    res = {"errors": {}, "torch_device": torch.cuda.get_device_name()}
    path = out / "work" / f"{t}.measure.json"
    stages = Stages(res["errors"], lambda: write_json(path, res), f"logs/{t}.measure.log")
    traced_path = out / "models" / f"{t}.pt"

    wrapper = models.build(model, ci=False, device="cuda", dtype=DTYPE[policy])
    if traced_path.exists():
        # The traced archive's weights, so every mode computes with the very same ones (the
        # seeded build gives them too; this makes it so whatever the libraries' init does).
        loaded = wrapper.load_state_dict(torch.jit.load(str(traced_path), map_location="cuda").state_dict(), strict=False)
        assert not loaded.missing_keys, f"the traced archive lacks {loaded.missing_keys[:3]}"
    inputs = inputs_for(model, policy, models.SEED)
    timed, ctx = {}, {}
    flush = flush_buffer()

    def check(key, m):
        """The mode's largest error over the verification inputs, against fp64."""
        res[ERR_KEY[key]] = max(rel_err(m(*x), r) for x, r in zip(ctx["trials"], ctx["refs"]))

    def reference():
        trials = [inputs_for(model, policy, 1000 + i) for i in range(VERIFY_INPUTS)]
        ref = copy.deepcopy(wrapper).double()
        ctx["refs"] = [ref(*[x.double() if x.is_floating_point() else x for x in xs]) for xs in trials]
        ctx["trials"] = trials
        del ref
        torch.cuda.empty_cache()

    def eager():
        check("eager", wrapper)
        timed["eager_ms"] = wrapper

    def traced():
        m = torch.jit.load(str(traced_path), map_location="cuda")
        check("traced", m)
        timed["traced_ms"] = m

    def compiled():
        m, res["compile_s"] = compile_timed(wrapper, inputs)
        check("compile", m)
        timed["compile_ms"] = m

    def fact():
        d = out / "fact" / t
        if not (d / "composed.pt").exists():
            # fact substituted nothing (every pattern's winner lost to torch, or none matched):
            # what the user runs is the traced module, timed as fact's in turn with the others.
            m = torch.jit.load(str(traced_path), map_location="cuda")
            res["fact_ops"], res["calls_by_kernel"], res["calls_by_kind"] = [], {}, {}
            res["kernel_calls"] = res["fallback_calls"] = 0
            res["fact_note"] = "fact compose substituted nothing: fact's module is the traced one"
            check("fact", m)
            timed["fact_ms"] = m
            return
        torch.ops.load_library(str(d / "libfact_ops.so"))
        m = torch.jit.load(str(d / "composed.pt"), map_location="cuda")
        res["fact_ops"] = fact_ops(m)
        ctx["lib"] = lib = OpLibrary(d / "libfact_ops.so")
        # The op counters of one forward of the traced inputs: what the composed module does at
        # the shape it was composed for.
        m(*inputs)
        torch.cuda.synchronize()
        lib.reset()
        m(*inputs)
        torch.cuda.synchronize()
        calls = lib.stats()
        res["calls_by_kernel"] = calls
        res["kernel_calls"] = sum(c["ran"] for c in calls.values())
        res["fallback_calls"] = sum(c["fell_back"] for c in calls.values())
        kinds = {p["kernel"]: pattern_kind(p) for p in (substituted(d / "compose.json") or [])}
        by_kind = {}
        for kernel, c in calls.items():
            k = by_kind.setdefault(kinds.get(kernel, "unknown"), {"kernel_calls": 0, "fallback_calls": 0})
            k["kernel_calls"] += c["ran"]
            k["fallback_calls"] += c["fell_back"]
        res["calls_by_kind"] = by_kind
        check("fact", m)
        timed["fact_ms"] = m

    def timing():
        res.update(time_interleaved(timed, inputs, flush))
        res["timing"] = f"interleaved: {', '.join(timed)} in turns, {ITERATIONS} iterations, L2 flushed, median"

    def kind_ablations():
        present = present_kinds(res["fact_ops"])
        if len(present) >= 2:
            res["ablations"] = []
            ablations(ctx["lib"], timed["fact_ms"], present, ctx["trials"][0], ctx["refs"][0], inputs, flush, res["ablations"])

    def profiles():
        # Per kernel, for fact's module and the modes beside it: where each one's time goes.
        res["profile"] = {MODE_OF[k]: kernel_profile(m, inputs) for k, m in timed.items()}

    def max_autotune():
        m, res["max_autotune_compile_s"] = compile_timed(wrapper, inputs, mode="max-autotune")
        check("max-autotune", m)
        # In turns with fact's module where there is one: the max-autotune ratio is of this pair.
        pair = {"max_autotune_ms": m}
        if "fact_ms" in timed:
            pair["fact_ms_beside_max_autotune"] = timed["fact_ms"]
        res.update(time_interleaved(pair, inputs, flush))

    with torch.no_grad():
        stages.run("reference", reference)
        if "refs" not in ctx:
            return
        if "eager" in modes:
            stages.run("eager", eager)
        elif with_fact or "max-autotune" in modes:
            # Not timed, but fact's error is judged against eager's (fact_err_flagged).
            stages.run("eager_err", lambda: check("eager", wrapper))
        if "traced" in modes and traced_path.exists():
            stages.run("traced", traced)
        if "compile" in modes:
            stages.run("compile", compiled)
        if with_fact:
            stages.run("fact", fact)
        # fact_ms is fact timed in turns with eager, traced or torch.compile; a call that brings
        # only max-autotune beside fact times fact there alone (fact_ms_beside_max_autotune).
        if timed and (set(timed) != {"fact_ms"} or "max-autotune" not in modes):
            stages.run("timing", timing)
        if "ablations" in extras and "fact_ms" in timed:
            stages.run("ablations", kind_ablations)
        if "profile" in extras and timed:
            stages.run("profile", profiles)
        # Last: its compile takes minutes, and a timeout then keeps what was measured before it.
        if "max-autotune" in modes:
            stages.run("max_autotune", max_autotune)


# The parent: one pair at a time, children for the GPU work, fact compose between them.


class Deadline:
    def __init__(self, budget_s):
        self.end = None if budget_s is None else time.monotonic() + budget_s

    def left(self):
        return None if self.end is None else self.end - time.monotonic()

    def timeout(self, own):
        """A stage's time limit: its own, or less where the budget has less left."""
        left = self.left()
        return own if left is None else max(1.0, min(own, left))


def table_entries(path):
    try:
        return len(json.loads(Path(path).read_text())["entries"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def gpu_name():
    """The GPU's name from nvidia-smi (the parent keeps CUDA uninitialised); None without one."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                               timeout=30).stdout.split("\n")
        return names[0].strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def fact_version(fact):
    try:
        return subprocess.run([str(fact), "--version"], capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# What each mode's stages write into a record, and the stages whose errors a rerun of it clears.
MODE_FIELDS = {
    "eager": ["eager_ms", "eager_err"],
    "traced": ["traced_ms", "traced_err"],
    "compile": ["compile_ms", "compile_err", "compile_s"],
    "max-autotune": ["max_autotune_ms", "max_autotune_err", "max_autotune_compile_s", "fact_ms_beside_max_autotune"],
    "fact": ["fact_ms", "fact_err", "kernel_calls", "fallback_calls", "calls_by_kind", "calls_by_kernel", "patterns_by_kind",
             "substituted", "fact_ops", "compose_s", "compose_table_entries_before", "ablations"],
}
# What the trace and compose stages write: a --stage measure call keeps them from the record.
STAGED_FIELDS = ["inputs", "trace_s", "substituted", "patterns_by_kind", "compose_s", "compose_table_entries_before",
                 "fact_note"]
STAGED_ERRORS = ["trace", "compose"]
# `profile` (--profile) is per mode, {mode: kernel_profile}: a call's modes clear and refill their
# own entries and keep the other modes' of earlier calls, as their other fields.
MODE_STAGES = {"eager": ["eager"], "traced": ["traced"], "compile": ["compile"], "max-autotune": ["max_autotune"],
               "fact": ["compose", "fact", "ablations", "profile"]}
CALL_STAGES = ["trace", "measure", "reference", "eager_err", "timing"]
# The modes fact_ms is timed in turns with (see child_measure).
TURN_MODES = {"eager", "traced", "compile"}


def same_card(rec, env):
    """Whether a record's numbers came from this call's kind of GPU (unknown without nvidia-smi:
    taken as the same)."""
    return env["gpu"] is None or rec.get("gpu") == env["gpu"]


def done(rec, modes):
    """Whether a record already holds every time `modes` measure (--resume)."""
    keys = [MS_KEY[m] for m in modes if m != "fact" or TURN_MODES & set(modes) or "max-autotune" not in modes]
    if "fact" in modes and "max-autotune" in modes:
        keys.append("fact_ms_beside_max_autotune")
    return rec is not None and all(rec.get(k) is not None for k in keys)


def start_record(old, model, policy, modes, command, env, stage="all"):
    """The record a call starts from: the one an earlier call into the same OUT left (its other
    modes' numbers kept), with this call's modes' fields and errors cleared; a new one otherwise.
    `commands` lists every call that wrote into it."""
    rec = {
        "model": model.name, "family": model.family, "what": model.what, "policy": policy, "gpu": None,
        "inputs": None, "batch": model.batch, "seq": model.seq, "tolerance": TOLERANCE[policy], "trace_s": None,
        **{k: None for fields in MODE_FIELDS.values() for k in fields},
        "profile": None, "errors": {}, "commands": [],
    }
    rec.update(old or {})
    profile = {m: p for m, p in (rec["profile"] or {}).items() if m not in modes}
    rec["profile"] = profile or None
    # A measure stage keeps what the compose stage before it wrote.
    keep = STAGED_FIELDS + STAGED_ERRORS if stage == "measure" else []
    for mode in modes:
        fields = MODE_FIELDS[mode]
        if not TURN_MODES & set(modes):
            # fact_ms belongs with the modes it was timed beside, which this call does not time.
            fields = [k for k in fields if k != "fact_ms"]
        rec.update({k: None for k in fields if k not in keep})
    for name in [n for mode in modes for n in MODE_STAGES[mode]] + CALL_STAGES:
        if name not in keep:
            rec["errors"].pop(name, None)
    rec.update(versions())
    rec["fact"] = env["fact_version"] or rec.get("fact")
    rec["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rec["command"] = command
    rec["commands"] = rec["commands"] + [command]
    return rec


def run_pair(args, model, policy, deadline, env, command):
    """Traces, composes and measures one (model, policy) pair; writes its record as it goes."""
    out, t = args.out, tag(model.name, policy)
    record_path = out / "records" / f"{t}.json"
    old = json.loads(record_path.read_text()) if record_path.exists() else None
    if old and not same_card(old, env):
        # Numbers of two cards in one record would compare across them: start afresh.
        log(f"{t}: the record in {record_path} is of {old.get('gpu')}, this is {env['gpu']}: starting a new one")
        old = None
    rec = start_record(old, model, policy, args.modes, command, env, args.stage)
    rec["gpu"] = env["gpu"]

    def save():
        write_json(record_path, rec)

    def child(kind, extra, timeout):
        cmd = [sys.executable, str(Path(__file__).resolve()), str(out), "--child", kind, model.name, policy] + extra
        log_path = out / "logs" / f"{t}.{kind}.log"
        limit = deadline.timeout(timeout)
        rc, _ = run_logged(cmd, log_path, limit)
        if rc is None:
            rec["errors"][kind] = f"timed out after {limit:.0f} s (logs/{t}.{kind}.log)"
        elif rc != 0:
            rec["errors"].setdefault(kind, f"exited with {rc}: {last_error(log_path)} (logs/{t}.{kind}.log)")

    save()
    with_trace = bool({"traced", "fact"} & set(args.modes))
    traced_pt = out / "models" / f"{t}.pt"
    fact_dir = out / "fact" / t
    if args.stage == "measure":
        # What --stage compose left: measured as it is, nothing traced or composed again.
        composed = (fact_dir / "composed.pt").exists() and (fact_dir / "libfact_ops.so").exists() or bool(rec.get("fact_note"))
        if with_trace and not traced_pt.exists():
            rec["errors"]["measure"] = f"no traced module at {traced_pt}: run --stage compose into this OUT first"
        return measure_pair(args, rec, t, composed and traced_pt.exists(), child, save)
    traced_pt.unlink(missing_ok=True)
    if with_trace:
        info = out / "work" / f"{t}.trace.json"
        info.unlink(missing_ok=True)
        child("trace", [], args.trace_timeout)
        if info.exists():
            rec.update(json.loads(info.read_text()))
        save()

    composed = False
    if "fact" in args.modes and traced_pt.exists():
        shutil.rmtree(fact_dir, ignore_errors=True)
        cmd = [str(args.fact), "compose", str(traced_pt), "--out", str(fact_dir), "--no-bench", "--json",
               "--precision", FACT_PRECISION[policy]] + shlex.split(args.fact_args)
        rec["compose_table_entries_before"] = table_entries(env["FACT_TABLE"])
        rc, rec["compose_s"] = run_logged(cmd, out / "logs" / f"{t}.compose.log", deadline.timeout(args.compose_timeout),
                                          stdout_path=out / "logs" / f"{t}.compose.json")
        subst = substituted(fact_dir / "compose.json")
        if subst is not None:
            rec["patterns_by_kind"] = {}
            for p in subst:
                p["kind"] = pattern_kind(p)
                rec["patterns_by_kind"][p["kind"]] = rec["patterns_by_kind"].get(p["kind"], 0) + 1
            rec["substituted"] = subst
        composed = rc == 0 and (fact_dir / "composed.pt").exists() and (fact_dir / "libfact_ops.so").exists()
        # A compose that ran and substituted nothing (its report says why, pattern by pattern)
        # leaves the traced module as fact's: it is measured as such, with no kernel calls.
        nothing = rc == 0 and not composed and subst == []
        if rc is None:
            rec["errors"]["compose"] = f"fact compose timed out after {rec['compose_s']:.0f} s (logs/{t}.compose.log)"
        elif rc != 0:
            why = last_error(out / "logs" / f"{t}.compose.log")
            rec["errors"]["compose"] = f"fact compose exited with {rc}: {why} (logs/{t}.compose.log)"
        elif nothing:
            rec["fact_note"] = "fact compose substituted nothing: fact's module is the traced one"
            composed = True
        elif not composed:
            rec["errors"]["compose"] = f"fact compose wrote no composed.pt (logs/{t}.compose.log)"
        save()
    if args.stage == "compose":
        return rec
    return measure_pair(args, rec, t, composed, child, save)


def measure_pair(args, rec, t, composed, child, save):
    """The measuring child of one pair (every mode asked for; fact where `composed`), its results
    into the record."""
    out = args.out
    measured_modes = [m for m in args.modes if m != "fact" or composed]
    if measured_modes:
        result = out / "work" / f"{t}.measure.json"
        result.unlink(missing_ok=True)
        extra = ["--modes", ",".join(args.modes)] + (["--with-fact"] if composed else []) + [f"--{k}" for k in EXTRAS if getattr(args, k)]
        child("measure", extra, args.measure_timeout)
        measured = json.loads(result.read_text()) if result.exists() else {}
        for stage, msg in measured.pop("errors", {}).items():
            rec["errors"][stage] = msg
        rec["gpu"] = rec["gpu"] or measured.get("torch_device")
        if measured.get("profile"):
            rec["profile"] = {**(rec["profile"] or {}), **measured.pop("profile")}
        if measured.get("timing"):
            rec["timings"] = rec.get("timings", []) + [measured.pop("timing")]
        rec.update(measured)
    save()
    return rec


def assemble(out, fact):
    """OUT/zoo.json from every record under OUT/records (zoo order, then policy), and its figure."""
    order = {m.name: i for i, m in enumerate(models.MODELS)}
    records = [json.loads(p.read_text()) for p in (out / "records").glob("*.json")]
    records.sort(key=lambda r: (order.get(r["model"], len(order)), POLICIES.index(r["policy"]) if r["policy"] in POLICIES else 9))
    gpus = sorted({r["gpu"] for r in records if r.get("gpu")})
    meta = {"device": ", ".join(gpus), **versions(), "date": datetime.date.today().isoformat()}
    write_json(out / "zoo.json", {"meta": meta, "records": records})
    if fact and Path(fact).exists() and any(r.get("fact_ms") and r.get("compile_ms") for r in records):
        subprocess.run([str(fact), "plot-e2e", str(out / "zoo.json"), "--over", "torch.compile", "--out", str(out / "zoo.svg"),
                        "--title", "the zoo: fact and torch.compile max-autotune over torch.compile (default)"], check=False)
    return records


def fact_err_flagged(r):
    """Whether fact's error fails issue 31's criterion: over the policy's tolerance and over twice
    eager's own error against fp64 (or eager's is unknown). Deep bf16 models exceed the tolerance
    in eager itself; fact within 2x of eager there is as accurate as the model allows. NaN fails."""
    err = r.get("fact_err")
    if err is None:
        return False
    tol = r.get("tolerance") or TOLERANCE.get(r["policy"], 0)
    eager = r.get("eager_err")
    return not err <= tol and (eager is None or not err <= 2 * eager)


def summary(records):
    log("\nfact over torch.compile (default) = compile_ms / fact_ms; '!' marks a fact error over the policy's tolerance "
        "and over 2x eager's own error against fp64 (or eager's unknown)")
    head = (f"{'model':20} {'policy':6} {'eager':>8} {'traced':>8} {'compile':>8} {'autotune':>8} {'fact':>8} "
            f"{'x compile':>9} {'fact err':>9} {'calls':>11} {'compose s':>9}  errors")
    log(head)
    log("-" * len(head))
    for r in records:
        err = r.get("fact_err")
        flag = "!" if fact_err_flagged(r) else " "
        ratio = r["compile_ms"] / r["fact_ms"] if r.get("compile_ms") and r.get("fact_ms") else None
        calls = "-" if r.get("kernel_calls") is None else f"{r['kernel_calls']}/{r['fallback_calls']}"
        log(f"{r['model']:20} {r['policy']:6} {fmt(r.get('eager_ms')):>8} {fmt(r.get('traced_ms')):>8} {fmt(r.get('compile_ms')):>8} "
            f"{fmt(r.get('max_autotune_ms')):>8} {fmt(r.get('fact_ms')):>8} {fmt(ratio, '.2f'):>9} {fmt(err, '.2e'):>8}{flag} "
            f"{calls:>11} {fmt(r.get('compose_s'), '.0f'):>9}  {'; '.join(f'{k}: {v}' for k, v in r.get('errors', {}).items())[:200]}")
    for policy in POLICIES:
        ratios = [r["compile_ms"] / r["fact_ms"] for r in records if r["policy"] == policy and r.get("compile_ms") and r.get("fact_ms")]
        if ratios:
            log(f"geomean fact over torch.compile, {policy}: {geomean(ratios):.2f}x over {len(ratios)} models")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--policies", default="tf32,bf16", help="comma-separated, of tf32,f32,bf16")
    ap.add_argument("--models", help="comma-separated zoo models (default: all; `python3 benches/zoo/models.py --list`)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {','.join(MODES)}")
    ap.add_argument("--fact", type=Path, default=REPO / ".device" / "fact", help="the fact binary")
    ap.add_argument("--fact-args", default="", help="extra arguments for fact compose, e.g. '--jobs 16'")
    ap.add_argument("--budget-s", type=float, help="seconds for the whole call: no pair starts after, a running stage stops")
    ap.add_argument("--table", type=Path, help="FACT_TABLE, the user pattern table (default OUT/user_table.json)")
    ap.add_argument("--seed-table", type=Path, help="a user table (or .json.gz) to start from when the table does not exist yet")
    ap.add_argument("--cache-dir", type=Path, help="FACT_CACHE_DIR, the kernel build cache (default /tmp/fact-cache)")
    ap.add_argument("--trace-timeout", type=float, default=300, help="seconds per trace")
    ap.add_argument("--compose-timeout", type=float, default=1800, help="seconds per fact compose")
    ap.add_argument("--measure-timeout", type=float, default=900, help="seconds per measuring child")
    ap.add_argument("--ablations", action="store_true", help="also time fact with each pattern kind turned off")
    ap.add_argument("--profile", action="store_true", help="also record each timed module's kernels (torch.profiler): where its time goes")
    ap.add_argument("--stage", choices=["all", "compose", "measure"], default="all",
                    help="compose: trace and compose only; measure: measure what a compose stage left in OUT")
    ap.add_argument("--resume", action="store_true", help="skip pairs whose record in OUT already has every time the modes measure")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "MODEL", "POLICY"), help=argparse.SUPPRESS)
    ap.add_argument("--with-fact", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out = args.out.resolve()
    args.modes = args.modes.split(",")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if bad := [m for m in args.modes if m not in MODES]:
        ap.error(f"unknown modes {bad}: use {','.join(MODES)}")
    if args.child:
        kind, name, policy = args.child
        if kind == "trace":
            child_trace(args.out, name, policy)
        else:
            extras = {k for k in EXTRAS if getattr(args, k)}
            child_measure(args.out, name, policy, args.modes, args.with_fact, extras)
        return

    policies = args.policies.split(",")
    if bad := [p for p in policies if p not in POLICIES]:
        ap.error(f"unknown policies {bad}: use {','.join(POLICIES)}")
    zoo = models.select(args.models)
    if "fact" in args.modes and not args.fact.exists():
        ap.error(f"{args.fact} not found: stage the fact binary (../shared/tools/device-stage) or pass --fact")
    for sub in ("models", "fact", "logs", "work", "records"):
        (args.out / sub).mkdir(parents=True, exist_ok=True)
    table = (args.table or args.out / "user_table.json").resolve()
    if args.seed_table and not table.exists():
        if args.seed_table.suffix == ".gz":  # as benches/results keeps a user table
            with gzip.open(args.seed_table, "rb") as src, open(table, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copy(args.seed_table, table)
    os.environ["FACT_TABLE"] = str(table)
    os.environ["FACT_CACHE_DIR"] = str(args.cache_dir or os.environ.get("FACT_CACHE_DIR", "/tmp/fact-cache"))
    os.environ.setdefault("FACT_SHIPPED_TABLE", str(REPO / "pattern-table" / "table.json"))
    env = {"FACT_TABLE": str(table), "fact_version": fact_version(args.fact) if "fact" in args.modes else None, "gpu": gpu_name()}
    command = shlex.join(["python3", "benches/zoo/run.py"] + sys.argv[1:])

    deadline = Deadline(args.budget_s)
    pairs = [(m, p) for m in zoo for p in policies]
    log(f"{len(pairs)} pairs ({len(zoo)} models x {','.join(policies)}; modes {','.join(args.modes)}) into {args.out}")
    for i, (model, policy) in enumerate(pairs):
        left = deadline.left()
        if left is not None and left <= 0:
            rest = ", ".join(tag(m.name, p) for m, p in pairs[i:])
            log(f"budget of {args.budget_s:.0f} s spent: {len(pairs) - i} pairs not started: {rest}")
            break
        record_path = args.out / "records" / f"{tag(model.name, policy)}.json"
        old = json.loads(record_path.read_text()) if record_path.exists() else None
        if args.resume and done(old, args.modes) and same_card(old, env):
            log(f"{tag(model.name, policy)}: {record_path} has every time of {','.join(args.modes)} (--resume): skipped")
            continue
        start = time.monotonic()
        rec = run_pair(args, model, policy, deadline, env, command)
        errors = "; ".join(f"{k}: {v}" for k, v in rec["errors"].items())
        log(f"{tag(model.name, policy)} ({time.monotonic() - start:.0f} s): eager {fmt(rec['eager_ms'])} compile {fmt(rec['compile_ms'])} "
            f"max-autotune {fmt(rec['max_autotune_ms'])} fact {fmt(rec['fact_ms'])} ms, fact err {fmt(rec['fact_err'], '.2e')}, "
            f"calls {rec['kernel_calls']}/{rec['fallback_calls']}, compose {fmt(rec['compose_s'], '.0f')} s" + (f" | {errors}" if errors else ""))
        assemble(args.out, None)
    summary(assemble(args.out, args.fact))


if __name__ == "__main__":
    main()
