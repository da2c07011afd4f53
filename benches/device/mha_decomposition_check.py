"""On the GPU: torch's aten::_native_multi_head_attention against the ops fact's bridge rewrites it
into (src/torch/bridge.cc, decompose_native_mha: linear in-projection, SDPA with
logical_not(mask), linear out-projection), for the masks nn.MultiheadAttention passes: none, a
key-padding mask (bool, and the float one of -inf it makes, mask_type 1), an attention mask
(mask_type 2), and a batch item whose keys are all masked (where torch's CPU kernel gives NaN and
SDPA gives 0: this says what the CUDA kernel gives). The CPU side is tested by
tests/native_mha.rs on the rewritten archives themselves.

    python3 benches/device/mha_decomposition_check.py [--dtype bf16|f32]

Prints one line per case: max |native - decomposed|, and whether either has NaNs.
"""
import argparse

import torch
import torch.nn.functional as F

B, T, E, H = 4, 197, 768, 12


def decomposed(q, k, v, w, b, wo, bo, mask, mask_type):
    if q is k and k is v:
        qs = F.linear(q, w, b).chunk(3, -1)
    else:
        qs = [F.linear(x, w[i * E:(i + 1) * E], b[i * E:(i + 1) * E]) for i, x in enumerate((q, k, v))]
    heads = [x.view(q.size(0), -1, H, E // H).transpose(1, 2) for x in qs]
    attend = None
    if mask is not None:
        attend = torch.logical_not(mask)
        if mask_type == 1:
            attend = attend.unsqueeze(1).unsqueeze(1)
    y = F.scaled_dot_product_attention(*heads, attend, 0.0, False)
    return F.linear(y.transpose(1, 2).reshape(q.size(0), -1, E), wo, bo)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    dev = "cuda"
    w = torch.randn(3 * E, E, device=dev, dtype=dtype) * E**-0.5
    b = torch.randn(3 * E, device=dev, dtype=dtype) * 0.1
    wo = torch.randn(E, E, device=dev, dtype=dtype) * E**-0.5
    bo = torch.randn(E, device=dev, dtype=dtype) * 0.1
    x = torch.randn(B, T, E, device=dev, dtype=dtype)
    kpm = torch.zeros(B, T, dtype=torch.bool, device=dev)
    kpm[1, T // 2:] = True
    full = kpm.clone()
    full[2, :] = True
    causal = torch.ones(T, T, dtype=torch.bool, device=dev).triu(1).view(1, 1, T, T).expand(B, H, T, T)
    cases = {
        "no mask": (None, None),
        "key padding (bool)": (kpm, 1),
        "key padding (float -inf)": (torch.zeros(B, T, device=dev, dtype=dtype).masked_fill(kpm, float("-inf")), 1),
        "attention mask [B,H,T,T]": (causal, 2),
        "a batch item fully masked": (full, 1),
    }
    with torch.no_grad():
        for name, (mask, mask_type) in cases.items():
            native = torch._native_multi_head_attention(x, x, x, E, H, w, b, wo, bo, mask, False, True, mask_type)[0]
            ours = decomposed(x, x, x, w, b, wo, bo, mask, mask_type)
            finite = torch.isfinite(native) & torch.isfinite(ours)
            diff = (native.float() - ours.float())[finite].abs().max().item()
            print(f"{args.dtype} {name:28} max diff {diff:.3e}  native NaN {native.isnan().any().item()}  "
                  f"decomposed NaN {ours.isnan().any().item()}", flush=True)


if __name__ == "__main__":
    main()
