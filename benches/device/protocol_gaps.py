"""Where the suite protocol's extra time goes: each timed forward of the suite (epilogue_suite.py's
time_ms) starts on an idle GPU, after an L2 flush and a synchronize, so the host's time to reach the
first kernel counts, and any point where the GPU outruns the host. This profiles ITERS such forwards
of a composed module (CPU and CUDA activity) and reports, per forward: the event time, the kernels'
sum, the time from the host reaching the forward to its first kernel, the GPU's idle time between
the flush and that kernel, the idle gaps between kernels (with
the kernel before each) and the host ops that ran before the first kernel started.

    python3 benches/device/protocol_gaps.py COMPOSED_DIR POLICY SHAPE [OUT.json]
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_composed import load_composed  # noqa: E402

ITERS = 8


def main():
    m, x, out = load_composed(sys.argv)
    flush = torch.empty(64 << 20, dtype=torch.int32, device="cuda")
    event_ms = []
    torch.set_grad_enabled(False)
    for _ in range(10):
        m(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(ITERS):
            flush.zero_()
            with torch.profiler.record_function(f"forward_{i}"):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                m(x)
                e.record()
            e.synchronize()
            event_ms.append(s.elapsed_time(e))
    evs = list(prof.events())
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    # A record_function shows on both timelines: its host span is the forward's.
    fwd = sorted((e for e in evs if e.name.startswith("forward_") and e.device_type == cpu), key=lambda e: e.time_range.start)
    gpu = sorted((e for e in evs if e.device_type == cuda and not e.name.startswith("forward_")),
                 key=lambda e: e.time_range.start)
    cpu_ops = sorted((e for e in evs if e.device_type == cpu and not e.name.startswith("forward_")),
                     key=lambda e: e.time_range.start)
    rows = []
    for i, f in enumerate(fwd):
        nxt = fwd[i + 1].time_range.start if i + 1 < len(fwd) else float("inf")
        # The forward's kernels: launched by its host span, so they start after it began and
        # before the next forward's flush.
        ks = [g for g in gpu if g.time_range.start >= f.time_range.start and g.time_range.start < nxt and "fill" not in g.name
              and "zero" not in g.name.lower()]
        if not ks:
            continue
        first = ks[0].time_range.start
        flushes = [g for g in gpu if g.time_range.end <= first and g.time_range.start < f.time_range.end]
        after_flush = (first - flushes[-1].time_range.end) / 1e3 if flushes else None
        gaps = defaultdict(float)
        for a, b in zip(ks, ks[1:]):
            idle = b.time_range.start - a.time_range.end
            if idle > 5:
                gaps[a.name[:80]] += idle / 1e3
        # Host ops up to the first kernel's start: name, start and length in us from the forward's.
        host_before = [(c.name, round(c.time_range.start - f.time_range.start, 1), round(c.time_range.elapsed_us(), 1))
                       for c in cpu_ops if f.time_range.start <= c.time_range.start < first][:60]
        rows.append({
            "event_ms": event_ms[i],
            "kernels_ms": sum(k.time_range.elapsed_us() for k in ks) / 1e3,
            "span_ms": (ks[-1].time_range.end - first) / 1e3,
            "host_to_first_kernel_ms": (first - f.time_range.start) / 1e3,
            "host_span_ms": (f.time_range.end - f.time_range.start) / 1e3,
            "idle_after_flush_ms": after_flush,
            "gaps_ms": dict(gaps),
            "first_kernel": ks[0].name[:80],
            "first_kernel_at_us": round(first - f.time_range.start, 1),
            "host_ops_before_first_kernel": host_before,
        })
    med = lambda k: sorted(r[k] for r in rows)[len(rows) // 2]
    summary = {k: med(k) for k in ("event_ms", "kernels_ms", "span_ms", "host_to_first_kernel_ms", "host_span_ms",
                                      "idle_after_flush_ms")}
    print(json.dumps(summary))
    print("first kernel:", rows[-1]["first_kernel"])
    print("gaps (last forward):", json.dumps(rows[-1]["gaps_ms"]))
    print("host ops before the first kernel (last forward):", rows[-1]["host_ops_before_first_kernel"])
    if out:
        out.write_text(json.dumps({"summary": summary, "forwards": rows}, indent=1))


if __name__ == "__main__":
    main()
