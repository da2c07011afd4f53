"""fact from Python: one call makes a model faster.

    import fact
    model = fact.compose(model, (ids,))   # export, `fact compose`, load the composed program
    out = model(ids)                      # eagerly: its TorchScript copy (`Composed`)
    fact.stats("fact-out/GPT2LMHeadModel")  # which kernels ran, which calls fell back

Under torch.compile, `fact.compile(model)` compiles it with Inductor's C++ wrapper calling fact's
ops directly (`compile` says why). A composed program written elsewhere loads with
`fact.load(folder)`, or `fact.load_library(lib)` then `torch.export.load("composed.pt2").module()`. Load the op library through this package rather
than with `torch.ops.load_library` alone when the program goes to torch.compile or AOTInductor:
it also registers fact's ops with Inductor (`load_library` says why).

`compose` exports the module with torch.export, saves the program as `model.pt2` in the output
folder, runs the fact CLI on it (`fact compose model.pt2 --out OUT`), printing its progress and
errors as the CLI prints them, and returns the composed program `load` reads back from the
folder. Everything the CLI decides (patterns, kernels, tuning) is the CLI's; this package only
moves a module to it and the result back.

The CLI binary is `$FACT_BIN` where set, else this checkout's `target/release/fact` where built,
else `cargo run --release` in this checkout.
"""

import codecs
import ctypes
import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

__all__ = ["ComposeError", "Composed", "cli", "compile", "compose", "load", "load_library", "stats", "use_c_shims"]

_REPO = Path(__file__).resolve().parents[2]
# Op libraries this process loaded, by resolved path: torch registers a library's ops once.
_LOADED = set()
# How many lines of the CLI's output a ComposeError keeps.
_TAIL = 40
# The CLI's exit status when it wrote the composition and its own benchmark then failed.
EXIT_UNBENCHED = 3


class ComposeError(RuntimeError):
    """`fact compose` failed, or wrote no composed program (without a GPU it compiles the kernels
    and stops, saying so): `returncode` is its exit status, `lines` the last lines it printed (on
    stderr where it failed: its error, and the log lines before it)."""

    def __init__(self, command, returncode, lines, what=None):
        self.command = list(command)
        self.returncode = returncode
        self.lines = list(lines)
        text = "\n".join(_error_lines(self.lines)) or "(it printed nothing)"
        super().__init__(f"{what or f'fact compose failed (exit status {returncode})'}:\n{text}")


def _error_lines(lines):
    """The CLI's error as it printed it: from its last `error:` line on (the line and the indented
    context after it), else every line kept."""
    starts = [i for i, line in enumerate(lines) if line.startswith("error:")]
    return lines[starts[-1]:] if starts else lines


def cli():
    """The command that runs the fact CLI, as a list of arguments."""
    given = os.environ.get("FACT_BIN")
    if given:
        return [given]
    built = _REPO / "target" / "release" / "fact"
    if built.is_file():
        return [str(built)]
    return ["cargo", "run", "--release", "--manifest-path", str(_REPO / "Cargo.toml"), "--"]


def _forward(stream, sink, tail, both):
    """Copies `stream` (the child's output) to `sink` as it comes, keeping its last lines in
    `tail` and in `both` (both streams' lines as they came); `sink` None prints nothing."""
    # A character split between two reads is decoded once whole.
    decode = codecs.getincrementaldecoder("utf-8")("replace").decode
    pending = ""
    for chunk in iter(lambda: stream.read1(65536), b""):
        text = decode(chunk)
        if sink is not None:
            sink.write(text)
            sink.flush()
        *done, pending = (pending + text).split("\n")
        _keep(done, tail, both)
    last = pending + decode(b"", final=True)
    if last:
        _keep([last], tail, both)


def _keep(lines, *kept):
    """Adds `lines` to each list in `kept`, each keeping its last _TAIL; a progress line redrawn in
    place (\r) counts as its last drawing."""
    lines = [line.rsplit("\r", 1)[-1] for line in lines]
    for k in kept:
        k.extend(lines)
        del k[:-_TAIL]


