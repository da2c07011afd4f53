"""Where one nvcc translation unit's compile time goes, and what nvcc flags or source trims change
it at the same device code (issue 53). Runs on any machine with ./setup's toolchain, no GPU: the
CPU host here, the GPU host's 16 cores there. Owns the nvcc-per-unit records in
benches/results/compose/; compose-time harness: benches/zoo/compose_time.py.

From the repository root:

    python3 benches/device/nvcc_units.py OUT.json [--fact target/release/fact] [--units gemm,attention,gemm6]
        [--variants base,host_o1,...] [--repeat 2] [--cpus 1] [--work DIR]

Each unit is rendered as compose renders it: `fact realize --compile-only --jobs 1` (sccache off, an
empty build cache and user table, no shipped table), through an nvcc that logs its arguments, so
the unit's source and fact's own nvcc command are the ones compose compiles:

- gemm: `gemm_rcr` bf16 4096x4096x4096, its first candidate alone (an sm90 collective-builder GEMM);
- attention: `sdpa_causal` bf16 8x12x1024x1024x64, its first candidate (an sm90 FMHA, examples/88);
- gemm6: the same GEMM's first six candidates in one unit (tiles, clusters, schedules and epilogues
  apart), what a unit of a batch holds where kernels outnumber the cores.

Then each variant of the command (or of the source) is compiled again `--repeat` times, pinned to
`--cpus` (taskset), with `nvcc -time` (each of nvcc's phases: host and device preprocessing,
cudafe++, cicc, ptxas, fatbinary, the host compile), and the object's SASS (`cuobjdump -sass`, the
anonymous namespaces' per-compile names normalised) hashed against the base's. Variants:

- base: fact's command as it is;
- host_o1, host_o0: nvcc's -O3 (host code only: cicc and ptxas get no -O from it) as -O1, -O0;
- split0: --split-compile=0 (nvcc's optimizer on every CPU given);
- threads0: -t 0 (nvcc's threads across architectures; a unit has one);
- cxx20: -std=c++20 for -std=c++17;
- guard (gemm): the unit's host-only code (the ABI entry points, the adapter's launch, the
  arguments) hidden from the device pass behind #ifndef __CUDA_ARCH__, the kernel instantiated
  explicitly there;
- headers: the unit's includes alone, its kernel and entry points cut: what every unit pays
  before its first kernel.

The record: OUT.json, {machine, toolchain, fact_commit, date, units: {unit: {kernels, command,
fact_compile_s, measured_by, variants: {variant: {runs: [{wall_s, cpu_s, phases_s, sass}],
min_wall_s, min_cpu_s, phases_s (of the fastest run), same_sass (every run's SASS the base's
first)}}}}}, written after every compile; a later call into the same OUT.json adds its units beside
the earlier ones. cpu_s (user and system time of nvcc and every tool it ran) is the figure to
compare on a machine shared with other work: wall time there waits on the other work too.
"""
import argparse
import datetime
import hashlib
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

UNITS = {
    "gemm": ("gemm_rcr", "4096x4096x4096", 1),
    "attention": ("sdpa_causal", "8x12x1024x1024x64", 1),
    "gemm6": ("gemm_rcr", "4096x4096x4096", 6),
}
VARIANTS = ("base", "host_o1", "host_o0", "split0", "threads0", "cxx20", "guard", "headers")


def write_json(path, obj):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)


def toolchain(fact):
    out = subprocess.run([str(fact), "doctor", "--json"], capture_output=True, text=True,
                         env=dict(os.environ, FACT_SCCACHE="off"), check=True).stdout
    return json.loads(out)["toolchain"]


