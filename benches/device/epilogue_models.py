"""The models of the GEMM + elementwise-epilogue benchmark suite (benches/device/epilogue_suite.py).

Each model is one Linear (or a matmul with a 2-D weight) followed by 1-6 elementwise ops, at the
shapes where such epilogues sit in practice: a 8192 -> 8192 Linear at batch 1024, and the four
Linear shapes of a GPT-2 block (768 -> 2304 qkv, 768 -> 3072 fc, 3072 -> 768 out, 768 -> 768 proj)
at M = 65536 rows (B*T = 128*512), some with 3-D [128, 512, K] inputs so leading dims are folded.

`suite()` lists them as (name, module_factory, input_shapes): input_shapes holds one shape per
forward input (residual models take the residual as a second input, of the output's shape).
Factories draw their parameters from torch's global RNG; seed it for reproducible weights.
"""
import functools
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

B, T = 128, 512
M = B * T
C = 768


class Act(nn.Module):
    """act(linear(x)): a Linear, with or without bias, then an elementwise function."""

    def __init__(self, k, n, act, bias=True):
        super().__init__()
        self.fc = nn.Linear(k, n, bias=bias)
        self.act = act

    def forward(self, x):
        return self.act(self.fc(x))


class MatmulBias(nn.Module):
    """act(x @ weight + bias) with a [K, N] weight: aten::matmul and a broadcast add, no Linear."""

    def __init__(self, k, n, act):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) / math.sqrt(k))
        self.bias = nn.Parameter(torch.randn(n) / math.sqrt(k))
        self.act = act

    def forward(self, x):
        return self.act(x @ self.weight + self.bias)


class VecScale(nn.Module):
    """linear(x) * scale, with scale an [N] parameter broadcast over the rows."""

    def __init__(self, k, n):
        super().__init__()
        self.fc = nn.Linear(k, n)
        self.scale = nn.Parameter(torch.randn(n))

    def forward(self, x):
        return self.fc(x) * self.scale


class VecAffine(nn.Module):
    """linear_nobias(x) * scale + shift, with [N] parameters: a per-column affine in place of a bias."""

    def __init__(self, k, n):
        super().__init__()
        self.fc = nn.Linear(k, n, bias=False)
        self.scale = nn.Parameter(torch.randn(n))
        self.shift = nn.Parameter(torch.randn(n))

    def forward(self, x):
        return self.fc(x) * self.scale + self.shift


class Residual(nn.Module):
    """r + linear(x): the residual add after a transformer block's projection."""

    def __init__(self, k, n):
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x, r):
        return r + self.fc(x)


class Residual2(nn.Module):
    """linear(x) + r + s: two residuals, one read as the GEMM's C operand (the split families:
    through an aux load) and one through an aux load."""

    def __init__(self, k, n):
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x, r, s):
        return self.fc(x) + r + s


class Chain6(nn.Module):
    """clamp((linear(x) * 0.5 + 1.0) * scale + r, -4, 4): bias, two scalar ops, a vector mul, the
    residual add and a clamp, six elementwise ops in one epilogue."""

    def __init__(self, k, n):
        super().__init__()
        self.fc = nn.Linear(k, n)
        self.scale = nn.Parameter(torch.randn(n))

    def forward(self, x, r):
        return torch.clamp((self.fc(x) * 0.5 + 1.0) * self.scale + r, -4.0, 4.0)


def gelu_tanh(y):
    return F.gelu(y, approximate="tanh")


def gelu_tanh_written(y):
    """The tanh GELU as GPT-2 code writes it out (y is used three times)."""
    return 0.5 * y * (1 + torch.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * torch.pow(y, 3.0))))


def swish_written(y):
    """SiLU written out: y * sigmoid(y) (y is used twice)."""
    return y * torch.sigmoid(y)


def scalar_chain(y):
    return y * 0.5 + 1.0


def leaky_relu(y):
    return F.leaky_relu(y, 0.1)


def clamp(y):
    return torch.clamp(y, -0.5, 0.5)


