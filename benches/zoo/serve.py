"""torch.export in and out, serving shapes and CUDA graphs, measured as users run fact: each zoo
model (benches/zoo/models.py) is built on the GPU in bf16, exported with torch.export (batch and
sequence dynamic where the model allows), composed from its .pt2 by the fact CLI, and then:

- with --grid, at every shape of the serving grid (decoders and encoders B x T in 1x1, 1x37,
  1x128, 1x1024, 4x333, 8x549, 8x576 and the zoo's; images B in 1, 8 and the zoo's), in two
  processes of their own (a process that dies is started again past its shape): torch's (the
  traced module, torch.compile default and mode="reduce-overhead") and fact's (the composed
  program eagerly, captured in a CUDA graph after one warm-up call at the shape, replays fed new
  input values copied into the captured buffers, and its TorchScript copy), each mode with its
  error against fp64, and the op library's kernel and fallback calls with the fallbacks' reasons;
- with --capture, the capture check at the zoo shape: the original program, the composed
  one and its TorchScript copy each captured after a warm-up call, replayed on fresh inputs and compared with
  the uncaptured module on the same inputs, with the calls that fell back while capturing
  (OUT/captures/NAME.json; nothing is timed), and nothing else unless --grid is given too;
- at the zoo shape, in one measuring process: the exported program eagerly (eager_ms),
  torch.compile of the model (compile_ms), the composed program eagerly (fact_pt2_ms) and under
  torch.compile (fact_pt2_compile_ms) and the same composition as TorchScript (fact_ts_ms: the
  compose's --torchscript-copy on the same op library) (--no-zoo-modes skips these), and with --aoti the
  AOTInductor packages of the original program (aoti_orig_ms) and of the composed one (aoti_ms),
  timed in turns with the composed program, and the composed package run from C++
  (examples/aoti_run.cpp); each mode with its error against fp64, timed in turns
  (benches/device/harness.py: L2 flushed, CUDA events, medians).

From the repository root on the GPU machine, after `source .device/env.sh`:

    python3 benches/zoo/serve.py OUT --models gpt2 [--fact .device/fact] [--fact-args '--jobs 16']
        [--grid] [--aoti] [--no-zoo-modes] [--capture] [--budget-s 540] [--composed-at 8x576]

--composed-at BxT (or B for images) exports and composes each model at that shape instead of the
zoo's, which it then stands for everywhere here: in the grid, in the records' `composed_at`, at
"the zoo shape" above.

Records (JSON), each written as soon as it is known, so a stopped call keeps what it measured:
OUT/records/NAME.json (the zoo shape), OUT/shapes/NAME.json (one row per grid shape, the fields
benches/results/zoo/shapes/README.md lists; NAME.torch.json and NAME.fact.json, each side's),
OUT/compose/NAME.json (the compose's wall time, its nvcc time and kernels, with the model's time
after it), and logs under OUT/logs.
"""
import argparse
import ctypes
import dataclasses
import datetime
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "device"))
# fact's Python package (python/fact): its load_library readies the ops for Inductor too.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import fact  # noqa: E402
import models  # noqa: E402
from harness import ITERATIONS, VERIFY_INPUTS, flush_buffer, rel_err, time_interleaved, write_json  # noqa: E402

DTYPE = torch.bfloat16
# --composed-at, for this process and the children it starts (they inherit the environment).
COMPOSED_AT = "FACT_SERVE_COMPOSED_AT"
# 8 x 576, the next multiple of 64 after 8 x 549: what 549's tail tiles cost against their share of work.
TEXT_GRID = [(1, 1), (1, 37), (1, 128), (1, 1024), (4, 333), (8, 549), (8, 576)]
IMAGE_GRID = [1, 8]


def parse_shape(text):
    """(batch, seq) of `BxT`, (batch, None) of `B`."""
    b, _, t = text.partition("x")
    return (int(b), int(t)) if t else (int(b), None)


def at_shape(model):
    """The zoo model, at the shape --composed-at names where one does."""
    at = os.environ.get(COMPOSED_AT)
    if not at:
        return model
    batch, seq = parse_shape(at)
    if (seq is None) != (model.seq is None):
        raise SystemExit(f"--composed-at {at}: {model.name} takes {'B x T' if model.seq else 'a batch alone'}")
    return dataclasses.replace(model, batch=batch, seq=seq)


