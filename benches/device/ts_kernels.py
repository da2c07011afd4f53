"""Where a composition's GPU time goes against its original, kernel by kernel: the TorchScript
pair a compose writes with --torchscript-copy (DIR/torchscript/original.pt and composed.pt, the
op library DIR/libfact_ops.so), each run 3 times and then profiled over 5 forwards
(torch.profiler, CUDA activity only), its kernels summed per forward by name.

    python3 benches/device/ts_kernels.py DIR OUT.json [SHAPE]

SHAPE is the one bf16 input, 32x3x224x224 by default (vit_b_16 at the zoo's batch). Prints the
kernels' sum per forward and the 16 largest of each; OUT.json keeps the 25 largest as
[name, ms per forward, calls per forward].
"""
import collections
import json
import sys

import torch

ITERS = 5


def kernels(m, x):
    """{kernel name: [ms per forward, calls]} over ITERS profiled forwards after 3 warm ones."""
    with torch.no_grad():
        for _ in range(3):
            m(x)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
            for _ in range(ITERS):
                m(x)
            torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0.0, 0])
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name[:110]][0] += e.device_time_total / ITERS / 1000
            agg[e.name[:110]][1] += 1
    return agg


def main():
    d, out = sys.argv[1].rstrip("/") + "/", sys.argv[2]
    shape = [int(v) for v in (sys.argv[3] if len(sys.argv) > 3 else "32x3x224x224").split("x")]
    torch.ops.load_library(d + "libfact_ops.so")
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    res = {}
    for name in ["original", "composed"]:
        m = torch.jit.load(d + f"torchscript/{name}.pt", map_location="cuda").eval()
        agg = kernels(m, x)
        rows = sorted(agg.items(), key=lambda kv: -kv[1][0])
        res[name] = [(k, round(v[0], 4), v[1] // ITERS) for k, v in rows[:25]]
        print(name, "kernels ms per forward", round(sum(v[0] for v in agg.values()), 3))
        for r in res[name][:16]:
            print("  ", r)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
