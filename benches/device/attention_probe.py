"""Which of fact::attention's checks a call passes: runs the op of a composed library on the GPT
block's tensors (q, k, v as views of one qkv projection, the block's bool causal buffer and its
traced divisor) in several forms and prints, for each, whether the kernel ran (fact_op_stats) and
the largest difference to the original ops.

    python3 benches/device/attention_probe.py LIBRARY KERNEL
"""
import ctypes
import json
import sys

import torch

lib_path, kernel = sys.argv[1], sys.argv[2]
torch.ops.load_library(lib_path)
lib = ctypes.CDLL(lib_path)
lib.fact_op_stats.restype = ctypes.c_char_p
dev = "cuda"
torch.set_float32_matmul_precision("high")
B, T, C, H = 128, 512, 768, 8
D = C // H
qkv = torch.randn(B, T, 3 * C, device=dev)
q, k, v = (z.view(B, T, H, D).transpose(1, 2) for z in qkv.split(C, dim=2))
keep_bool = torch.tril(torch.ones(1024, 1024, dtype=torch.bool, device=dev))[:T, :T]
keep_float = torch.tril(torch.ones(1024, 1024, device=dev)).view(1, 1, 1024, 1024)[:, :, :T, :T]
divisor = torch.tensor(C) // H
divisor = divisor ** 0.5


def original(scale_mul, mask_fill):
    s = (q @ k.transpose(-2, -1)) * scale_mul
    return torch.softmax(s.masked_fill(mask_fill, float("-inf")), -1) @ v


cases = [
    ("div=tensor;mask=not", keep_bool, divisor, 1 / divisor.item(), ~keep_bool),
    ("div=tensor;mask=not", keep_bool, divisor.to(dev), 1 / divisor.item(), ~keep_bool),
    ("div=9.797958971132712;mask=not", keep_bool, None, 1 / 9.797958971132712, ~keep_bool),
    ("mul=0.10206207261596575;mask=eq0", keep_float, None, 0.10206207261596575, keep_float == 0),
]
with torch.no_grad():
    for form, mask, scale, mul, fill in cases:
        lib.fact_op_stats_reset()
        out = torch.ops.fact.attention(q, k, v, mask, scale, "explicit;" + form, kernel)
        torch.cuda.synchronize()
        stats = json.loads(lib.fact_op_stats())
        diff = (out - original(mul, fill)).abs().max().item()
        print(f"{form:40s} {stats} max diff {diff:.2e} divisor {divisor.dtype} {divisor.device}")