def zoo_model(name):
    return at_shape(models.by_name()[name])


def log(*args):
    print(f"[{datetime.datetime.now():%H:%M:%S}]", *args, flush=True)


def said(e, width=200):
    """An exception as a record's errors hold it: its type and the first line of its message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:width] if text else ''}"


def shape_label(batch, seq):
    """A grid shape as the records name it: "BxT" for text, "B" for an image batch."""
    return f"{batch}x{seq}" if seq else f"{batch}"


def ts_copy(out, name):
    """Where compose's --torchscript-copy of NAME's composition lies (the same op library)."""
    return composed_ts(out / "fact" / name)


def composed_ts(d):
    """The TorchScript copy beside the composed output folder `d`."""
    return d / "torchscript" / "composed.pt"


def grid(model, only=None):
    """The serving shapes of `model`: (batch, seq) pairs, seq None for images; the zoo's last.
    Lengths past what the model takes (BERT's 512 positions) are left out, and with `only` (labels
    as shape_label writes them) every shape it does not name but the zoo's. Under --composed-at
    the zoo model's own shape stays in the grid beside the one composed at."""
    if only:
        keep = set(only.split(","))
        return [s for s in grid(model) if shape_label(*s) in keep or s == (model.batch, model.seq)]
    if model.seq is None:
        shapes = [(b, None) for b in IMAGE_GRID]
    else:
        shapes = [(b, t) for b, t in TEXT_GRID if model.max_seq is None or t <= model.max_seq]
    own = models.by_name()[model.name]
    shapes.append((own.batch, own.seq))
    zoo = (model.batch, model.seq)
    return list(dict.fromkeys(s for s in shapes if s != zoo)) + [zoo]


def inputs_at(model, batch, seq, seed):
    """The model's inputs at (batch, seq) on the GPU, float ones in bf16."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    if model.seq is None:
        return (torch.randn(batch, 3, 224, 224, generator=gen, device="cuda").to(DTYPE),)
    ids = torch.randint(0, model.vocab, (batch, seq), generator=gen, device="cuda")
    return models.padding(ids, seq) if model.padding_mask else (ids,)


def dynamic_shapes(model, inputs):
    """Batch (and sequence) dims from 1 up, as serving sends them: named dims first (their range
    starts at 1), export's automatic ones where the model's code needs them narrower."""
    from torch.export import Dim

    if model.seq is None:
        named = {0: Dim("batch", min=1, max=1024)}
    else:
        named = {0: Dim("batch", min=1, max=1024), 1: Dim("seq", min=1, max=max(model.seq, 1024))}
    auto = {d: Dim.AUTO for d in named}
    return [tuple(named for _ in inputs), tuple(auto for _ in inputs)]


def fact_version(fact):
    out = subprocess.run([fact, "--version"], capture_output=True, text=True)
    return out.stdout.strip()


# ---------------------------------------------------------------------------------------------
# The stages.


def export_stage(out, model):
    """Builds the model in bf16 on the GPU and saves its program (OUT/models/NAME.pt2) and trace."""
    wrapper = models.build(model, ci=False, device="cuda", dtype=DTYPE)
    inputs = inputs_at(model, model.batch, model.seq, models.SEED)
    rec = {}
    start = time.monotonic()
    errors = []
    with torch.no_grad():
        for shapes in dynamic_shapes(model, inputs):
            try:
                ep = torch.export.export(wrapper, inputs, dynamic_shapes=shapes, strict=False)
                break
            except Exception as e:  # noqa: BLE001 -- the next spelling of the dims is tried
                errors.append(str(e).strip().splitlines()[0][:300])
        else:
            raise RuntimeError(f"{model.name} does not export: {errors}")
        rec["export_s"] = round(time.monotonic() - start, 2)
        rec["range_constraints"] = {str(k): str(v) for k, v in ep.range_constraints.items()}
        torch.export.save(ep, out / "models" / f"{model.name}.pt2")
        traced = torch.jit.trace(wrapper, inputs, strict=False, check_trace=False)
        traced.save(str(out / "models" / f"{model.name}.pt"))
    return rec


def compose_stage(out, model, fact, fact_args, timeout):
    """fact compose of the program; its wall time, and the nvcc time and kernels its log reports."""
    d = out / "fact" / model.name
    logf = out / "logs" / f"{model.name}.compose.log"
    cmd = [fact, "compose", str(out / "models" / f"{model.name}.pt2"), "--out", str(d), "--no-bench", "--torchscript-copy", "--json"] + fact_args
    start = time.monotonic()
    with open(logf, "w") as err, open(out / "logs" / f"{model.name}.compose.json", "w") as so:
        p = subprocess.run(cmd, stdout=so, stderr=err, timeout=timeout)
    wall = time.monotonic() - start
    text = logf.read_text()
    built = [(int(k), float(s)) for k, s in re.findall(r"compiled (\d+) kernels in ([0-9.]+) s", text)]
    rec = {
        "command": " ".join(cmd),
        "wall_s": round(wall, 1),
        "nvcc_s": round(sum(s for _, s in built), 1),
        "kernels": sum(k for k, _ in built),
        "exit": p.returncode,
    }
    if p.returncode != 0:
        tail = [line for line in text.splitlines() if line.startswith("error")]
        rec["error"] = tail[-1] if tail else f"fact compose exited with {p.returncode}"
    return rec


class Library:
    """The composed program's op library: its call counters through ctypes."""

    def __init__(self, path):
        fact.load_library(path)
        self.so = ctypes.CDLL(str(path))
        self.so.fact_op_stats.restype = ctypes.c_char_p

    def counted(self, fn, inputs):
        """fn(*inputs) once: (kernel calls, fallback calls, the fallbacks' reasons, the calls of
        few rows that ran torch's ops by the composition's choice: compose's small rows)."""
        torch.cuda.synchronize()
        self.so.fact_op_stats_reset()
        fn(*inputs)
        torch.cuda.synchronize()
        stats = json.loads(self.so.fact_op_stats())
        ran = sum(c["ran"] for c in stats.values())
        fell = sum(c["fell_back"] for c in stats.values())
        why = sorted({c["why"] for c in stats.values() if c.get("why")})
        return ran, fell, why, sum(c.get("torch", 0) for c in stats.values())


