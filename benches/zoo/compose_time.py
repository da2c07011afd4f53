"""How long a user waits for fact's first composed forward: cold and warm composes of zoo models on
the GPU machine, phase by phase (issue 53), and each phase's composed program against
torch.compile in one measuring process. Owns the compose-time records; the measuring itself is
benches/device/harness.py's and the models are benches/zoo/models.py's.

From the repository root on the GPU machine, after `source .device/env.sh`:

    python3 benches/zoo/compose_time.py OUT [--models gpt2,llama] [--fact .device/fact]
        [--budget-s 540] [--fact-args '--jobs 16'] [--no-warm] [--dry-run]

For each model, in bf16 (the model and its float inputs in bfloat16; fact composes under tf32,
which bf16 tensors do not feel):

- models/NAME.pt2: the wrapper built on the GPU and exported with torch.export as models.py's
  `export` does (strict=False, batch and sequence dims left to Dim.AUTO), in a child process.
- A cold compose: `fact compose models/NAME.pt2 --out fact/NAME --no-bench --torchscript-copy
  --json` (the copy is what `fact.load` runs eagerly), with an empty
  build cache (FACT_CACHE_DIR=cache/NAME, emptied first), an empty user table
  (FACT_TABLE=tables/NAME.json, removed first), the repository's shipped table
  (FACT_SHIPPED_TABLE=pattern-table/table.json) and the shared compile cache off
  (FACT_SCCACHE=off), so nothing comes from an earlier compose or another machine. When stderr
  says phase 1 is done, its output (composed.pt2, libfact_ops.so, compose.json) is copied to
  fact/NAME.quick/ before phase 2 may rewrite it. Logs: logs/NAME.cold.log (stderr),
  logs/NAME.cold.json (stdout).
- A warm compose of the same model into fact/NAME.warm with the same table and build cache.
- One measuring child per phase's output (a process holds one fact op library): the composed
  program (torch.export.load(...).module() after torch.ops.load_library) and torch.compile of
  the eager wrapper (its first call's seconds: compile_s), timed in turns (harness.time_interleaved,
  L2 flushed, CUDA events, medians).

Records: compose/NAME.json, a list of rows, one per phase of the cold compose (`quick`, `full`)
and one for the warm compose (`warm`), each with exactly the fields model, policy, gpu, cores,
fact_commit, phase, wall_s, nvcc_s, kernels, fact_ms (the composed program eagerly), fact_load_ms
(what `fact.load` returns, its TorchScript copy, eagerly),
fact_compile_ms (under torch.compile), compile_ms, compile_s. A phase's wall_s,
nvcc_s and kernels are compose.json's `phases` record of it (phase 1's wall from the command's
start, loading and planning included; phase 2's its own); the warm row's wall_s is the whole
command as the harness timed it, its fact_ms, fact_compile_ms and compile times null (its kernels are the full
phase's). A cold compose whose every pattern the tables answer has no full phase: its quick row
is the final model. compose/NAME.meta.json keeps what the rows do not: commands, the export's
seconds, the cold command's whole wall, errors, and host_load (the process's cores, the host's,
and its load averages when the cold compose started, when phase 1 was done and when it ended:
whether another job shared the host). Both are written after every stage, so a call
cut short by its budget keeps what it measured. --budget-s (default 540, a 9-minute device call
for one model) bounds the whole call: a stage gets what is left of it, and the warm compose runs
before the measurements.

--dry-run needs no GPU: it exports the model at the CI size on the CPU, prints the commands and
environment of the composes, and writes the records with nothing measured.
"""
import argparse
import datetime
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import models

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benches" / "device"))
sys.path.insert(0, str(REPO / "python"))
import fact  # noqa: E402 -- fact's Python package: its load_library readies the ops for Inductor too
from harness import FACT_PRECISION, log, run_logged, write_json  # noqa: E402 -- the shared harness

POLICY = "bf16"
FIELDS = ("model", "policy", "gpu", "cores", "fact_commit", "phase", "wall_s", "nvcc_s", "kernels", "fact_ms",
          "fact_load_ms", "fact_compile_ms", "compile_ms", "compile_s")
OUTPUTS = ("torchscript/composed.pt", "composed.pt2", "libfact_ops.so", "compose.json")
PHASE_ONE_DONE = re.compile(r"^phase 1 of 2 done")