def gpt_block(written_gelu):
    """The MiniGPT block of the end-to-end benchmark (tests/fixtures/make_models.py) at C = 768,
    8 heads, with F.gelu (erf) or the tanh GELU written out."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures"))
    from make_models import MiniGptBlock  # noqa: E402

    return MiniGptBlock(c=C, heads=8, act=gelu_tanh_written if written_gelu else F.gelu)


class CausalSelfAttention(nn.Module):
    """minGPT's CausalSelfAttention: qkv Linear, attention written out (q·kᵀ · 1/√d, the causal
    `bias` buffer compared `== 0` and filled with -inf, softmax, eval dropout, ·v), proj Linear."""

    def __init__(self, c, heads, t_max):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.attn_dropout = nn.Dropout(0.1)
        self.register_buffer("bias", torch.tril(torch.ones(t_max, t_max)).view(1, 1, t_max, t_max))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class EncoderSdpa(nn.Module):
    """A non-causal encoder self-attention through F.scaled_dot_product_attention."""

    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


def attention_suite():
    """The attention issue's models: minGPT's CausalSelfAttention at the block's shape and at
    GPT-2 small's (B 16, T 1024, C 768, 12 heads), and a non-causal SDPA encoder attention."""
    p = functools.partial
    return [
        ("mingpt_attention", p(CausalSelfAttention, C, 8, T), [(B, T, C)]),
        ("gpt2_attention", p(CausalSelfAttention, C, 12, 1024), [(16, 1024, C)]),
        ("encoder_sdpa", p(EncoderSdpa, C, 12), [(32, 512, C)]),
    ]


def suite():
    """The suite's models: (name, module_factory, input_shapes), one shape per forward input."""
    big = [(1024, 8192)]
    rows, rows3, rows4 = [(M, C)], [(B, T, C)], [(M, 4 * C)]
    p = functools.partial
    return [
        # 8192 -> 8192 at batch 1024.
        ("l8192_bias_relu", p(Act, 8192, 8192, F.relu), big),
        ("l8192_nobias_relu", p(Act, 8192, 8192, F.relu, bias=False), big),
        ("l8192_bias_gelu", p(Act, 8192, 8192, F.gelu), big),
        ("l8192_scalar_chain", p(Act, 8192, 8192, scalar_chain), big),
        # qkv: 768 -> 2304.
        ("gpt_qkv_bias", p(nn.Linear, C, 3 * C), rows),
        ("gpt_qkv_vec_scale", p(VecScale, C, 3 * C), rows3),
        ("gpt_qkv_clamp", p(Act, C, 3 * C, clamp), rows),
        # fc: 768 -> 3072, the MLP's activations.
        ("gpt_fc_matmul_bias_relu", p(MatmulBias, C, 4 * C, torch.relu), rows),
        ("gpt_fc_gelu", p(Act, C, 4 * C, F.gelu), rows3),
        ("gpt_fc_gelu_tanh", p(Act, C, 4 * C, gelu_tanh), rows),
        ("gpt_fc_gelu_tanh_written", p(Act, C, 4 * C, gelu_tanh_written), rows3),
        ("gpt_fc_silu", p(Act, C, 4 * C, F.silu), rows),
        ("gpt_fc_swish_written", p(Act, C, 4 * C, swish_written), rows),
        ("gpt_fc_leaky_relu", p(Act, C, 4 * C, leaky_relu), rows),
        ("gpt_fc_tanh", p(Act, C, 4 * C, torch.tanh), rows),
        ("gpt_fc_sigmoid", p(Act, C, 4 * C, torch.sigmoid), rows),
        ("gpt_fc_mish", p(Act, C, 4 * C, F.mish), rows),
        ("gpt_fc_softplus", p(Act, C, 4 * C, F.softplus), rows),
        # out: 3072 -> 768, into the residual stream.
        ("gpt_out_residual", p(Residual, 4 * C, C), [(M, 4 * C), (M, C)]),
        ("gpt_out_hardtanh", p(Act, 4 * C, C, F.hardtanh), rows4),
        ("gpt_out_chain6", p(Chain6, 4 * C, C), [(M, 4 * C), (M, C)]),
        # proj: 768 -> 768.
        ("gpt_proj_residual", p(Residual, C, C), [(B, T, C), (B, T, C)]),
        ("gpt_proj_residual2", p(Residual2, C, C), [(B, T, C), (B, T, C), (B, T, C)]),
        ("gpt_proj_vec_affine", p(VecAffine, C, C), rows),
        # The whole GPT block (B, T, C) = (128, 512, 768), 8 heads: fc+GELU, proj+residual and
        # out+residual are its fused patterns.
        ("gpt_block_gelu", p(gpt_block, False), rows3),
        ("gpt_block_gelu_written", p(gpt_block, True), rows3),
    ] + attention_suite()