def cuobjdump(nvcc, given):
    """cuobjdump: given, else beside nvcc, else the copy triton ships."""
    for p in [given, Path(nvcc).parent / "cuobjdump"]:
        if p and Path(p).is_file():
            return str(p)
    try:
        import triton  # noqa: F401 -- only where it is installed

        p = Path(sys.modules["triton"].__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if p.is_file():
            return str(p)
    except ImportError:
        pass
    sys.exit("no cuobjdump: pass --cuobjdump (the CUDA toolkit's, or triton's backends/nvidia/bin/cuobjdump)")


def shim(work, nvcc):
    """A CUDA_HOME whose nvcc logs its arguments to work/nvcc.log and runs the real one."""
    real = Path(nvcc).resolve().parent.parent
    home = work / "cuda"
    shutil.rmtree(home, ignore_errors=True)
    (home / "bin").mkdir(parents=True)
    for e in real.iterdir():
        if e.name != "bin":
            (home / e.name).symlink_to(e)
    for e in (real / "bin").iterdir():
        if e.name != "nvcc":
            (home / "bin" / e.name).symlink_to(e)
    log = work / "nvcc.log"
    (home / "bin" / "nvcc").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {shlex.quote(str(log))}\n'
                                       f'exec {shlex.quote(str(Path(nvcc).resolve()))} "$@"\n')
    (home / "bin" / "nvcc").chmod(0o755)
    return home, log


