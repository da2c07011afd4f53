"""torch's (cuDNN's) convolutions at the problems fact's convolution rule finds in a model: the
baselines a convolution kernel must beat (issue 33; benches/device/conv.sh times fact's).

    python3 benches/device/conv_baseline.py FACT_BIN OUT_DIR [BATCH] [DTYPE] [MODEL]

traces torchvision MODEL (default resnet50; also mobilenet_v3_large, convnext_tiny) in eval mode
at BATCH (default 32) in DTYPE (bf16 or f16; default bf16) on the GPU, runs `FACT_BIN discover
--json` on the trace, and for each distinct `conv` pattern (its problem: the rule id and
NxHxWxCxKxRxS, with how often the model has it) builds the chain as the model runs it, on random
inputs and parameters (BatchNorm statistics and affine parameters away from the identity), and
times, L2 flushed, in turns:
  nchw_chain   conv → batch_norm → (+ residual) → act in NCHW, the graph's own ops;
  nchw_folded  the BatchNorm folded into the weight and bias (in fp32, then cast), conv with bias
               → (+ residual) → act in NCHW: cuDNN on the function fact::conv will compute;
  cl_folded    the same with activations, weights and residual channels-last (cuDNN's NHWC);
  to_cl        converting x to channels-last and the output back: what the op pays where a
               channels-last chain starts and ends.
Errors of the chain and of both folded forms against the chain in fp64 (the fold's rounding beside
the chain's own). Writes OUT_DIR/conv_baseline_<MODEL>.json; the summary is the last lines.
"""
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import flush_buffer, log, rel_err, time_interleaved, write_json  # noqa: E402

fact_bin, out_dir = sys.argv[1], Path(sys.argv[2])
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 32
dtype_name = sys.argv[4] if len(sys.argv) > 4 else "bf16"
model_name = sys.argv[5] if len(sys.argv) > 5 else "resnet50"
dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype_name]
dev = "cuda"
torch.manual_seed(0)
out_dir.mkdir(parents=True, exist_ok=True)

ACTS = {
    None: lambda y: y,
    "relu": F.relu,
    "silu": F.silu,
    "hardswish": F.hardswish,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
}


def trace(name):
    import torchvision

    model = getattr(torchvision.models, name)().eval().to(dev, dtype)
    x = torch.randn(batch, 3, 224, 224, device=dev, dtype=dtype)
    with torch.no_grad():
        traced = torch.jit.trace(model, x)
    path = out_dir / f"{name}_b{batch}_{dtype_name}.pt"
    traced.save(str(path))
    return path


def problems(path):
    """The distinct conv problems of the plan, each with its count, in the plan's order."""
    out = subprocess.run([fact_bin, "discover", str(path), "--json"], check=True, capture_output=True, text=True)
    plan = json.loads(out.stdout)["plan"]
    seen = {}
    for p in plan["patterns"]:
        prob = p["problem"]
        if "in_channels" not in prob:
            continue
        key = json.dumps(prob, sort_keys=True)
        if key in seen:
            seen[key]["count"] += 1
        else:
            shape = "x".join(str(prob[k]) for k in ("images", "height", "width", "in_channels", "out_channels"))
            shape += "x{}x{}".format(*prob["filter"])
            # The problem's bias is the convolution's, the BatchNorm's or both: the name says which.
            seen[key] = {
                "problem": prob,
                "rule": p["rule"],
                "shape": shape,
                "conv_bias": "+ bias" in p["name"],
                "bn": "+ bn" in p["name"],
                "count": 1,
            }
    return list(seen.values())


def chain_inputs(f):
    p = f["problem"]
    n, c, h, w, k = p["images"], p["in_channels"], p["height"], p["width"], p["out_channels"]
    r, s = p["filter"]
    x = torch.randn(n, c, h, w, device=dev, dtype=dtype)
    wt = torch.randn(k, c, r, s, device=dev, dtype=dtype) / (c * r * s) ** 0.5
    bn = {
        "conv_bias": 0.1 * torch.randn(k, device=dev, dtype=dtype) if f["conv_bias"] else None,
        "mean": 0.1 * torch.randn(k, device=dev, dtype=dtype),
        "var": 0.5 + torch.rand(k, device=dev, dtype=dtype),
        "gamma": 1 + 0.2 * torch.randn(k, device=dev, dtype=dtype),
        "beta": 0.1 * torch.randn(k, device=dev, dtype=dtype),
    }
    q, pq = conv_out(p)
    res = torch.randn(n, k, q, pq, device=dev, dtype=dtype) if p["residual"] else None
    return x, wt, bn, res


