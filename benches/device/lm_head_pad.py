"""GPT-2's lm_head with its vocabulary padded (issue 31): a model whose logits linear reads the
token embedding's tied weight (B 8, T 1024, C 768, vocabulary 50257, bf16) is traced on the GPU,
composed with fact (which pads the weight to 50264 rows once, in the composed module), and three
GEMMs are timed in turns in one process:

- fact_ms: the composed module, one fact::gemm on the padded weight returning the first 50257
  columns (a view);
- cublas_padded_ms: cuBLAS on the same GEMM padded, F.linear(h, weight padded to 50264 rows);
- torch_ms: the unpadded F.linear(h, weight) the graph runs (cuBLAS's align-1 kernel under bf16).

Each is verified first against fp64 (relative Frobenius error), then timed: 5 warm-ups, 30
iterations in which each runs once in turn, CUDA events, L2 flushed (256 MB written) before every
run, medians (epilogue_suite.time_interleaved). The op library's counters say whether fact's
kernel ran. Runs on the GPU machine from the repository root, after `source .device/env.sh`:

    python3 benches/device/lm_head_pad.py OUT_DIR [--fact .device/fact] [--fact-args '--jobs 16']

Writes OUT_DIR/lm_head_pad.json (the record below) and OUT_DIR/logs/compose.log. The issue's
target: fact within 5% of cuBLAS on the padded GEMM (cublas_padded_ms / fact_ms >= 0.95).
"""
import argparse
import ctypes
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from epilogue_suite import FLUSH_FLOATS, rel_err, run_logged, substituted, time_interleaved, write_json  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
B, T, C, VOCAB, PADDED = 8, 1024, 768, 50257, 50264


class LmHead(torch.nn.Module):
    """The token embedding and the logits linear sharing one weight, as GPT2LMHeadModel ties them."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, C)
        self.lm_head = torch.nn.Linear(C, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, h):
        return self.lm_head(h)


def log(*args):
    print(*args, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--fact", type=Path, default=REPO / ".device" / "fact")
    ap.add_argument("--fact-args", default="", help="extra arguments for fact compose")
    ap.add_argument("--compose-timeout", type=float, default=1800)
    args = ap.parse_args()
    out = args.out_dir
    (out / "models").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    rec = {
        "model": "gpt2_lm_head", "shape": [B * T, VOCAB, C], "padded_to": PADDED, "dtype": "bf16",
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "host": platform.node(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }

    torch.manual_seed(0)
    module = LmHead().cuda().to(torch.bfloat16).eval()
    module.wte.weight.data.normal_(0.0, 0.02)
    h = torch.randn(B, T, C, device="cuda", dtype=torch.bfloat16)
    model = out / "models" / "lm_head.pt"
    with torch.no_grad():
        torch.jit.trace(module, (h,)).save(str(model))

    fact_dir = out / "fact"
    cmd = [str(args.fact), "compose", str(model), "--out", str(fact_dir), "--no-bench"] + args.fact_args.split()
    rc, rec["compose_s"] = run_logged(cmd, out / "logs" / "compose.log", args.compose_timeout)
    rec["compose_rc"] = rc
    rec["substituted"] = substituted(fact_dir / "compose.json")
    try:
        patterns = json.loads((fact_dir / "compose.json").read_text())["patterns"]
        rec["patterns"] = [{k: p.get(k) for k in ("rule", "kernel", "kernel_ms", "torch_ms", "realization")} for p in patterns]
    except (OSError, ValueError, KeyError):
        rec["patterns"] = None
    if rc != 0 or not (fact_dir / "composed.pt").exists():
        rec["error"] = f"fact compose exited {rc}: see logs/compose.log"
        write_json(out / "lm_head_pad.json", rec)
        log(json.dumps(rec, indent=1))
        return 1

    lib = fact_dir / "libfact_ops.so"
    torch.ops.load_library(str(lib))
    so = ctypes.CDLL(str(lib))
    so.fact_op_stats.restype = ctypes.c_char_p
    composed = torch.jit.load(str(fact_dir / "composed.pt"), map_location="cuda")
    graph = str(composed.inlined_graph)
    rec["fact_gemm_calls_in_graph"] = graph.count("fact::gemm(")
    w = module.wte.weight.detach()
    w_pad = torch.zeros(PADDED, C, device="cuda", dtype=torch.bfloat16)
    w_pad[:VOCAB] = w

    def fact(x):
        return composed(x)

    def cublas_padded(x):
        return F.linear(x, w_pad)[..., :VOCAB]

    def torch_unpadded(x):
        return F.linear(x, w)

    fns = {"fact_ms": fact, "cublas_padded_ms": cublas_padded, "torch_ms": torch_unpadded}
    with torch.no_grad():
        ref = F.linear(h.double(), w.double())
        for name, fn in fns.items():
            y = fn(h)
            assert y.shape == (B, T, VOCAB), (name, y.shape)
            rec[name.replace("_ms", "_rel_err")] = rel_err(y, ref)
        rec["fact_output_strides"] = list(fact(h).stride())
        del ref
        so.fact_op_stats_reset()
        flush = torch.empty(FLUSH_FLOATS, device="cuda")
        start = time.monotonic()
        rec.update(time_interleaved(fns, (h,), flush))
        rec["timing_s"] = time.monotonic() - start
    rec["op_calls"] = json.loads(so.fact_op_stats())
    rec["fact_vs_cublas_padded"] = rec["cublas_padded_ms"] / rec["fact_ms"]
    rec["fact_vs_torch"] = rec["torch_ms"] / rec["fact_ms"]
    rec["cublas_padded_vs_torch"] = rec["torch_ms"] / rec["cublas_padded_ms"]
    write_json(out / "lm_head_pad.json", rec)
    log(json.dumps(rec, indent=1))
    log(
        f"lm_head {B * T}x{VOCAB}x{C} bf16: fact {rec['fact_ms']:.3f} ms, cuBLAS padded {rec['cublas_padded_ms']:.3f} ms "
        f"({rec['fact_vs_cublas_padded']:.3f}x; target >= 0.95), unpadded torch {rec['torch_ms']:.3f} ms "
        f"({rec['fact_vs_torch']:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
