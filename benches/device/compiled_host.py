"""Where a composed program under torch.compile spends its time against the same composition as
TorchScript, at the zoo shape (bf16), in one process: the TorchScript copy (`fact_ts`), the composed
program compiled (default, without Inductor's size asserts, reduce-overhead, freezing, and last,
if the budget allows, Inductor's C++ wrapper), and torch.compile of the model (default and
reduce-overhead). For each: the time of one forward from an idle GPU timed in turns
(harness.time_interleaved: L2 flushed, CUDA events, medians), its host issue time and GPU span
(harness.cold_call), its error against the TorchScript copy, and for four of them the GPU's
timeline of a forward (`timeline`: the wait for its first kernel, the gaps between kernels); for
the default compile, the host time spent inside fact's ops (each op wrapped with a timer) and the
syncs a warm forward makes.

From the repository root on the GPU machine, after `source .device/env.sh`, on an output composed
with --torchscript-copy (benches/zoo/serve.py writes one per model under OUT/fact/NAME):

    python3 benches/device/compiled_host.py COMPOSED_DIR OUT.json [--model gpt2] [--budget-s 300]

OUT.json is rewritten after every stage, so a call cut short keeps what it measured.
"""
import argparse
import json
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zoo"))
import models  # noqa: E402
import serve  # noqa: E402
from harness import cold_call, flush_buffer, rel_err, time_interleaved  # noqa: E402

# fact's ops a composed transformer calls, wrapped to time the host inside them.
OPS = ("gemm", "gemm_ep", "layernorm", "attention", "rmsnorm", "rotary_qk", "glu")