def graphed(fn, inputs, before_capture=None):
    """fn captured in a CUDA graph at these inputs' shapes (one warm-up call first, on a side
    stream as torch.cuda.graph asks; then `before_capture()`, where given): a callable that copies
    its inputs into the captured buffers and replays, returning the captured output."""
    static = [x.clone() for x in inputs]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(*static)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    if before_capture is not None:
        before_capture()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(*static)

    def replay(*xs):
        for dst, src in zip(static, xs):
            dst.copy_(src)
        g.replay()
        return out

    return replay


class Reference:
    """The model in fp64 on the GPU (the same seeded weights), and each mode's error against it:
    the largest relative Frobenius error over VERIFY_INPUTS fresh inputs at a shape (the fp64
    outputs kept per shape and input)."""

    def __init__(self, model):
        self.model = model
        self.module = models.build(model, ci=False, device="cuda", dtype=torch.float64)
        self.outputs = {}

    def error(self, fn, batch, seq):
        worst = 0.0
        for i in range(VERIFY_INPUTS):
            xs = inputs_at(self.model, batch, seq, 1000 + i)
            if (batch, seq, i) not in self.outputs:
                self.outputs[(batch, seq, i)] = self.module(*[x.double() if x.is_floating_point() else x for x in xs])
            worst = max(worst, rel_err(fn(*xs), self.outputs[(batch, seq, i)]))
        return worst


