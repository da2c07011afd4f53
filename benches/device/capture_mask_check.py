"""A padded attention kernel under CUDA graph capture, where it reads the call's mask itself in
place of the key lengths (the host cannot classify a mask while the stream captures): for each
mask form (bool key padding as BERT's, bool with holes, bool left padding broadcast over the
queries, additive finfo.min padding, an additive random bias with -inf cells), fact::attention is
captured with the composed model's padded sm90 kernel, replayed on fresh q, k, v and mask values
copied into the captured ones, and compared with SDPA in fp64 on those values; the op's counters
over the capture must show the kernel ran and nothing fell back. Each capture holds two calls
sharing the mask, as a model's layers do. Each form's replay (both calls) is timed
(`replay_ms`, CUDA events, median of 50) beside the uncaptured call with a key-padding mask
(`uncaptured_padding_ms`: the lengths classified on the host, cached after the first call).

    python3 benches/device/capture_mask_check.py OUT/fact/bert [--shape 32x12x512x64] [--json F]

OUT/fact/bert is a folder fact composed for a model with a padded mask (its compose.json names the
kernel). Exit 1 when a form fails.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zoo"))
from harness import rel_err  # noqa: E402
from serve import Library  # noqa: E402

TOL = 2e-2


def masks(b, t, dtype):
    """(name, form's mask mode, a function of a seed giving a fresh mask of that form)."""
    dev = "cuda"

    def prefix(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        lengths = torch.randint(1, t + 1, (b,), generator=g, device=dev)
        keys = torch.arange(t, device=dev)[None, :] < lengths[:, None]
        return keys[:, None, None, :].expand(b, 1, t, t).contiguous()

    def holes(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        m = torch.rand(b, 1, t, t, generator=g, device=dev) < 0.7
        m[..., 0] = True  # every query sees a key
        return m

    def left(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        starts = torch.randint(0, t, (b,), generator=g, device=dev)
        return (torch.arange(t, device=dev)[None, :] >= starts[:, None])[:, None, None, :]

    def added_padding(seed):
        keys = prefix(seed)[:, :, :1, :]
        return torch.zeros(keys.shape, dtype=dtype, device=dev).masked_fill(~keys, torch.finfo(dtype).min)

    def added_bias(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        bias = (torch.randn(b, 1, t, t, generator=g, device=dev) * 2).to(dtype)
        cut = torch.rand(b, 1, t, t, generator=g, device=dev) < 0.2
        cut[..., 0] = False
        return bias.masked_fill(cut, float("-inf"))

    def mixed(seed):
        m = prefix(seed)
        m[: b // 2] = holes(seed)[: b // 2]
        return m

    return [("bool key padding", "bool", prefix), ("bool with holes", "bool", holes),
            ("bool, half the batch padding, half with holes", "bool", mixed),
            ("bool left padding [B,1,1,T]", "bool", left), ("added finfo.min padding [B,1,1,T]", "add", added_padding),
            ("added bias with -inf cells", "add", added_bias)]


def timed(fn, reps=50):
    """fn's median time in ms over `reps` calls (CUDA events, after 5 warm-up calls)."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        z.record()
        z.synchronize()
        times.append(a.elapsed_time(z))
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("composed", type=Path)
    ap.add_argument("--shape", default="32x12x512x64")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    b, h, t, d = map(int, args.shape.split("x"))
    report = json.loads((args.composed / "compose.json").read_text())
    kernels = sorted({p["kernel"] for p in report["patterns"] if p.get("kernel") and "_klen" in p["kernel"] and "causal" not in p["kernel"]})
    if not kernels:
        sys.exit(f"{args.composed}: no padded sm90 attention kernel (name with _klen, without causal) in compose.json")
    kernel = kernels[0]
    lib = Library(args.composed / "libfact_ops.so")
    dtype = torch.bfloat16
    scale = d ** -0.5
    rows, failed = [], 0
    uncaptured_ms = None
    for name, mode, make in masks(b, t, dtype):
        form = f"sdpa;mask={mode};class=padded;scale={scale!r}"

        def call(q, k, v, m):
            return torch.ops.fact.attention(q, k, v, m, None, form, kernel, None, None, None, None)

        def layers(q, k, v, m):
            # Two calls sharing the mask, as a model's layers do: the second reads the lengths
            # the first computed in the capture.
            return call(q, k, v, m), call(k, q, v, m)

        def fresh(seed):
            g = torch.Generator(device="cuda").manual_seed(seed)
            qkv = [torch.randn(b, h, t, d, generator=g, device="cuda").to(dtype) for _ in range(3)]
            return qkv + [make(seed)]

        if uncaptured_ms is None:
            xs = fresh(1)
            uncaptured_ms = timed(lambda: call(*xs))
        static = fresh(1)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            layers(*static)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        lib.so.fact_op_stats_reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = layers(*static)
        stats = json.loads(lib.so.fact_op_stats())
        ran = sum(c["ran"] for c in stats.values())
        fell = sum(c["fell_back"] for c in stats.values())
        why = sorted({c["why"] for c in stats.values() if c.get("why")})
        errs = []
        for seed in (2, 3):
            new = fresh(seed)
            for dst, src in zip(static, new):
                dst.copy_(src)
            graph.replay()
            q, k, v, m = new
            mask64 = m if mode == "bool" else m.double()
            for out, (a, c) in zip(outs, ((q, k), (k, q))):
                ref = torch.nn.functional.scaled_dot_product_attention(a.double(), c.double(), v.double(), attn_mask=mask64, scale=scale)
                errs.append(rel_err(out, ref))
        replay_ms = timed(graph.replay)
        ok = ran == 2 and fell == 0 and max(errs) <= TOL
        failed += not ok
        row = {"mask": name, "form": form, "kernel": kernel, "shape": [b, h, t, d], "captured_kernel_calls": ran,
               "captured_fallback_calls": fell, "fallback_why": why, "replay_vs_fp64": max(errs), "ok": ok,
               "replay_ms": round(replay_ms, 4), "uncaptured_padding_ms": round(uncaptured_ms, 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