def timeline(fn, inputs, flush, iters=5):
    """The GPU's view of one forward started from an idle GPU, from a profile of CUDA activity
    alone (no host ops recorded, so the host runs at its own pace): after the L2 flush and a
    marker kernel, how long the GPU waits for the forward's first kernel (`front_ms`), the idle time between its
    kernels (`gaps_ms`), its kernels' time (`kernels_ms`) and first start to last end (`span_ms`),
    medians over `iters` forwards."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(*inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            flush.zero_()
            # A marker no forward launches (the forwards' own memsets and fills would pass for
            # the flush): the GPU's last kernel before the call.
            torch.cuda._sleep(1000)
            fn(*inputs)
            torch.cuda.synchronize()
    events = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    starts = [i for i, e in enumerate(events) if "spin_kernel" in e.name]
    rows = []
    for a, b in zip(starts, starts[1:] + [len(events)]):
        flush_end = events[a].time_range.end
        forward = events[a + 1:b]
        if not forward:
            continue
        gaps = sum(max(0, y.time_range.start - x.time_range.end) for x, y in zip(forward, forward[1:]))
        rows.append({
            "front_ms": (forward[0].time_range.start - flush_end) / 1e3,
            "gaps_ms": gaps / 1e3,
            "kernels_ms": sum(e.time_range.end - e.time_range.start for e in forward) / 1e3,
            "span_ms": (forward[-1].time_range.end - forward[0].time_range.start) / 1e3,
            "kernels": len(forward),
        })
    return {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]} if rows else {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("composed", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--budget-s", type=float, default=300)
    args = ap.parse_args()
    start = time.monotonic()
    d = args.composed
    res = {"composed": str(d), "model": args.model, "gpu": torch.cuda.get_device_name(), "errors": {}, "first_s": {}}

    def save():
        args.out.write_text(json.dumps(res, indent=1))

    torch.set_grad_enabled(False)
    serve.fact.load_library(d / "libfact_ops.so")
    m = models.by_name()[args.model]
    inputs = serve.inputs_at(m, m.batch, m.seq, models.SEED)
    res["shape"] = [m.batch, m.seq]
    wrapper = models.build(m, ci=False, device="cuda", dtype=serve.DTYPE)

    def load():
        return torch.export.load(str(d / "composed.pt2")).module()

    fns = {}

    def add(key, make, share=0.6):
        if time.monotonic() - start > args.budget_s * share:
            res["errors"][key] = "not run: the budget was spent"
            return
        try:
            t0 = time.monotonic()
            f = make()
            for _ in range(3):
                f(*inputs)
            torch.cuda.synchronize()
            res["first_s"][key] = round(time.monotonic() - t0, 1)
            fns[key] = f
        except Exception as e:  # noqa: BLE001 -- recorded; the other variants run
            traceback.print_exc()
            res["errors"][key] = f"{type(e).__name__}: {str(e)[:300]}"
        save()
        print("ready", key, res["first_s"].get(key), flush=True)

    add("fact_ts", lambda: torch.jit.load(str(d / "torchscript" / "composed.pt"), map_location="cuda"))
    add("pt2_compile", lambda: torch.compile(load()))
    add("compile", lambda: torch.compile(wrapper))
    add("pt2_compile_no_size_asserts", lambda: torch.compile(load(), options={"size_asserts": False}))
    add("pt2_compile_ro", lambda: torch.compile(load(), mode="reduce-overhead"))
    add("compile_ro", lambda: torch.compile(wrapper, mode="reduce-overhead"))
    add("pt2_compile_freezing", lambda: torch.compile(load(), options={"freezing": True}))

    if "pt2_compile" in fns:
        f = fns["pt2_compile"]
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode(1)
            f(*inputs)
            torch.cuda.set_sync_debug_mode(0)
        # The first warning says the mode is a prototype; a sync adds one more each.
        res["pt2_compile_sync_warnings"] = [str(w.message)[:200] for w in caught][:10]
        inside, patched = {}, []
        for name in OPS:
            packet = getattr(torch.ops.fact, name, None)
            if packet is None:
                continue
            orig = packet.default

            def timed(*a, _orig=orig, _name=name, **k):
                t = time.perf_counter()
                r = _orig(*a, **k)
                inside[_name] = inside.get(_name, 0.0) + time.perf_counter() - t
                return r

            packet.default = timed
            patched.append((packet, orig))
        try:
            hosts = []
            for _ in range(10):
                inside.clear()
                torch.cuda.synchronize()
                t = time.perf_counter()
                f(*inputs)
                hosts.append(time.perf_counter() - t)
            res["pt2_compile_host_ms_ops_wrapped"] = round(statistics.median(hosts) * 1e3, 3)
            res["host_ms_inside_fact_ops"] = {k: round(v * 1e3, 3) for k, v in inside.items()}
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res["errors"]["ops_wrapped"] = str(e)[:300]
        for packet, orig in patched:
            packet.default = orig
        save()

    ref = fns["fact_ts"](*inputs).float() if "fact_ts" in fns else None
    for k, f in fns.items():
        if ref is not None:
            res[k + "_vs_fact_ts"] = rel_err(f(*inputs), ref)
    flush = flush_buffer()
    res["ms"] = time_interleaved(fns, inputs, flush)
    save()
    print("ms", res["ms"], flush=True)
    res["cold"] = {k: cold_call(f, inputs) for k, f in fns.items()}
    save()
    print("cold", res["cold"], flush=True)
    res["timeline"] = {}
    for key in ("fact_ts", "pt2_compile", "pt2_compile_ro", "compile"):
        if key in fns:
            try:
                res["timeline"][key] = timeline(fns[key], inputs, flush)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                res["errors"]["timeline_" + key] = str(e)[:300]
    save()
    print("timeline", res["timeline"], flush=True)
    add("pt2_compile_cpp_wrapper", lambda: torch.compile(load(), options={"cpp_wrapper": True}), share=0.7)
    if "pt2_compile_cpp_wrapper" in fns:
        f = fns["pt2_compile_cpp_wrapper"]
        three = {k: fns[k] for k in ("fact_ts", "pt2_compile") if k in fns}
        res["ms_with_cpp_wrapper"] = time_interleaved({**three, "pt2_compile_cpp_wrapper": f}, inputs, flush)
        res["cold"]["pt2_compile_cpp_wrapper"] = cold_call(f, inputs)
        save()
        print("cpp_wrapper", res["ms_with_cpp_wrapper"], flush=True)
    save()


if __name__ == "__main__":
    main()
