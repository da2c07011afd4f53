"""Attention as Hugging Face models call it, on the GPU: traces small GPT-2, Llama (grouped-query,
repeat_kv) and BERT models (with and without an attention_mask input) in bf16 (`trace OUT`), and,
for one composed model (`run KIND MODEL.pt DIR`), runs the original and the composed module on
masks of every class, printing each case's error against the original and the op counters: which
calls ran fact's attention kernel and which fell back, and why. Used by attention_masks.sh."""
import ctypes, json, sys

import torch
from transformers import (BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM)

B, T = 4, 256


class Wrap(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids, am=None):
        kw = dict(return_dict=False)
        if am is not None:
            kw["attention_mask"] = am
        if hasattr(self.m.config, "use_cache"):
            kw["use_cache"] = False
        return self.m(ids, **kw)[0]


def models():
    yield "gpt2", GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=512, n_head=8, vocab_size=1000)), False
    yield "gpt2_mask", GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=512, n_head=8, vocab_size=1000)), True
    yield "llama", LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=512, num_attention_heads=8,
                                                num_key_value_heads=2, intermediate_size=1024,
                                                vocab_size=1000)), False
    yield "bert", BertModel(BertConfig(num_hidden_layers=2, hidden_size=512, num_attention_heads=8,
                                       intermediate_size=1024, vocab_size=1000)), False
    yield "bert_mask", BertModel(BertConfig(num_hidden_layers=2, hidden_size=512, num_attention_heads=8,
                                            intermediate_size=1024, vocab_size=1000)), True


def trace(out):
    torch.manual_seed(0)
    for name, model, masked in models():
        m = Wrap(model.eval().to("cuda", torch.bfloat16))
        ids = torch.randint(0, 1000, (B, T), device="cuda")
        inputs = (ids, torch.ones(B, T, dtype=torch.long, device="cuda")) if masked else (ids,)
        with torch.no_grad():
            torch.jit.trace(m, inputs, strict=False).save(f"{out}/{name}.pt")
        print("traced", name)


def run(model, composed_dir):
    lib = f"{composed_dir}/libfact_ops.so"
    torch.ops.load_library(lib)
    so = ctypes.CDLL(lib)
    so.fact_op_stats.restype = ctypes.c_char_p
    orig = torch.jit.load(model, map_location="cuda")
    comp = torch.jit.load(f"{composed_dir}/composed.pt", map_location="cuda")
    masked = "mask" in model
    ids = torch.randint(0, 1000, (B, T), device="cuda")
    cases = {"traced shape": (ids,), "T 128": (ids[:, :128],)}
    if masked:
        right = torch.ones(B, T, dtype=torch.long, device="cuda")
        right[1, 200:] = 0
        right[3, 17:] = 0
        left = torch.ones(B, T, dtype=torch.long, device="cuda")
        left[0, :5] = 0
        cases = {"no padding": (ids, torch.ones_like(ids)), "right padding (padded)": (ids, right),
                 "left padding (general)": (ids, left), "T 128": (ids[:, :128], right[:, :128])}
    for case, inputs in cases.items():
        so.fact_op_stats_reset()
        with torch.no_grad():
            want, got = orig(*inputs), comp(*inputs)
        if masked:  # padded queries' outputs are garbage in both; compare the real ones
            keep = inputs[1].bool()[..., None]
            want, got = want * keep, got * keep
        err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
        stats = json.loads(so.fact_op_stats().decode())
        attn = {k: v for k, v in stats.items() if "fmha" in k}
        print(f"{model} | {case}: max rel err {err:.2e} | attention calls {attn}")


if __name__ == "__main__":
    trace(sys.argv[2]) if sys.argv[1] == "trace" else run(sys.argv[2], sys.argv[3])
