"""Where a composed module's time goes on the GPU: every CUDA kernel of its forward, summed over a
few profiled iterations, the forward's wall time against the sum of its kernels (the gap is
launch and host work the GPU waits on), and the GPU's idle gaps over 5 us with the kernel before
each (a gap after a device-to-host copy is the host catching up after waiting for the stream).

    python3 benches/device/profile_composed.py COMPOSED_DIR POLICY SHAPE [OUT.json]

POLICY is tf32, f32 or bf16 (input dtype and matmul precision, as epilogue_suite.py); SHAPE the
forward's one input, e.g. 128x512x768.
"""
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from epilogue_suite import DTYPE, MATMUL_PRECISION  # noqa: E402 -- the suite's, one copy each

ITERS = 5


def load_composed(argv):
    """COMPOSED_DIR POLICY SHAPE [OUT.json] from `argv`: the composed module (its op library
    loaded, the policy's matmul precision set), a random input of SHAPE and the output path."""
    d, policy, shape = Path(argv[1]), argv[2], [int(v) for v in argv[3].split("x")]
    out = Path(argv[4]) if len(argv) > 4 else None
    torch.set_float32_matmul_precision(MATMUL_PRECISION[policy])
    torch.ops.load_library(str(d / "libfact_ops.so"))
    m = torch.jit.load(str(d / "composed.pt"), map_location="cuda").eval()
    return m, torch.randn(shape, device="cuda", dtype=DTYPE[policy]), out


def main():
    m, x, out = load_composed(sys.argv)
    with torch.no_grad():
        for _ in range(10):
            m(x)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            m(x)
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) / 20 * 1e3
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(ITERS):
                m(x)
            torch.cuda.synchronize()
    kernels = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[e.name[:140]]
            k[0] += e.device_time / 1e3 / ITERS
            k[1] += 1
    timeline = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                      key=lambda e: e.time_range.start)
    gaps = defaultdict(lambda: [0.0, 0])
    for a, b in zip(timeline, timeline[1:]):
        idle = (b.time_range.start - a.time_range.end) / 1e3
        if idle > 0.005:
            g = gaps[a.name[:100]]
            g[0] += idle / ITERS
            g[1] += 1
    rows = sorted(((ms, n // ITERS, name) for name, (ms, n) in kernels.items()), reverse=True)
    total = sum(r[0] for r in rows)
    print(f"forward wall {wall_ms:.3f} ms (back to back), kernels {total:.3f} ms per forward")
    for ms, n, name in rows:
        print(f"{ms:8.3f} ms {100 * ms / total:5.1f}%  x{n:<3} {name}")
    gap_rows = sorted(((ms, n, name) for name, (ms, n) in gaps.items()), reverse=True)
    print(f"idle gaps over 5 us: {sum(r[0] for r in gap_rows):.3f} ms per forward")
    for ms, n, name in gap_rows:
        print(f"{ms:8.3f} ms  x{n:<3} after {name}")
    if out:
        out.write_text(json.dumps({"policy": policy, "shape": shape, "wall_ms": wall_ms, "kernels_ms": total,
                                   "kernels": [{"ms": ms, "calls": n, "name": name} for ms, n, name in rows],
                                   "gaps_after": [{"ms": ms, "count": n, "name": name} for ms, n, name in gap_rows]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