def render(args, work, name, home, log):
    """fact realize --compile-only of the unit: (source path, nvcc arguments without -c/-o, seconds)."""
    rule, shape, n = UNITS[name]
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    log.write_text("")
    env = dict(os.environ, CUDA_HOME=str(home), FACT_SCCACHE="off", FACT_CACHE_DIR=str(work / f"cache-{name}"),
               FACT_TABLE=str(work / f"table-{name}.json"), FACT_SHIPPED_TABLE=str(work / "none.json"))
    shutil.rmtree(work / f"cache-{name}", ignore_errors=True)
    (work / f"table-{name}.json").unlink(missing_ok=True)
    start = time.monotonic()
    subprocess.run([str(args.fact), "realize", "--rule", rule, "--dtype", "bf16", "--shape", shape, "--compile-only",
                    "--candidates", str(n), "--jobs", "1", "--out", str(out)], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    seconds = time.monotonic() - start
    sources = list(out.glob("sweeps/*/src/*.cu"))
    assert len(sources) == 1, f"one unit expected under {out}: {sources}"
    src = sources[0]
    for line in log.read_text().splitlines():
        words = shlex.split(line)
        if "-c" in words and words[words.index("-c") + 1] == str(src):
            i = words.index("-c")
            return src, words[:i] + words[i + 4:], seconds
    sys.exit(f"no nvcc command for {src} in {log}")


def guard(text):
    """The GEMM unit with its host-only code hidden from the device pass (see the module doc)."""
    ns = re.search(r"namespace (\w+_ns) \{", text).group(1)
    a = text.index("// `find(device)` for the current device")
    t0 = text.index("// Operands and output share a type")
    t1 = text.index("// How many of this kernel's clusters")
    b = text.index(f"}}  // namespace {ns}")
    c = text.index('extern "C"')
    return (text[:a] + "#ifndef __CUDA_ARCH__\n" + text[a:t0] + "#endif\n" + text[t0:t1] + "#ifndef __CUDA_ARCH__\n"
            + text[t1:b] + "#endif\n" + text[b:c] + "#ifndef __CUDA_ARCH__\n" + text[c:] + "#endif\n#ifdef __CUDA_ARCH__\n"
            + f"template __global__ void cutlass::device_kernel<{ns}::GemmKernel>(CUTLASS_GRID_CONSTANT {ns}::GemmKernel::Params const);\n"
            + "#endif\n")


def variant(name, unit, base, source):
    """(nvcc arguments, source text) of a variant, or None where it does not apply."""
    text = source.read_text()
    if name == "base":
        return base, text
    if name in ("host_o1", "host_o0"):
        return [{"-O3": "-O" + name[-1]}.get(w, w) for w in base], text
    if name == "split0":
        return base + ["--split-compile=0"], text
    if name == "threads0":
        return base + ["-t", "0"], text
    if name == "cxx20":
        return [{"-std=c++17": "-std=c++20"}.get(w, w) for w in base], text
    if name == "guard":
        return (base, guard(text)) if unit == "gemm" else None
    if name == "headers":
        return base, text[: text.index("namespace {")] + "\nint fact_headers_only;\n"
    raise SystemExit(f"unknown variant {name}: use {','.join(VARIANTS)}")


SASS_NAMES = [(re.compile(r"_GLOBAL__N__[0-9a-f_]+"), "_GLOBAL__N__"), (re.compile(r"_cu_[0-9a-f]{8}_[0-9]+"), "_cu_")]


def compile_once(args, nvcc, dump, work, argv, text, tag):
    src = work / "variants" / f"{tag}.cu"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(text)
    obj, csv = src.with_suffix(".o"), src.with_suffix(".csv")
    csv.unlink(missing_ok=True)
    cmd = ["taskset", "-c", args.cpus, nvcc] + argv + ["-time", str(csv), "-c", str(src), "-o", str(obj)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run(cmd, check=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    phases = {}
    for line in csv.read_text().splitlines()[1:]:
        cols = [c.strip() for c in line.split(",")]
        if len(cols) >= 8 and cols[7] == "ms":
            phases[cols[1]] = round(phases.get(cols[1], 0.0) + float(cols[6]) / 1000, 2)
    sass = subprocess.run([dump, "-sass", str(obj)], capture_output=True, text=True, check=True).stdout
    for pat, repl in SASS_NAMES:
        sass = pat.sub(repl, sass)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "phases_s": phases,
            "sass": hashlib.sha256(sass.encode()).hexdigest()[:16]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--fact", type=Path, default=REPO / "target" / "release" / "fact")
    ap.add_argument("--units", default="gemm,attention,gemm6")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--cpus", default="0", help="taskset's CPU list for each compile (split0 and threads0 get what it lists)")
    ap.add_argument("--cuobjdump", type=Path)
    ap.add_argument("--work", type=Path, default=Path("/tmp/fact-nvcc-units"))
    args = ap.parse_args()
    args.fact, args.out, work = args.fact.resolve(), args.out.resolve(), args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    tc = toolchain(args.fact)
    nvcc = tc["nvcc"]
    dump = cuobjdump(nvcc, args.cuobjdump)
    home, log = shim(work, nvcc)
    version = subprocess.run([str(args.fact), "--version"], capture_output=True, text=True).stdout
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), None)
    record = {
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "taskset": args.cpus},
        "toolchain": {"nvcc": subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1],
                      "cutlass": tc["cutlass_version"], "cuobjdump": dump},
        "fact_commit": (re.search(r"\(([0-9a-f]+)\)", version) or [None, None])[1],
        "date": datetime.date.today().isoformat(),
        "units": {},
    }
    if args.out.exists():
        # Units measured by an earlier call into the same record stay, each with its own command.
        record["units"] = json.loads(args.out.read_text()).get("units", {})
    for unit in args.units.split(","):
        src, base, seconds = render(args, work, unit, home, log)
        text = src.read_text()
        u = record["units"][unit] = {
            "measured_by": shlex.join(["python3", "benches/device/nvcc_units.py"] + sys.argv[1:]),
            "kernels": re.findall(r"^// spec: (.*)$", text, re.M),
            "command": shlex.join(["nvcc"] + base + ["-c", src.name]),
            "fact_compile_s": round(seconds, 1),
            "variants": {},
        }
        for name in args.variants.split(","):
            v = variant(name, unit, base, src)
            if v is None:
                continue
            runs = []
            for r in range(args.repeat):
                runs.append(compile_once(args, nvcc, dump, work, v[0], v[1], f"{unit}_{name}_{r}"))
                best = min(runs, key=lambda x: x["wall_s"])
                u["variants"][name] = {"runs": runs, "min_wall_s": best["wall_s"],
                                       "min_cpu_s": min(x["cpu_s"] for x in runs), "phases_s": best["phases_s"]}
                base_sass = u["variants"].get("base", {}).get("runs", [{}])[0].get("sass")
                same = all(x["sass"] == base_sass for x in runs)
                u["variants"][name]["same_sass"] = None if name == "headers" else same
                write_json(args.out, record)
                print(f"{unit} {name} #{r}: {runs[-1]['wall_s']} s wall, {runs[-1]['cpu_s']} s cpu, "
                      f"{runs[-1]['phases_s']}", flush=True)


if __name__ == "__main__":
    main()