def capture_child(out, name):
    """The capture check of one composed model at its zoo shape, in this process: the original
    program, the composed one and its TorchScript copy each captured in a CUDA graph after one warm-up call
    (`graphed`), then replayed on fresh inputs, each replay against the uncaptured module's output
    on the same inputs; the calls that fell back while capturing, and why. The warm-up call's
    output is checked against the original program's (`uncaptured_vs_original`), so a runtime that
    runs but cannot be captured still says whether it computes the model. A row per runtime in
    captures/NAME.json, the original program's first (a model that cannot be captured itself)."""
    model = zoo_model(name)
    lib = Library(out / "fact" / name / "libfact_ops.so")
    torch.set_grad_enabled(False)
    d = out / "fact" / name
    # The original program first: where it cannot be captured either (a model that makes CPU
    # tensors in its forward, as BEiT's position bias does), the composed one's failure is the model's.
    loads = {"original": lambda: torch.export.load(str(out / "models" / f"{name}.pt2")).module(),
             "pt2": lambda: torch.export.load(str(d / "composed.pt2")).module()}
    if ts_copy(out, name).exists():
        loads["ts"] = lambda: torch.jit.load(str(ts_copy(out, name)), map_location="cuda")
    rows = []
    path = out / "captures" / f"{name}.json"
    original = None  # the original program's uncaptured output, which each runtime's is checked against
    for key, load in loads.items():
        row = {"model": name, "runtime": key, "shape": shape_label(model.batch, model.seq),
               "errors": {}}
        rows.append(row)
        try:
            fn = load()
            xs = inputs_at(model, model.batch, model.seq, models.SEED)
            first = fn(*xs).float()
            torch.cuda.synchronize()
            if key == "original":
                original = first
            elif original is not None:
                row["uncaptured_vs_original"] = rel_err(first, original)
            replay = graphed(fn, xs, before_capture=lib.so.fact_op_stats_reset)
            stats = json.loads(lib.so.fact_op_stats())
            row["captured_kernel_calls"] = sum(c["ran"] for c in stats.values())
            row["captured_fallback_calls"] = sum(c["fell_back"] for c in stats.values())
            row["fallback_why"] = sorted({c["why"] for c in stats.values() if c.get("why")})
            worst = 0.0
            for i in range(VERIFY_INPUTS):
                fresh = inputs_at(model, model.batch, model.seq, 2000 + i)
                want = fn(*fresh).float()
                worst = max(worst, rel_err(replay(*fresh).float(), want))
            row["replay_vs_uncaptured"] = worst
            row["ok"] = worst <= 3e-2
        except Exception as e:  # noqa: BLE001 -- the row says which runtime failed and why
            traceback.print_exc()
            row["ok"] = False
            row["errors"]["capture"] = said(e)
        write_json(path, rows)
        log(name, "capture", key, {k: row.get(k) for k in ("ok", "replay_vs_uncaptured", "captured_fallback_calls")})