def _run(command, quiet):
    """Runs `command`, its stdout and stderr shown on this process's as they come (unless
    `quiet`); raises ComposeError with its last stderr lines when it fails, else returns the last
    lines it printed."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out_tail, err_tail, both = [], [], []
    threads = [
        threading.Thread(target=_forward, args=(child.stdout, None if quiet else sys.stdout, out_tail, both)),
        threading.Thread(target=_forward, args=(child.stderr, None if quiet else sys.stderr, err_tail, both)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    code = child.wait()
    if code != 0:
        raise ComposeError(command, code, err_tail or out_tail)
    return both


def compose(model, example_inputs, dynamic_shapes=None, out=None, args=(), quiet=False):
    """Composes `model` (an nn.Module in eval mode) for `example_inputs` (a tuple of its forward's
    inputs; one tensor is taken as a tuple of one) and returns the composed program, loaded.

    `dynamic_shapes` is torch.export.export's (e.g. `({0: torch.export.Dim.DYNAMIC},)` for a
    dynamic batch). `out` is the output folder (default `fact-out/<model's class name>`): it holds
    `model.pt2` (the exported program), and what the CLI writes (the composed program, its op
    library `libfact_ops.so`, the compose report). `args` are more CLI arguments (e.g.
    `["--table", "table.json"]`); `quiet` prints nothing of the CLI's output.
    """
    import torch

    if model.training:
        raise ValueError("fact.compose: the model is in training mode; call model.eval() first (fact composes inference)")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    out = Path(out) if out is not None else Path("fact-out") / type(model).__name__
    out.mkdir(parents=True, exist_ok=True)
    program = torch.export.export(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes, strict=False)
    exported = out / "model.pt2"
    torch.export.save(program, str(exported))
    # The TorchScript copy is what `load` runs eagerly (`Composed`).
    command = [*cli(), "compose", str(exported), "--out", str(out), "--torchscript-copy", *map(str, args)]
    try:
        printed = _run(command, quiet)
    except ComposeError as e:
        # The CLI wrote the composition and its own benchmark failed after: the composition
        # stands, and the benchmark's error is the user's to see.
        if e.returncode != EXIT_UNBENCHED or not _wrote_composition(out):
            raise
        warnings.warn("fact compose: the composition is written and loaded, but its benchmark failed:\n"
                      + "\n".join(e.lines[-3:]), RuntimeWarning, stacklevel=2)
        printed = e.lines
    if not _wrote_composition(out):
        raise ComposeError(command, 0, printed[-8:], f"fact compose wrote no composed program into {out}")
    return load(out)


def _wrote_composition(out):
    return any((out / name).is_file() for name in ("composed.pt2", "composed.pt"))


def _library(out_or_lib):
    path = Path(out_or_lib)
    return path / "libfact_ops.so" if path.is_dir() else path


def load_library(lib):
    """Loads an op library (`libfact_ops.so`, or the output folder holding it) into this process
    once, and registers its ops with Inductor as extern calls, each with the layout constraint its
    tags give: what Inductor itself does for a custom op it has no lowering for, on the first call
    it lowers. Inductor's own path formats that call's arguments into a log line whether or not the
    log is on, and the arguments of an op deep in a program are IR trees whose text grows with the
    program: compiling Qwen2's composed program (bf16, H200) spent minutes there."""
    import torch

    lib = _library(lib)
    key = str(lib.resolve())
    if key not in _LOADED:
        if not lib.is_file():
            raise FileNotFoundError(f"no op library at {lib}: compose writes libfact_ops.so into its output folder")
        torch.ops.load_library(key)
        _LOADED.add(key)
        _register_with_inductor()


def _register_with_inductor():
    import torch

    try:
        from torch._inductor.lowering import lowerings, make_fallback, tag_to_layout_constraint
        from torch._library.utils import get_layout_constraint_tag
    except ImportError:  # a torch without these: Inductor registers the ops itself, as it lowers them
        return
    for name in torch._C._dispatch_get_all_op_names():
        # The memo ops have no Meta kernel: they are CompositeImplicitAutograd, traced through
        # before Inductor sees the graph.
        if not name.startswith("fact::") or not torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta"):
            continue
        packet = getattr(torch.ops.fact, name.split("::", 1)[1])
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if op not in lowerings:
                constraint = tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
                make_fallback(op, layout_constraint=constraint, warn=False)