class Deadline:
    def __init__(self, budget_s):
        self.end = time.monotonic() + budget_s

    def left(self):
        return self.end - time.monotonic()

    def timeout(self, own):
        return max(1.0, min(own, self.left()))


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout
        return out.split("\n")[0].strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def fact_commit(fact):
    """The commit `fact --version` names: `fact 0.1.0 (abc1234)`."""
    try:
        out = subprocess.run([str(fact), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"\(([0-9a-f]+)\)", out)
    return m.group(1) if m else None


def resolve(spec):
    """A zoo model by name, or `NAME@BxT` (`NAME@B` for images): the model at another batch and
    sequence length, so that its problems are new to the shipped table (issue 53's models new to
    the table); its files and rows are named by the spec."""
    import dataclasses

    name, _, shape = spec.partition("@")
    model = models.select(name)[0]
    if not shape:
        return model
    batch, _, seq = shape.partition("x")
    if (model.seq is None) != (not seq):
        raise SystemExit(f"{spec}: give {name} as {name}@{'B' if model.seq is None else 'BxT'}")
    return dataclasses.replace(model, name=spec, batch=int(batch), seq=int(seq) if seq else None)


def inputs_for(model, ci, device):
    """The model's inputs, float ones in bf16 (as benches/zoo/run.py's bf16 policy has them)."""
    import torch

    xs = model.inputs(ci=ci, device=device, seed=models.SEED)
    return tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in xs)


# The children: the export and each phase's measurement, each in a process of its own.


def child_export(out, name, ci):
    import torch

    model = resolve(name)
    device = "cpu" if ci else "cuda"
    start = time.monotonic()
    module = models.build(model, ci=ci, device=device, dtype=torch.bfloat16)
    inputs = inputs_for(model, ci, device)
    error = models.export(model, module, inputs, str(out / "models" / f"{name}.pt2"))
    write_json(out / "work" / f"{name}.export.json",
               {"export_s": time.monotonic() - start, "error": error, "inputs": models.describe_inputs(inputs)})


def child_measure(out, name, folder):
    """fact's composed program in `folder`, eagerly and under torch.compile (where a user compiles
    it, and where the host does not hide its kernels), against torch.compile of the eager model,
    in turns; writes work/NAME.<folder name>.measure.json."""
    import torch

    sys.path.insert(0, str(REPO / "benches" / "device"))
    from harness import compile_timed, flush_buffer, time_interleaved

    model = resolve(name)
    folder = Path(folder)
    res = {}
    path = out / "work" / f"{name}.{folder.name}.measure.json"
    wrapper = models.build(model, ci=False, device="cuda", dtype=torch.bfloat16)
    inputs = inputs_for(model, False, "cuda")
    with torch.no_grad():
        fact.load_library(folder / "libfact_ops.so")
        fact_module = torch.export.load(str(folder / "composed.pt2")).module()
        fact_module(*inputs)
        # What fact.load gives a user: the TorchScript copy where compose wrote it.
        loaded = fact.load(folder)
        timed = {"fact_ms": fact_module}
        if isinstance(loaded, fact.Composed):
            timed["fact_load_ms"] = loaded
        compiled, res["compile_s"] = compile_timed(wrapper, inputs)
        fact_compiled, _ = compile_timed(fact_module, inputs)
        timed.update({"fact_compile_ms": fact_compiled, "compile_ms": compiled})
        res.update(time_interleaved(timed, inputs, flush_buffer()))
    write_json(path, res)


# The parent.


def compose_streaming(cmd, env, log_path, stdout_path, timeout_s, on_line):
    """Runs cmd from the repo root in a process group of its own, stderr into log_path line by line
    (each passed to `on_line` as it comes), stdout into stdout_path. (exit code or None when it
    ran past timeout_s, seconds)."""
    lines = queue.Queue()
    start = time.monotonic()
    with open(log_path, "w") as log_file, open(stdout_path, "w") as stdout:
        log_file.write(f"$ {shlex.join(cmd)}\n")
        log_file.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True,
                                process_group=0)

        def pump():
            for line in proc.stderr:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        rc = None
        while True:
            left = timeout_s - (time.monotonic() - start)
            if left <= 0:
                break
            try:
                line = lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                rc = proc.wait()
                break
            log_file.write(line)
            log_file.flush()
            on_line(line.rstrip("\n"))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        seconds = time.monotonic() - start
        log_file.write(f"\n# exit {rc} after {seconds:.1f} s\n")
    return rc, seconds


def phase_rows(report):
    """compose.json's phases as {phase: (wall_s, nvcc_s, kernels)}."""
    return {p["phase"]: (p["seconds"], p["nvcc_s"], p["kernels"]) for p in (report or {}).get("phases", [])}