def measure_child(out, name, aoti, zoo_modes, deadline):
    """One model's measurements in this process (it holds one fact op library)."""
    model = zoo_model(name)
    rec_path = out / "records" / f"{name}.json"
    rec = json.loads(rec_path.read_text()) if rec_path.exists() else {}
    rec.setdefault("errors", {})
    d = out / "fact" / name
    lib = Library(d / "libfact_ops.so")
    torch.set_float32_matmul_precision("high")

    def stage(key, fn):
        log(name, key)
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- recorded; the other stages run
            traceback.print_exc()
            rec["errors"][key] = said(e, 300)
        write_json(rec_path, rec)

    wrapper = models.build(model, ci=False, device="cuda", dtype=DTYPE)
    error = Reference(model).error
    original_ep = torch.export.load(str(out / "models" / f"{name}.pt2"))
    composed_ep = torch.export.load(str(d / "composed.pt2"))
    original, composed = original_ep.module(), composed_ep.module()
    traced = torch.jit.load(str(out / "models" / f"{name}.pt"), map_location="cuda")
    flush = flush_buffer()

    rec["fact_calls"] = sum(1 for n in composed_ep.graph.nodes if n.op == "call_function" and str(n.target).startswith("fact."))
    timed = {}
    zoo = inputs_at(model, model.batch, model.seq, models.SEED)

    def mode(key, fn, compile_key=None):
        start = time.monotonic()
        fn(*zoo)
        torch.cuda.synchronize()
        if compile_key:
            rec[compile_key] = round(time.monotonic() - start, 1)
        rec[key.replace("_ms", "_err")] = error(fn, model.batch, model.seq)
        timed[key] = fn

    with torch.no_grad():
        if zoo_modes:
            zoo_shape(rec, stage, mode, original, wrapper, composed, lib, timed, zoo, flush, name, d)
        if aoti and time.monotonic() < deadline:
            packaged = {}

            def package(key, ep, tag):
                start = time.monotonic()
                path = torch._inductor.aoti_compile_and_package(ep, package_path=str(out / "work" / f"{name}_{tag}.pt2"))
                rec[key.replace("_ms", "_build_s")] = round(time.monotonic() - start, 1)
                fn = torch._inductor.aoti_load_package(path)
                fn(*zoo)
                torch.cuda.synchronize()
                rec[key.replace("_ms", "_err")] = error(fn, model.batch, model.seq)
                packaged[key] = fn

            stage("aoti_orig", lambda: package("aoti_orig_ms", original_ep, "aoti_orig"))
            stage("aoti", lambda: package("aoti_ms", composed_ep, "aoti"))

            def aoti_timing():
                # The packages in turns with the programs they were built from, in one process.
                fns = dict(packaged, fact_pt2_ms=composed)
                if "compile_ms" in timed:
                    fns["compile_ms"] = timed["compile_ms"]
                got = time_interleaved(fns, zoo, flush)
                rec.update({k: round(v, 4) for k, v in got.items() if k in packaged})
                rec["aoti_beside"] = {k: round(v, 4) for k, v in got.items() if k not in packaged}

            if packaged:
                stage("aoti_timing", aoti_timing)
            log(name, {k: rec.get(k) for k in ("aoti_orig_ms", "aoti_ms", "aoti_beside")})

            def from_cpp():
                # The composed package run from C++ (examples/aoti_run.cpp), no Python in the process.
                exe = out / "work" / "aoti_run"
                t = os.path.dirname(torch.__file__)
                src = Path(__file__).resolve().parents[2] / "examples" / "aoti_run.cpp"
                subprocess.run(["g++", "-std=c++17", "-O0", str(src), f"-I{t}/include", f"-I{t}/include/torch/csrc/api/include",
                                f"-L{t}/lib", f"-Wl,-rpath,{t}/lib", "-ltorch", "-ltorch_cpu", "-ltorch_cuda", "-lc10", "-ldl",
                                "-o", str(exe)], check=True, timeout=240)
                run = subprocess.run([str(exe), str(d / "libfact_ops.so"), str(out / "work" / f"{name}_aoti.pt2"), str(model.batch),
                                      str(model.seq or 1), str(model.vocab)] + (["mask"] if model.padding_mask else []), capture_output=True, text=True, timeout=120)
                rec["aoti_cpp"] = (run.stdout + run.stderr).strip()[:300]
                if run.returncode != 0:
                    raise RuntimeError(f"examples/aoti_run exited with {run.returncode}: {rec['aoti_cpp']}")

            if "aoti_ms" in packaged and model.seq is not None and time.monotonic() < deadline:
                stage("aoti_cpp", from_cpp)


def zoo_shape(rec, stage, mode, original, wrapper, composed, lib, timed, zoo, flush, name, d):
    """The zoo shape's modes: the program eagerly, torch.compile of the model, the composed program
    eagerly and under torch.compile, the same composition as TorchScript (the compose's
    torchscript/composed.pt, on the same op library: fact_ts_ms), the model and the composed
    program under Inductor's C++ wrapper (compile_cpp_ms, fact_pt2_cpp_ms: fact's ops on their C
    shims), fact's calls, all timed in turns."""
    stage("eager", lambda: mode("eager_ms", original))
    stage("compile", lambda: mode("compile_ms", torch.compile(wrapper), "compile_s"))
    stage("fact_pt2", lambda: mode("fact_pt2_ms", composed))
    stage("fact_pt2_compile", lambda: mode("fact_pt2_compile_ms", torch.compile(composed), "fact_pt2_compile_s"))
    ts = composed_ts(d)
    if ts.exists():
        stage("fact_ts", lambda: mode("fact_ts_ms", torch.jit.load(str(ts), map_location="cuda")))
    # Inductor's C++ wrapper: the model's graph, and the composed program's under fact.compile
    # (fact's ops called through their C shims, the exported module's Python input check off). The
    # shims are registered for that compile only, so the AOTInductor packages after it keep the
    # proxy executor their records were taken with.
    stage("compile_cpp", lambda: mode("compile_cpp_ms", torch.compile(wrapper, options={"cpp_wrapper": True}), "compile_cpp_s"))

    def fact_cpp():
        config = torch._inductor.config.aot_inductor
        kept = dict(config.custom_ops_to_c_shims)
        rec["c_shims"] = fact.use_c_shims(d / "libfact_ops.so")
        try:
            mode("fact_pt2_cpp_ms", fact.compile(composed), "fact_pt2_cpp_s")
        finally:
            config.custom_ops_to_c_shims = kept

    stage("fact_pt2_cpp", fact_cpp)

    def counters():
        rec["kernel_calls"], rec["fallback_calls"], rec["fallback_why"], rec["torch_calls"] = lib.counted(composed, zoo)

    stage("counters", counters)

    def timing():
        rec.update({k: round(v, 4) for k, v in time_interleaved(timed, zoo, flush).items()})
        rec["timing"] = f"interleaved: {', '.join(timed)} in turns, {ITERATIONS} iterations, L2 flushed, median"

    stage("timing", timing)
    log(name, {k: rec.get(k) for k in ("eager_ms", "compile_ms", "fact_pt2_ms", "fact_pt2_compile_ms", "fact_ts_ms", "compile_cpp_ms", "fact_pt2_cpp_ms")})


