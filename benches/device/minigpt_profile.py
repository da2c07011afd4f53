"""Measures where a MiniGPT block's time goes on the GPU, for comparison with fact's cost model.

Runs on the GPU machine: python3 benches/device/minigpt_profile.py OUT.json
The block is tests/fixtures/make_models.py's MiniGptBlock at (B, T, C) = (128, 512, 768), 8 heads,
fp32 under the tf32 policy (matmul precision "high"), eager, as the traced module runs it. The
torch profiler's device time of each top-level aten op is summed into fact's pattern ids (by the
op and its input shapes) and unmatched regions (by op kind), and each is given as a share of the
profiled total.
"""
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures"))
from make_models import MiniGptBlock  # noqa: E402

B, T, C, H = 128, 512, 768, 8
ITERS = 5

# fact's plan for this block (fact discover minigpt768.pt --input 128x512x768): node -> item.
LINEARS = {(3 * C, C): "p0 qkv linear", (C, C): "p3 proj linear", (4 * C, C): "p4 fc linear", (C, 4 * C): "p5 out linear"}
MATMULS = {(T, C // H, T): "p1 q@kT bmm", (T, T, C // H): "p2 att@v bmm"}
REGIONS = {
    "aten::div": "attention region (div, bitwise_not, masked_fill, softmax, contiguous)",
    "aten::bitwise_not": "attention region (div, bitwise_not, masked_fill, softmax, contiguous)",
    "aten::masked_fill": "attention region (div, bitwise_not, masked_fill, softmax, contiguous)",
    "aten::softmax": "attention region (div, bitwise_not, masked_fill, softmax, contiguous)",
    "aten::contiguous": "attention region (div, bitwise_not, masked_fill, softmax, contiguous)",
    "aten::add": "residual region (add, layer_norm, add)",
    "aten::gelu": "gelu",
}


def item(name, shapes):
    if name == "aten::linear":
        return LINEARS.get(tuple(shapes[1]), "other linear")
    if name == "aten::matmul":
        a, b = shapes[0], shapes[1]
        return MATMULS.get((a[-2], a[-1], b[-1]), "other matmul")
    if name == "aten::layer_norm":
        return "layer_norm (ln1 / ln2)"
    return REGIONS.get(name)


def main():
    torch.set_float32_matmul_precision("high")
    torch.manual_seed(0)
    m = MiniGptBlock(c=C, heads=H).cuda().eval()
    x = torch.randn(B, T, C, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            m(x)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            m(x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(ITERS):
                m(x)
            torch.cuda.synchronize()
    totals = {}
    for ev in prof.key_averages(group_by_input_shape=True):
        key = item(ev.key, ev.input_shapes)
        if key is None:
            continue
        totals[key] = totals.get(key, 0.0) + ev.device_time_total / 1000.0 / ITERS
    total = sum(totals.values())
    rows = sorted(({"item": k, "ms": v, "share": v / total} for k, v in totals.items()), key=lambda r: -r["ms"])
    report = {
        "workload": "MiniGPT block (B,T,C)=(128,512,768), 8 heads, fp32, tf32 policy, eager",
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "forward_ms_median": sorted(times)[len(times) // 2],
        "profiled_total_ms": total,
        "items": rows,
        "command": "python3 benches/device/minigpt_profile.py $OUT/minigpt_profile.json",
    }
    with open(sys.argv[1], "w") as f:
        json.dump(report, f, indent=2)
    print(f"forward {report['forward_ms_median']:.3f} ms; profiled ops {total:.3f} ms")
    for r in rows:
        print(f"{r['share'] * 100:6.1f}%  {r['ms']:8.4f} ms  {r['item']}")


if __name__ == "__main__":
    main()