def use_c_shims(lib):
    """Has Inductor's C++ wrappers (`torch.compile(..., options={"cpp_wrapper": True})`, and
    AOTInductor packages compiled and loaded in this process) call fact's ops through the C shims
    the op library exports, as they call torch's own ops, instead of through Python (a C++
    wrapper's default for a custom op) or the dispatcher's boxed path (AOTInductor's proxy
    executor). Loads the library (`load_library`) and makes its symbols global in this process,
    so that the compiled wrappers link against them. An op whose shim name torch's own shim
    headers declare is left to the default path. Returns the ops registered, by name."""
    import torch

    lib = _library(lib)
    load_library(lib)
    handle = ctypes.CDLL(str(lib.resolve()), mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    if not hasattr(handle, "fact_c_shims"):
        return []  # a library composed before the ops had shims
    handle.fact_c_shims.restype = ctypes.c_char_p
    shims = json.loads(handle.fact_c_shims())
    headers = Path(torch.__file__).parent / "include/torch/csrc/inductor/aoti_torch/generated"
    torch_shims = "".join(h.read_text() for h in sorted(headers.glob("c_shim_*.h")))
    config = torch._inductor.config.aot_inductor
    registered = dict(config.custom_ops_to_c_shims)
    done = []
    for name, declarations in sorted(shims.items()):
        if any(f"aoti_torch_{device}_{name}(" in torch_shims for device in ("cpu", "cuda")):
            continue
        registered[getattr(torch.ops.fact, name).default] = declarations
        done.append(name)
    config.custom_ops_to_c_shims = registered
    return done


def compile(program, options=None, **kwargs):
    """`torch.compile(program)` with Inductor's C++ wrapper (`options={"cpp_wrapper": True}`),
    fact's ops called through their C shims (`use_c_shims`, for every op library this package
    loaded). Inductor's default Python wrapper issues each op call from Python, and a composed
    program's GPU waits on it between fact's kernels; from the C++ wrapper the composed zoo
    transformers run 1.39x torch.compile (geomean of five, H200 bf16) against 1.27x with the
    default wrapper (benches/results/zoo/export/README.md). `options` and the other arguments are
    torch.compile's; a `mode` cannot be combined with options (torch.compile's rule): for a CUDA
    graph, which issues no op from the host, use `torch.compile(program, mode="reduce-overhead")`.

    A program `torch.export.load(...).module()` gave checks the structure of its inputs in a
    Python hook before every call (`validate_inputs`); fact.compile turns that check off on
    `program`, as the compiled code's guards check every call's inputs again (a change of structure
    recompiles and fails there) and the hook cost about 0.08 ms a call before the compiled code
    starts (benches/results/zoo/export/README.md). The export's range constraints stay: they run in
    the graph (`_guards_fn`).

    Every dynamo guard stays; most of what a compiled call still spends beyond the composed
    TorchScript is their evaluation. A user whose program keeps its structure (no weight replaced
    by one of another shape or dtype, no submodule replaced) can drop the guards on its modules: `options={"guard_filter_fn":
    torch.compiler.skip_guard_on_all_nn_modules_unsafe}` (docs/python.md, with what it measured)."""
    import torch

    if "mode" in kwargs:
        raise ValueError("fact.compile sets Inductor's options, which torch.compile does not take with a mode: "
                         "for mode=..., call torch.compile(program, mode=...) itself")
    if not _LOADED:
        raise RuntimeError("fact.compile: no fact op library is loaded in this process; load the composed program "
                           "with fact.load(folder) (or fact.load_library(lib)) first")
    for lib in sorted(_LOADED):
        use_c_shims(lib)
    from ._composed import Composed

    if isinstance(program, Composed):
        program = program.program  # torch.compile takes the program, not its TorchScript copy
    if getattr(program, "validate_inputs", None) is True and hasattr(program, "_guards_fn"):
        program.validate_inputs = False
    return torch.compile(program, options={"cpp_wrapper": True, **(options or {})}, **kwargs)


def load(out):
    """The composed program in the folder `out` (what `fact compose --out out` wrote), with its op
    library loaded into this process: for a `composed.pt2` with its TorchScript copy beside it
    (`torchscript/composed.pt`, which compose writes on a GPU), a `Composed` that runs the copy
    eagerly and gives the program as `.program`; without the copy, the program as a module
    (`torch.export.load(...).module()`); where only `composed.pt` is there (a TorchScript output),
    that ScriptModule."""
    import torch

    out = Path(out)
    load_library(out / "libfact_ops.so")
    if (out / "composed.pt2").is_file():
        from . import _composed

        return _composed.load(out)
    if (out / "composed.pt").is_file():
        return torch.jit.load(str(out / "composed.pt"))
    raise FileNotFoundError(f"no composed program in {out}: compose writes composed.pt2 (or composed.pt) there")


def __getattr__(name):
    # `fact.Composed` without importing torch when the package is imported.
    if name == "Composed":
        from ._composed import Composed

        return Composed
    raise AttributeError(f"module 'fact' has no attribute {name!r}")


def stats(out_or_lib):
    """The call counters of an op library (an output folder, or the library itself), as
    `{kernel: {"ran": n, "copied": n, "fell_back": n, "why": "..."}}` (and `"torch": n` where calls
    of few rows ran torch's ops by the composition's choice, compose's small rows): the calls of
    this process since the library was loaded. Loads the library if this process has not."""
    lib = _library(out_or_lib)
    load_library(lib)
    so = ctypes.CDLL(str(lib.resolve()))
    so.fact_op_stats.restype = ctypes.c_char_p
    return json.loads(so.fact_op_stats())