def grid_child(out, name, side, shapes, deadline):
    """One side of the serving grid in this process: "torch" (the traced module, torch.compile
    default and mode="reduce-overhead") or "fact" (the composed program eagerly and in a CUDA
    graph, with its calls, and under fact.compile eagerly and in a CUDA graph), each mode's error
    against fp64 and its time at every shape of `shapes` in turn; rows appended to
    shapes/NAME.SIDE.json as each shape finishes, so a process that dies keeps the shapes before."""
    model = zoo_model(name)
    path = out / "shapes" / f"{name}.{side}.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    torch.set_float32_matmul_precision("high")
    torch.set_grad_enabled(False)
    error = Reference(model).error
    flush = flush_buffer()
    if side == "torch":
        wrapper = models.build(model, ci=False, device="cuda", dtype=DTYPE)
        traced = torch.jit.load(str(out / "models" / f"{name}.pt"), map_location="cuda")
        compiled = torch.compile(wrapper)
        reduce_overhead = torch.compile(wrapper, mode="reduce-overhead")
        modes = {"traced_ms": lambda xs: traced, "compile_ms": lambda xs: compiled, "compile_ro_ms": lambda xs: reduce_overhead}
    else:
        lib = Library(out / "fact" / name / "libfact_ops.so")
        composed = torch.export.load(str(out / "fact" / name / "composed.pt2")).module()
        # Not the composed program under torch.compile's reduce-overhead: its CUDA graph trees
        # refuse a program whose ops keep tensors of the graphs' pool past a call, which fact's
        # memo and its classified masks do where they first fill during the trees' warm-up
        # ("Detected 2 tensor(s) in the cudagraph pool not tracked as outputs"), as they did at
        # every shape of every model with a memo or a mask here, after the graph capture above.
        modes = {"fact_ms": lambda xs: composed, "fact_graph_ms": lambda xs: graphed(composed, xs)}
        # fact.compile: Inductor fuses the ops around fact's (embeddings, casts, adds), called from
        # its C++ wrapper; and that compiled program captured in a CUDA graph as the composed one
        # is, where the fused glue leaves the graph fewer kernels to replay.
        compiled = fact.compile(composed)
        modes["fact_compile_ms"] = lambda xs: compiled
        modes["fact_compile_graph_ms"] = lambda xs: graphed(compiled, xs)
        # The TorchScript copy compose wrote beside the program (same op library): the composition
        # without the exported program's Python interpreter, which is the host time at small shapes.
        if ts_copy(out, name).exists():
            scripted = torch.jit.load(str(ts_copy(out, name)), map_location="cuda")
            modes["fact_ts_ms"] = lambda xs: scripted
    for batch, seq in shapes:
        if time.monotonic() > deadline:
            break
        shape = shape_label(batch, seq)
        log(name, side, shape)
        row = {"shape": shape, "errors": {}}
        rows.append(row)
        xs = inputs_at(model, batch, seq, models.SEED)
        fns = {}
        for key, make in modes.items():
            try:
                fn = make(xs)
                fn(*xs)
                torch.cuda.synchronize()
                row[key.replace("_ms", "_err")] = error(fn, batch, seq)
                fns[key] = fn
            except Exception as e:  # noqa: BLE001 -- the row says which mode failed and why
                traceback.print_exc()
                row["errors"][key] = said(e)
            write_json(path, rows)
        if side == "fact":
            row["kernel_calls"], row["fallback_calls"], row["fallback_why"], row["torch_calls"] = lib.counted(composed, xs)
        try:
            row.update({k: round(v, 4) for k, v in time_interleaved(fns, xs, flush).items()})
        except Exception as e:  # noqa: BLE001
            row["errors"]["timing"] = said(e)
        write_json(path, rows)
        log(name, side, shape, {k: v for k, v in row.items() if k.endswith("_ms") or k.endswith("_calls")})