def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def run_model(args, model, deadline, env0):
    out, name = args.out, model.name
    rows = {}
    meta = {"model": name, "policy": POLICY, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commands": {}, "errors": {}}
    base = {"model": name, "policy": POLICY, "gpu": env0["gpu"], "cores": len(os.sched_getaffinity(0)), "fact_commit": env0["commit"]}

    def row(phase, **fields):
        r = rows.setdefault(phase, {k: None for k in FIELDS} | base | {"phase": phase})
        r.update(fields)

    def save():
        order = [p for p in ("quick", "full", "warm") if p in rows]
        write_json(out / "compose" / f"{name}.json", [rows[p] for p in order])
        write_json(out / "compose" / f"{name}.meta.json", meta)

    def child(kind, extra, timeout, log_name):
        # The extra positionals go beside OUT: argparse takes every positional at the first one.
        cmd = [sys.executable, "-u", str(Path(__file__).resolve()), str(out)] + extra + ["--child", kind, name]
        rc, _ = run_logged(cmd, out / "logs" / log_name, deadline.timeout(timeout))
        return rc

    save()
    pt2 = out / "models" / f"{name}.pt2"
    pt2.unlink(missing_ok=True)
    rc = child("export", ["--ci"] if args.dry_run else [], 600, f"{name}.export.log")
    exported = read_json(out / "work" / f"{name}.export.json") or {}
    meta["export_s"] = exported.get("export_s")
    if rc != 0 or exported.get("error") or not pt2.exists():
        meta["errors"]["export"] = exported.get("error") or f"exited with {rc} (logs/{name}.export.log)"
        save()
        return
    save()

    fact_dir, quick_dir, warm_dir = out / "fact" / name, out / "fact" / f"{name}.quick", out / "fact" / f"{name}.warm"
    cache, table = out / "cache" / name, out / "tables" / f"{name}.json"
    for d in (fact_dir, quick_dir, warm_dir, cache):
        shutil.rmtree(d, ignore_errors=True)
    table.unlink(missing_ok=True)
    env = dict(os.environ, FACT_CACHE_DIR=str(cache), FACT_TABLE=str(table),
               FACT_SHIPPED_TABLE=str(REPO / "pattern-table" / "table.json"), FACT_SCCACHE="off")

    def compose_cmd(folder):
        return [str(args.fact), "compose", str(pt2), "--out", str(folder), "--no-bench", "--torchscript-copy", "--json",
                "--precision", FACT_PRECISION[POLICY]] + shlex.split(args.fact_args)

    cold = compose_cmd(fact_dir)
    meta["commands"]["cold"] = shlex.join(cold)
    meta["commands"]["warm"] = shlex.join(compose_cmd(warm_dir))
    meta["environment"] = {k: env[k] for k in ("FACT_CACHE_DIR", "FACT_TABLE", "FACT_SHIPPED_TABLE", "FACT_SCCACHE")}
    if args.dry_run:
        log(f"{name}: exported to {pt2} (CI size, CPU); would run, with {meta['environment']}:\n  {meta['commands']['cold']}\n"
            f"  {meta['commands']['warm']}")
        save()
        return

    def on_line(line):
        if PHASE_ONE_DONE.match(line):
            quick_dir.mkdir(parents=True, exist_ok=True)
            for f in OUTPUTS:
                if (fact_dir / f).exists():
                    (quick_dir / f).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(fact_dir / f, quick_dir / f)
            meta["phase_one_seen_s"] = time.monotonic() - started
            meta["host_load"]["phase_one_done"] = os.getloadavg()

    # The host's load averages (1, 5, 15 min) around the cold compose: a compile batch on cores
    # another job shares runs slower, and the record says whether one did.
    meta["host_load"] = {"cores": len(os.sched_getaffinity(0)), "host_cpus": os.cpu_count(), "cold_start": os.getloadavg()}
    started = time.monotonic()
    rc, meta["cold_wall_s"] = compose_streaming(cold, env, out / "logs" / f"{name}.cold.log",
                                                out / "logs" / f"{name}.cold.json", deadline.timeout(args.compose_timeout),
                                                on_line)
    meta["host_load"]["cold_end"] = os.getloadavg()
    report = read_json(fact_dir / "compose.json")
    if rc != 0:
        meta["errors"]["cold"] = f"fact compose exited with {rc} after {meta['cold_wall_s']:.0f} s (logs/{name}.cold.log)"
    phases = phase_rows(report)
    for phase, (wall, nvcc, kernels) in phases.items():
        row(phase, wall_s=wall, nvcc_s=nvcc, kernels=kernels)
    if not quick_dir.exists() and report and report.get("phase") == "full" and len(phases) == 1:
        # One phase only (every pattern from the tables): its output is the quick and the final one.
        shutil.copytree(fact_dir, quick_dir, dirs_exist_ok=True)
    save()

    if not args.no_warm and rc == 0:
        cmd = compose_cmd(warm_dir)
        # The cold compose's environment: its build cache and user table are what make this one warm.
        rc_w, wall = run_logged(cmd, out / "logs" / f"{name}.warm.log", deadline.timeout(args.compose_timeout),
                                stdout_path=out / "logs" / f"{name}.warm.json", env=env)
        warm = read_json(warm_dir / "compose.json")
        if rc_w == 0 and warm:
            row("warm", wall_s=wall, nvcc_s=sum(p["nvcc_s"] for p in warm.get("phases", [])),
                kernels=sum(p["kernels"] for p in warm.get("phases", [])))
        else:
            meta["errors"]["warm"] = f"fact compose exited with {rc_w} (logs/{name}.warm.log)"
        save()

    for phase, folder in (("quick", quick_dir), ("full", fact_dir)):
        if phase not in rows or not (folder / "composed.pt2").exists():
            if phase in rows:
                meta["errors"][f"measure_{phase}"] = f"no composed.pt2 in {folder}: fact substituted nothing"
            continue
        if deadline.left() < 30:
            meta["errors"][f"measure_{phase}"] = "budget spent"
            break
        result = out / "work" / f"{name}.{folder.name}.measure.json"
        result.unlink(missing_ok=True)
        log_name = f"{name}.measure_{phase}.log"
        rc = child("measure", [str(folder)], args.measure_timeout, log_name)
        measured = read_json(result)
        if measured:
            row(phase, **{k: measured.get(k) for k in ("fact_ms", "fact_load_ms", "fact_compile_ms", "compile_ms", "compile_s")})
        else:
            meta["errors"][f"measure_{phase}"] = f"exited with {rc} (logs/{log_name})"
        save()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--models", default="gpt2", help="comma-separated zoo models (`python3 benches/zoo/models.py --list`), "
                    "each NAME or NAME@BxT (NAME@B for images) for the model at another batch and length")
    ap.add_argument("--fact", type=Path, default=REPO / ".device" / "fact", help="the fact binary")
    ap.add_argument("--fact-args", default="", help="extra arguments for fact compose, e.g. '--jobs 16'")
    ap.add_argument("--budget-s", type=float, default=540, help="seconds for the whole call")
    ap.add_argument("--compose-timeout", type=float, default=1800, help="seconds per fact compose")
    ap.add_argument("--measure-timeout", type=float, default=600, help="seconds per measuring child")
    ap.add_argument("--no-warm", action="store_true", help="skip the warm compose")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: export at the CI size on the CPU and print the commands")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "MODEL"), help=argparse.SUPPRESS)
    ap.add_argument("--ci", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out = args.out.resolve()
    args.fact = args.fact.resolve()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.child:
        kind, name = args.child
        if kind == "export":
            child_export(args.out, name, args.ci)
        else:
            child_measure(args.out, name, args.rest[0])
        return
    for sub in ("models", "fact", "logs", "work", "compose", "cache", "tables"):
        (args.out / sub).mkdir(parents=True, exist_ok=True)
    if not args.dry_run and not args.fact.exists():
        ap.error(f"{args.fact} not found: stage the fact binary or pass --fact")
    env0 = {"gpu": None if args.dry_run else gpu_name(), "commit": fact_commit(args.fact)}
    deadline = Deadline(args.budget_s)
    for model in [resolve(spec) for spec in args.models.split(",")]:
        if deadline.left() <= 0:
            log(f"budget of {args.budget_s:.0f} s spent: {model.name} not started")
            break
        start = time.monotonic()
        run_model(args, model, deadline, env0)
        rows = read_json(args.out / "compose" / f"{model.name}.json") or []
        for r in rows:
            log(f"{model.name} {r['phase']:5}: wall {r['wall_s']} s, nvcc {r['nvcc_s']} s, {r['kernels']} kernels, "
                f"fact {r['fact_ms']} ms (fact.load: {r.get('fact_load_ms')} ms, compiled: {r.get('fact_compile_ms')} ms), torch.compile {r['compile_ms']} ms "
                f"(compiled in {r['compile_s']} s)")
        log(f"{model.name}: {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
