"""The models and GPU checks of benches/device/views_check.sh: GEMMs read through views (GPT-2's
Conv1D, `addmm(bias, x.view(-1, C), W).view(B, T, N)`), their epilogues fused through the views.

    python3 views_check.py trace NAME PATH          traces model NAME on the GPU at its real shape
                                                    and saves it to PATH
    python3 views_check.py check NAME DIR ORIG REPORT
                                                    runs DIR's composed module against ORIG on the
                                                    GPU and adds the result to the JSON file REPORT

NAME: conv1d_mlp (tests/fixtures' Conv1DMlp at C 768: the written-out GELU, eval dropout, a
residual met as [B*T, C] and an expanded scale; B 8, T 1024) or gpt2 (GPT2LMHeadModel of
GPT2Config(n_layer=2), B 8, T 1024; needs transformers).
"""
import ctypes
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures"))

B, T, C = 8, 1024, 768
# Fused patterns the rules find in each model: conv1d_mlp's two Conv1Ds; each GPT-2 layer's
# attn.c_proj (+ dropout, residual), c_fc (+ GELU) and mlp.c_proj (+ dropout, residual).
EXPECTED_GEMM_EP = {"conv1d_mlp": 2, "gpt2": 6}


def inputs(name):
    torch.manual_seed(0)
    if name == "conv1d_mlp":
        return (
            torch.randn(B, T, C, device="cuda"),
            torch.randn(B * T, C, device="cuda"),
            torch.randn(C, device="cuda"),
        )
    return (torch.randint(0, 50257, (B, T), device="cuda"),)


def model(name):
    if name == "conv1d_mlp":
        from make_models import Conv1DMlp

        return Conv1DMlp(c=C)
    from transformers import GPT2Config, GPT2LMHeadModel

    m = GPT2LMHeadModel(GPT2Config(n_layer=2, use_cache=False))

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).logits

    return Logits(m)


def trace(name, path):
    torch.manual_seed(0)
    m = model(name).cuda().eval()
    with torch.no_grad():
        torch.jit.trace(m, inputs(name), strict=False).save(path)


def check(name, d, orig, report_path):
    lib_path = os.path.join(d, "libfact_ops.so")
    torch.ops.load_library(lib_path)
    lib = ctypes.CDLL(lib_path)
    lib.fact_op_stats.restype = ctypes.c_char_p
    composed = torch.jit.load(os.path.join(d, "composed.pt"), map_location="cuda")
    original = torch.jit.load(orig, map_location="cuda")
    xs = inputs(name)
    graph = str(composed.inlined_graph)
    result = {
        "gemm_ep_calls_in_graph": graph.count("fact::gemm_ep("),
        "gemm_calls_in_graph": graph.count("fact::gemm("),
        "aten_addmm_left": graph.count("aten::addmm("),
        "problems": [],
    }
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        want = original(*xs).double()
        torch.set_float32_matmul_precision("high")
        original(*xs)  # warm-up, then the counted composed call
        composed(*xs)
        lib.fact_op_stats_reset()
        got = composed(*xs).double()
        torch.cuda.synchronize()
    stats = json.loads(lib.fact_op_stats())
    result["stats"] = stats
    result["rel_err_vs_fp32"] = ((got - want).norm() / want.norm()).item()
    if tuple(got.shape) != tuple(want.shape):
        result["problems"].append(f"shape {tuple(got.shape)} vs {tuple(want.shape)}")
    if result["gemm_ep_calls_in_graph"] != EXPECTED_GEMM_EP[name]:
        result["problems"].append(
            f"{result['gemm_ep_calls_in_graph']} fact::gemm_ep calls, expected {EXPECTED_GEMM_EP[name]}"
        )
    for kernel, c in stats.items():
        if c["fell_back"] or not c["ran"]:
            result["problems"].append(f"{kernel}: ran {c['ran']}, fell back {c['fell_back']} ({c.get('why', '')})")
    if not result["rel_err_vs_fp32"] < 1e-2:
        result["problems"].append(f"relative error {result['rel_err_vs_fp32']:.2e} against fp32")
    result["ok"] = not result["problems"]
    report = json.load(open(report_path)) if os.path.exists(report_path) else {}
    report[name] = result
    json.dump(report, open(report_path, "w"), indent=1)
    print(json.dumps({name: result}, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "trace":
        trace(sys.argv[2], sys.argv[3])
    else:
        check(*sys.argv[2:6])