def serving_grid(out, model, rec, sides, deadline, only=None):
    """The grid's rows (shapes/NAME.json): each side measured by child processes, a side's
    process that dies restarted past the shape it died at (which says so), then the sides joined
    shape by shape with the record's model, GPU and commit."""
    name = model.name
    shapes = grid(model, only)
    for side in sides:
        path = out / "shapes" / f"{name}.{side}.json"
        while time.monotonic() < deadline:
            done = [r["shape"] for r in json.loads(path.read_text())] if path.exists() else []
            left = [s for s in shapes if shape_label(*s) not in done]
            if not left:
                break
            arg = ",".join(shape_label(b, t) for b, t in left)
            cmd = [sys.executable, "-u", str(Path(__file__).resolve()), str(out), "--grid-child", name, side, arg,
                   "--budget-s", str(max(10, deadline - time.monotonic()))]
            with open(out / "logs" / f"{name}.grid.{side}.log", "a") as f:
                try:
                    p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=max(30, deadline - time.monotonic() + 30))
                except subprocess.TimeoutExpired:
                    # The call's budget is spent: the shapes not yet measured stay unmeasured.
                    rows = json.loads(path.read_text()) if path.exists() else []
                    measured = {r["shape"] for r in rows}
                    stopped = next((s for s in left if shape_label(*s) not in measured), None)
                    if stopped:
                        rows.append({"shape": shape_label(*stopped),
                                     "errors": {"process": f"the {side} process ran past the call's budget and was stopped here"}})
                        write_json(path, rows)
                    break
            if p.returncode != 0:
                rows = json.loads(path.read_text()) if path.exists() else []
                if rows and rows[-1]["shape"] not in done:
                    rows[-1]["errors"]["process"] = f"the {side} process died here (exit {p.returncode}); the shapes after it ran in a new one"
                else:
                    first = left[0]
                    rows.append({"shape": shape_label(*first),
                                 "errors": {"process": f"the {side} process died before this shape's first mode finished (exit {p.returncode})"}})
                write_json(path, rows)
    joined = []
    sides = {side: {r["shape"]: r for r in (json.loads((out / "shapes" / f"{name}.{side}.json").read_text())
                                              if (out / "shapes" / f"{name}.{side}.json").exists() else [])}
             for side in ("torch", "fact")}
    for b, t in shapes:
        shape = shape_label(b, t)
        row = {"model": name, "policy": "bf16", "gpu": rec.get("gpu"), "fact_commit": rec.get("fact_commit"),
               "composed_at": shape_label(model.batch, model.seq), "shape": shape, "errors": {}}
        for side in ("torch", "fact"):
            r = sides[side].get(shape, {})
            row.update({k: v for k, v in r.items() if k not in ("shape", "errors")})
            row["errors"].update({f"{side}.{k}": v for k, v in r.get("errors", {}).items()})
        joined.append(row)
    write_json(out / "shapes" / f"{name}.json", joined)

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--models", default="gpt2")
    ap.add_argument("--fact", default=".device/fact")
    ap.add_argument("--fact-args", default="")
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--shapes", help="with --grid, only these shapes and the zoo's (comma-separated, as 1x37)")
    ap.add_argument("--aoti", action="store_true")
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--grid-child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--no-zoo-modes", action="store_true", help="skip the zoo shape's eager and compile modes (measured earlier)")
    ap.add_argument("--capture", action="store_true",
                    help="only the capture check at the zoo shape (captures/NAME.json), after the compose")
    ap.add_argument("--capture-child", help=argparse.SUPPRESS)
    ap.add_argument("--composed-at", help="export and compose at this shape (BxT, or B for images) instead of the zoo's")
    args = ap.parse_args()
    if args.composed_at:
        parse_shape(args.composed_at)
        os.environ[COMPOSED_AT] = args.composed_at
    deadline = time.monotonic() + args.budget_s
    for sub in ("models", "fact", "logs", "records", "shapes", "compose", "work", "captures"):
        (args.out / sub).mkdir(parents=True, exist_ok=True)
    if args.child:
        measure_child(args.out, args.child, args.aoti, not args.no_zoo_modes, deadline)
        return
    if args.capture_child:
        capture_child(args.out, args.capture_child)
        return
    if args.grid_child:
        name, side, shapes = args.grid_child
        parsed = [parse_shape(s) for s in shapes.split(",")]
        grid_child(args.out, name, side, parsed, deadline)
        return
    import transformers

    transformers.logging.set_verbosity_error()
    commit = fact_version(args.fact)
    for model in map(at_shape, models.select(args.models)):
        if time.monotonic() > deadline:
            log("budget spent before", model.name)
            break
        rec_path = args.out / "records" / f"{model.name}.json"
        rec = {"model": model.name, "family": model.family, "policy": "bf16", "gpu": torch.cuda.get_device_name(),
               "fact_commit": commit, "batch": model.batch, "seq": model.seq, "date": f"{datetime.date.today()}", "errors": {}}
        try:
            log(model.name, "export")
            rec.update(export_stage(args.out, model))
            write_json(rec_path, rec)
            torch.cuda.empty_cache()
            log(model.name, "compose")
            c = compose_stage(args.out, model, args.fact, args.fact_args.split(), max(60, deadline - time.monotonic()))
            rec["compose_s"] = c["wall_s"]
            comp = {"model": model.name, "policy": "bf16", "gpu": rec["gpu"], "cores": os.cpu_count(), "fact_commit": commit,
                    "phase": "quick" if "--quick" in args.fact_args.split() else "full", **c}
            write_json(args.out / "compose" / f"{model.name}.json", comp)
            write_json(rec_path, rec)
            if c["exit"] != 0:
                rec["errors"]["compose"] = c["error"]
                write_json(rec_path, rec)
                continue
            if args.capture:
                log(model.name, "capture")
                cmd = [sys.executable, "-u", str(Path(__file__).resolve()), str(args.out), "--capture-child", model.name]
                with open(args.out / "logs" / f"{model.name}.capture.log", "w") as f:
                    p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=max(60, deadline - time.monotonic() + 30))
                if p.returncode != 0:
                    rec["errors"]["capture"] = f"the capture child exited with {p.returncode} (logs/{model.name}.capture.log)"
                    write_json(rec_path, rec)
                # With --grid, the grid is measured on the same composition after the check.
                if not args.grid:
                    continue
            log(model.name, "measure")
            # The grid first; its processes leave the zoo shape's modes and the AOTInductor
            # packages about 1.5 and 4 minutes.
            if args.grid:
                serving_grid(args.out, model, rec, ("fact",), deadline - (0 if args.no_zoo_modes else 90) - (240 if args.aoti else 0), args.shapes)
            cmd = [sys.executable, "-u", str(Path(__file__).resolve()), str(args.out), "--child", model.name,
                   "--budget-s", str(max(30, deadline - time.monotonic()))] + (["--aoti"] if args.aoti else []) + (["--no-zoo-modes"] if args.no_zoo_modes else [])
            with open(args.out / "logs" / f"{model.name}.measure.log", "w") as f:
                p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=max(60, deadline - time.monotonic() + 30))
            if p.returncode != 0:
                rec = json.loads(rec_path.read_text())
                rec["errors"]["measure"] = f"the measuring child exited with {p.returncode} (logs/{model.name}.measure.log)"
                write_json(rec_path, rec)
            if args.grid:
                serving_grid(args.out, model, json.loads(rec_path.read_text()), ("torch",), deadline, args.shapes)
            rec = json.loads(rec_path.read_text())
            comp["fact_ms"], comp["compile_ms"], comp["compile_s"] = rec.get("fact_pt2_ms"), rec.get("compile_ms"), rec.get("compile_s")
            write_json(args.out / "compose" / f"{model.name}.json", comp)
        except Exception as e:  # noqa: BLE001 -- one model's failure is recorded, the next runs
            traceback.print_exc()
            # The children write the record too: what they measured is kept.
            if rec_path.exists():
                rec = json.loads(rec_path.read_text())
            rec["errors"]["run"] = said(e, 300)
            write_json(rec_path, rec)


if __name__ == "__main__":
    main()
