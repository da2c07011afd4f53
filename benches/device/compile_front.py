"""Where the front of a composed program under fact.compile goes (issue 51): one zoo model
exported, composed --quick and timed in one process in turns (L2 flushed, medians, each from an
idle GPU) as its TorchScript copy, under fact.compile, under the same options with the exported
module's Python input check left on (`validate_inputs`, which fact.compile turns off), under the
default Python wrapper, and torch.compile of the model; each checked against the
TorchScript copy first, each with its host issue time and GPU span (harness.cold_call). Dynamo's
guard filters (`guard_filter_fn`: none, all nn modules' guards skipped, every guard skipped) are
varied each on a program loaded anew: dynamo keeps compiled entries per code object, and a second
torch.compile of the same program with only the filter changed would reuse the first one's entry
(`first_call_s` says whether a variant compiled). `fact_inductor*` compile the composed program
with Inductor alone (`torch._inductor.standalone_compile`, the graph's own dynamic shapes): no
dynamo, so no guards and no check of the inputs' dtypes or ranges; it bounds what any front
could save.

    python3 benches/device/compile_front.py OUT --model gpt2 [--fact .device/fact] [--only a,b]

OUT/NAME.front.json is rewritten after every variant."""
import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zoo"))
import serve  # noqa: E402  (sets up fact's package and models on the path)
import fact  # noqa: E402
import models  # noqa: E402
from harness import cold_call, flush_buffer, rel_err, time_interleaved, write_json  # noqa: E402


def standalone(program, xs, options):
    """The composed program compiled by Inductor without dynamo, fact's ops on their C shims."""
    for lib in sorted(fact._LOADED):
        fact.use_c_shims(lib)
    return torch._inductor.standalone_compile(program, list(xs), dynamic_shapes="from_graph", options={"config_patches": options})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--fact", default=".device/fact")
    ap.add_argument("--only", help="comma-separated variants to time (default: all)")
    args = ap.parse_args()
    for sub in ("models", "fact", "logs"):
        (args.out / sub).mkdir(parents=True, exist_ok=True)
    model = models.by_name()[args.model]
    rec = {"model": model.name, "gpu": torch.cuda.get_device_name(), "fact_commit": serve.fact_version(args.fact),
           "shape": serve.shape_label(model.batch, model.seq), "variants": {}, "errors": {}}
    path = args.out / f"{model.name}.front.json"
    torch.set_float32_matmul_precision("high")
    torch.set_grad_enabled(False)
    rec.update(serve.export_stage(args.out, model))
    rec["compose"] = serve.compose_stage(args.out, model, args.fact, ["--quick"], 600)
    write_json(path, rec)
    d = args.out / "fact" / model.name
    fact.load_library(d / "libfact_ops.so")

    def loaded():
        """The composed program loaded anew: its own code object, so its own compiled entry."""
        return torch.export.load(str(d / "composed.pt2")).module()

    composed = loaded()
    # A second copy that keeps the exported module's Python input check (fact.compile turns it off).
    validating = loaded()
    scripted = torch.jit.load(str(serve.ts_copy(args.out, model.name)), map_location="cuda")
    wrapper = models.build(model, ci=False, device="cuda", dtype=serve.DTYPE)
    xs = serve.inputs_at(model, model.batch, model.seq, models.SEED)
    variants = {
        "fact_ts": lambda: scripted,
        "fact_compile": lambda: fact.compile(composed),
        "fact_compile_skip_nn_guards": lambda: fact.compile(
            loaded(), options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}),
        "fact_compile_skip_all_guards": lambda: fact.compile(
            loaded(), options={"guard_filter_fn": torch.compiler.skip_all_guards_unsafe}),
        "fact_compile_validating": lambda: torch.compile(validating, options={"cpp_wrapper": True}),
        "fact_compile_python_wrapper": lambda: torch.compile(composed),
        "compile": lambda: torch.compile(wrapper),
        "fact_inductor": lambda: standalone(loaded(), xs, {"cpp_wrapper": True}),
        "fact_inductor_python_wrapper": lambda: standalone(loaded(), xs, {}),
    }
    if args.only:
        keep = set(args.only.split(","))
        variants = {k: v for k, v in variants.items() if k in keep or k == "fact_ts"}
    want = scripted(*xs).float()
    fns = {}
    for key, make in variants.items():
        try:
            t0 = time.monotonic()
            fn = make()
            out = fn(*xs)
            torch.cuda.synchronize()
            v = {"first_call_s": round(time.monotonic() - t0, 2), "err_vs_ts": rel_err(out.float(), want)}
            fn(*xs)
            v.update(cold_call(fn, xs))
            rec["variants"][key] = v
            fns[key] = fn
        except Exception as e:  # noqa: BLE001 -- the record says which variant failed
            traceback.print_exc()
            rec["errors"][key] = serve.said(e)
        write_json(path, rec)
        print(key, rec["variants"].get(key), flush=True)
    ms = time_interleaved(fns, xs, flush_buffer())
    for k, v in ms.items():
        rec["variants"][k]["ms"] = round(v, 4)
    write_json(path, rec)
    for k, v in rec["variants"].items():
        print(f"{k:36} {v.get('ms')} ms  host {v.get('host_ms'):.3f}  span {v.get('span_ms'):.3f}  err {v.get('err_vs_ts'):.2e}")


if __name__ == "__main__":
    main()