def conv_out(p):
    def one(i, size):
        return (size + 2 * p["padding"][i] - p["dilation"][i] * (p["filter"][i] - 1) - 1) // p["stride"][i] + 1

    return one(0, p["height"]), one(1, p["width"])


def run(f, x, wt, bn, res, eps=1e-5):
    """The graph's chain: the convolution (with its own bias, if any), the BatchNorm, if any."""
    p = f["problem"]
    y = F.conv2d(x, wt, bn["conv_bias"], p["stride"], p["padding"], p["dilation"], p["groups"])
    if f["bn"]:
        y = F.batch_norm(y, bn["mean"], bn["var"], bn["gamma"], bn["beta"], False, 0.1, eps)
    if res is not None:
        y = y + res
    return ACTS[p["act"]](y)


def fold(f, wt, bn, eps=1e-5):
    """The BatchNorm as a scale of the weight's rows and a bias, computed in fp32, then cast."""
    if not f["bn"]:
        return wt, bn["conv_bias"]
    scale = bn["gamma"].float() / torch.sqrt(bn["var"].float() + eps)
    w = (wt.float() * scale[:, None, None, None]).to(dtype)
    shift = bn["beta"].float() - bn["mean"].float() * scale
    if bn["conv_bias"] is not None:
        shift = shift + bn["conv_bias"].float() * scale
    return w, shift.to(dtype)


def folded(p, x, w, b, res):
    y = F.conv2d(x, w, b, p["stride"], p["padding"], p["dilation"], p["groups"])
    if res is not None:
        y = y + res
    return ACTS[p["act"]](y)


def main():
    path = trace(model_name)
    found = problems(path)
    log(f"{model_name} at batch {batch} {dtype_name}: {len(found)} distinct conv problems, {sum(f['count'] for f in found)} patterns")
    flush = flush_buffer()
    rows = []
    with torch.no_grad():
        for f in found:
            p = f["problem"]
            x, wt, bn, res = chain_inputs(f)
            wf, bf = fold(f, wt, bn)
            cl = torch.channels_last
            x_cl, wf_cl = x.contiguous(memory_format=cl), wf.contiguous(memory_format=cl)
            res_cl = res.contiguous(memory_format=cl) if res is not None else None
            d = {k: (v.double() if v is not None else None) for k, v in bn.items()}
            ref = run(f, x.double(), wt.double(), d, res.double() if res is not None else None)
            errs = {
                "nchw_chain": rel_err(run(f, x, wt, bn, res), ref),
                "nchw_folded": rel_err(folded(p, x, wf, bf, res), ref),
                "cl_folded": rel_err(folded(p, x_cl, wf_cl, bf, res_cl), ref),
            }
            ms = time_interleaved(
                {
                    "nchw_chain": lambda: run(f, x, wt, bn, res),
                    "nchw_folded": lambda: folded(p, x, wf, bf, res),
                    "cl_folded": lambda: folded(p, x_cl, wf_cl, bf, res_cl),
                    "to_cl": lambda: x.contiguous(memory_format=cl).contiguous(),
                },
                (),
                flush,
            )
            m, n, kk = p["images"] * conv_out(p)[0] * conv_out(p)[1], p["out_channels"], p["in_channels"] * p["filter"][0] * p["filter"][1]
            row = {**f, "gemm_mnk": [m, n, kk], "ms": ms, "rel_err": errs, "tflops_cl": 2 * m * n * kk / ms["cl_folded"] / 1e9}
            rows.append(row)
            log(
                f"  {f['rule']:34s} {f['shape']:24s} x{f['count']:<2d} chain {ms['nchw_chain']:.4f} ms, folded nchw {ms['nchw_folded']:.4f}, "
                f"cl {ms['cl_folded']:.4f} ({row['tflops_cl']:.0f} TFLOP/s), to_cl {ms['to_cl']:.4f}; err chain {errs['nchw_chain']:.1e} folded {errs['nchw_folded']:.1e}"
            )
    total = {k: sum(r["ms"][k] * r["count"] for r in rows) for k in ("nchw_chain", "nchw_folded", "cl_folded", "to_cl")}
    record = {
        "model": model_name,
        "batch": batch,
        "dtype": dtype_name,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "problems": rows,
        "total_ms": total,
    }
    write_json(out_dir / f"conv_baseline_{model_name}.json", record)
    log(
        f"{model_name} b{batch} {dtype_name} on {record['device']}: every matched conv, weighted by count: "
        f"chain NCHW {total['nchw_chain']:.3f} ms, folded NCHW {total['nchw_folded']:.3f} ms, folded channels-last "
        f"{total['cl_folded']:.3f} ms, per-call conversion of x {total['to_cl']:.3f} ms"
    )


main()
