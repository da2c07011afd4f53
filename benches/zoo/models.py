"""The zoo: models as users have them, built from the `transformers` and `torchvision` configs with
random weights (fixed seeds, no downloads), each wrapped to return one tensor, with its example
inputs. Owns the model definitions alone; benches/zoo/run.py measures them on the GPU and
`--ci` here traces them small on the CPU for the discover test (tests/zoo.rs).

    python benches/zoo/models.py --list
    python benches/zoo/models.py --ci OUT_DIR [--models a,b]

`--ci` traces and exports (torch.export.export, strict=False) every model at batch 1 on the CPU (a
user traces or exports on the GPU: see run.py; a CPU trace or export bakes `device="cpu"`
constants, which discover does not mind) and writes OUT_DIR/NAME.pt, OUT_DIR/NAME.pt2 plus
OUT_DIR/manifest.json (name, family, file, layers, inputs, pt2 or pt2_error). The CI models are the same configs and
code paths as the GPU ones with two cuts, so the fixtures stay small and quick to make on two cores:
depth (CI_LAYERS layers or blocks per stage) and, where an embedding would dominate the file, the
vocabulary (CI_VOCAB, a multiple of 64 like the real ones). GPT-2 keeps its odd 50257: its lm_head
is 768x50257 in the plan, as users have it. Sequences are CI_SEQ tokens.
Each file holds a weight once: the blocks after the first in a list of blocks share its parameters
(share_repeated_blocks), which leaves the graph and every shape as they were.
"""
import argparse
import json
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

SEED = 0
CI_LAYERS = 2
CI_VOCAB = 1024
CI_SEQ = 64
CI_BATCH = 1


class CausalLM(torch.nn.Module):
    """A Hugging Face decoder as generation's first step calls it: logits of every position."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False, return_dict=False)[0]


class Encoder(torch.nn.Module):
    """A Hugging Face encoder with its padding mask passed in: the last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]


class HFImage(torch.nn.Module):
    """A Hugging Face vision model on pixel values: its last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values, return_dict=False)[0]


@dataclass(frozen=True)
class Model:
    """One zoo model. `build(ci)` returns the wrapper in eval mode (random weights: seed first);
    `batch` and `seq` are the GPU run's sizes (seq None for images)."""

    name: str
    family: str
    what: str
    build: Callable[[bool], torch.nn.Module]
    batch: int
    seq: int | None
    vocab: int | None = None
    ci_vocab: int | None = None
    # Encoder: the second input is a key-padding mask of ones and zeros.
    padding_mask: bool = False
    ci_layers: int = CI_LAYERS
    notes: list = field(default_factory=list)
    # The longest sequence the model takes (absolute position embeddings), None for no limit.
    max_seq: int | None = None

    def sizes(self, ci):
        return (CI_BATCH, CI_SEQ) if ci else (self.batch, self.seq)

    def inputs(self, ci, device="cpu", seed=SEED):
        """The forward's inputs: token ids (and a padding mask) or fp32 images, from `seed`."""
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        batch, seq = self.sizes(ci)
        if self.seq is None:
            return (torch.randn(batch, 3, 224, 224, generator=gen, device=device),)
        vocab = self.ci_vocab if ci and self.ci_vocab else self.vocab
        ids = torch.randint(0, vocab, (batch, seq), generator=gen, device=device)
        if not self.padding_mask:
            return (ids,)
        return padding(ids, seq)


def padding(ids, seq):
    """Sequence b keeps seq - ((b + 1) % 4) * seq / 8 tokens (7/8, 6/8, 5/8, all, ...; a batch of
    one is padded too); the rest are pad tokens (id 0) that the mask hides."""
    batch = ids.shape[0]
    lengths = torch.tensor([seq - ((b + 1) % 4) * (seq // 8) for b in range(batch)], device=ids.device)
    mask = (torch.arange(seq, device=ids.device)[None, :] < lengths[:, None]).to(torch.int64)
    return (ids * mask, mask)


def layers(ci, full):
    return CI_LAYERS if ci else full


def gpt2(ci):
    from transformers import GPT2Config, GPT2LMHeadModel

    # GPT2Config() is GPT-2 small: 12 layers, 768 wide, Conv1D projections, learned positions,
    # the tanh GELU written out, vocabulary 50257 tied to the lm_head (kept odd under --ci).
    return CausalLM(GPT2LMHeadModel(GPT2Config(n_layer=layers(ci, 12))))


def llama(ci, **config):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=4,
        intermediate_size=5632,
        num_hidden_layers=layers(ci, 4),
        vocab_size=CI_VOCAB if ci else 32000,
        **config,
    )
    return CausalLM(LlamaForCausalLM(config))


def llama_eager(ci):
    # The Llama-style model above as traced with attn_implementation="eager" (as users trace where
    # they avoid SDPA): q·kᵀ times the scale, the causal mask added, the softmax in fp32 cast back
    # to the model's dtype, then ·v, with the K/V heads repeated by repeat_kv.
    return llama(ci, attn_implementation="eager")


def qwen2(ci):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    # Qwen2-0.5B's dims (14 heads of 64, 2 KV heads, q/k/v with bias, tied 151936 vocabulary),
    # 4 of its 24 layers.
    config = Qwen2Config(
        hidden_size=896,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        num_hidden_layers=layers(ci, 4),
        vocab_size=CI_VOCAB if ci else 151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    return CausalLM(Qwen2ForCausalLM(config))


def pythia(ci):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    # Pythia-160m: rotary over a quarter of each head, attention and MLP in parallel off one
    # residual, fused qkv with bias, erf GELU, untied 50304 vocabulary.
    config = GPTNeoXConfig(
        hidden_size=768,
        num_attention_heads=12,
        num_hidden_layers=layers(ci, 12),
        intermediate_size=3072,
        vocab_size=CI_VOCAB if ci else 50304,
        use_parallel_residual=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    return CausalLM(GPTNeoXForCausalLM(config))


def phi3(ci):
    from transformers import Phi3Config, Phi3ForCausalLM

    # Phi-3's layout at a smaller width: fused qkv_proj and gate_up_proj (one linear over the
    # stacked gate and up weights, chunked), heads of 96, RMSNorm, rotary, no biases, untied
    # 32064 vocabulary; hidden 1536 (Phi-3-mini's is 3072), 4 layers.
    config = Phi3Config(
        hidden_size=1536,
        num_attention_heads=16,
        num_key_value_heads=16,
        intermediate_size=4096,
        num_hidden_layers=layers(ci, 4),
        vocab_size=CI_VOCAB if ci else 32064,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    return CausalLM(Phi3ForCausalLM(config))


def gptj(ci):
    from transformers import GPTJConfig, GPTJForCausalLM

    # GPT-J's layout at a smaller width: eager attention (q and k cast to fp32, the causal mask
    # added to the scores, no SDPA), rotary on the first quarter of each head in pairs
    # (rotate_every_two), attention and MLP in parallel off one LayerNorm, tanh GELU, untied
    # vocabulary 50400; hidden 1024 (GPT-J-6B's is 4096), 16 heads of 64, 4 layers.
    config = GPTJConfig(
        n_embd=1024,
        n_head=16,
        n_layer=layers(ci, 4),
        rotary_dim=16,
        vocab_size=CI_VOCAB if ci else 50400,
    )
    return CausalLM(GPTJForCausalLM(config))


def falcon(ci):
    from transformers import FalconConfig, FalconForCausalLM

    # Falcon-7B's layout at a smaller width (a held-out family: added after fact was built, its
    # first figures measured before any change for it but one, multi-query heads by
    # broadcasting): one fused qkv linear with a single K/V head that SDPA broadcasts over the
    # query heads, rotary on whole heads, attention and MLP in parallel off one LayerNorm, plain
    # GELU, no biases, untied vocabulary 65024; hidden 2048 (Falcon-7B's is 4544), 32 heads of 64.
    config = FalconConfig(hidden_size=2048, num_attention_heads=32, num_hidden_layers=layers(ci, 4), vocab_size=CI_VOCAB if ci else 65024)
    return CausalLM(FalconForCausalLM(config))


def qwen3(ci):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    # Qwen3-0.6B's dims (a held-out family, measured before any change for it): 16 heads of 128
    # over a hidden 1024 (q projects up), 8 K/V heads, RMSNorm on each head of q and k before
    # rotary, SiLU-gated MLP 3072, tied 151936 vocabulary; 4 of its 28 layers.
    config = Qwen3Config(
        hidden_size=1024,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        num_hidden_layers=layers(ci, 4),
        vocab_size=CI_VOCAB if ci else 151936,
        tie_word_embeddings=True,
    )
    return CausalLM(Qwen3ForCausalLM(config))


def gemma(ci):
    from transformers import GemmaConfig, GemmaForCausalLM

    # Gemma-2B's dims (a held-out family, measured before any change for it): 8 heads of 256,
    # one K/V head repeated by repeat_kv, tanh-GELU-gated MLP 16384, RMSNorm scaling by (1 + w)
    # in fp32, embeddings scaled by sqrt(hidden), tied 256000 vocabulary; 4 of its 18 layers.
    config = GemmaConfig(
        hidden_size=2048,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=256,
        intermediate_size=16384,
        num_hidden_layers=layers(ci, 4),
        vocab_size=CI_VOCAB if ci else 256000,
    )
    return CausalLM(GemmaForCausalLM(config))


def cohere(ci):
    from transformers import CohereConfig, CohereForCausalLM

    # Command-R's layout at a smaller width (a held-out family): a parallel block (attention and
    # the SiLU-gated MLP read one norm, both added to the residual), its LayerNorm written out
    # without a bias (fp32 statistics, the weight in fp32), the pairs rotary, 16 heads of 128 over
    # 4 K/V heads, logits scaled by logit_scale, tied 256000 vocabulary; 4 layers.
    config = CohereConfig(
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=4,
        intermediate_size=5632,
        num_hidden_layers=layers(ci, 4),
        vocab_size=CI_VOCAB if ci else 256000,
    )
    return CausalLM(CohereForCausalLM(config))


def gpt_neo(ci):
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    # GPT-Neo-125m (a held-out family): eager attention with q and k cast to fp32, unscaled,
    # `where(causal buffer, scores, finfo.min)` and then the computed mask added; global and
    # local (a 256-key window) layers in turn, the local ones causal up to 256 tokens and general
    # past them; learned positions, the tanh GELU written out, tied 50257 vocabulary; 12 layers.
    n = layers(ci, 12)
    config = GPTNeoConfig(
        hidden_size=768,
        num_layers=n,
        num_heads=12,
        attention_types=[[["global", "local"], n // 2]],
        vocab_size=CI_VOCAB if ci else 50257,
    )
    return CausalLM(GPTNeoForCausalLM(config))


def codegen(ci):
    from transformers import CodeGenConfig, CodeGenForCausalLM

    # CodeGen-350M's dims (a held-out family): one fused qkv projection split by a reshape, the
    # pairs rotary on the first 32 dims of each head, q and k cast to fp32, the mask added and
    # then the sum divided by sqrt(head dim) (the scale after the mask), a parallel block (the
    # attention and the MLP read one LayerNorm, both added to the residual), the tanh GELU
    # written out; 4 layers.
    config = CodeGenConfig(
        n_embd=1024,
        n_head=16,
        n_layer=layers(ci, 4),
        rotary_dim=32,
        n_positions=2048,
        vocab_size=CI_VOCAB if ci else 51200,
    )
    return CausalLM(CodeGenForCausalLM(config))


def opt(ci):
    from transformers import OPTConfig, OPTForCausalLM

    # OPTConfig() is OPT-125m: pre-LayerNorm, ReLU MLP, biases everywhere, learned positions with
    # OPT's offset of 2, vocabulary 50272 tied.
    config = OPTConfig(num_hidden_layers=layers(ci, 12), **({"vocab_size": CI_VOCAB} if ci else {}))
    return CausalLM(OPTForCausalLM(config))


def bert(ci):
    from transformers import BertConfig, BertModel

    # BertConfig() is BERT-base; no pooler (the last hidden state is the output).
    config = BertConfig(num_hidden_layers=layers(ci, 12), **({"vocab_size": CI_VOCAB} if ci else {}))
    return Encoder(BertModel(config, add_pooling_layer=False))


def t5_encoder(ci):
    from transformers import T5Config, T5EncoderModel

    # t5-base's dims: d_model 768, 12 heads of 64, ReLU MLP 3072, T5's RMSNorm, and the relative
    # position bias (32 buckets) the first layer computes and every layer adds to its scores,
    # with the padding mask summed into it (SDPA's float attn_mask).
    config = T5Config(
        d_model=768,
        d_ff=3072,
        num_heads=12,
        num_layers=layers(ci, 12),
        **({"vocab_size": CI_VOCAB} if ci else {}),
    )
    return Encoder(T5EncoderModel(config))


def mpnet(ci):
    from transformers import MPNetConfig, MPNetModel

    # MPNet-base (a held-out family; all-mpnet-base-v2's encoder): BERT-base's dims, no pooler,
    # each layer's eager attention adding the relative position bias (computed once, from the
    # positions alone) and then the padding mask to its scores.
    # 514 positions as MPNet-base has (MPNetConfig says 512): positions start after the pad id, 1,
    # so 512 tokens reach position 513.
    config = MPNetConfig(num_hidden_layers=layers(ci, 12), max_position_embeddings=514,
                         **({"vocab_size": CI_VOCAB} if ci else {}))
    return Encoder(MPNetModel(config, add_pooling_layer=False))


def mpt(ci):
    from transformers import MptConfig, MptForCausalLM

    # MPT-1B's layout (a held-out family): hidden 2048, 16 heads of 128, LayerNorm without bias,
    # a GELU MLP of 4x, and ALiBi in place of positions: a [H,1,Tk] bias, fp32 as MPT builds it,
    # added before the causal masked_fill of finfo.min.
    # Under --ci, hidden 1024 (heads of 64) keeps the file small.
    config = MptConfig(
        d_model=1024 if ci else 2048, n_heads=16, n_layers=layers(ci, 4), max_seq_len=2048, **({"vocab_size": CI_VOCAB} if ci else {})
    )
    return CausalLM(MptForCausalLM(config))


def convnextv2(ci):
    from transformers import ConvNextV2Config, ConvNextV2Model

    # ConvNeXt V2-tiny (a held-out family, Hugging Face's): the ConvNeXt block with Global Response
    # Normalization between its two linears (over the spatial dims, channels last); one block a
    # stage under --ci keeps every stage's downsampling.
    config = ConvNextV2Config(**({"depths": [1, 1, 1, 1]} if ci else {}))
    return HFImage(ConvNextV2Model(config))


def beit(ci):
    from transformers import BeitConfig, BeitModel

    # BEiT-base (a held-out family): 12 heads of 64 over 14x14 patches and a class token, each
    # layer's relative position bias gathered from its table by an index BEiT rebuilds every
    # forward in place, added to SDPA's mask; layer scale on both residuals.
    return HFImage(BeitModel(BeitConfig(num_hidden_layers=layers(ci, 12), use_relative_position_bias=True)))


def swin_t(ci):
    import torchvision
    from torchvision.models.swin_transformer import SwinTransformer

    if not ci:
        return torchvision.models.swin_t()
    # swin_t() is this constructor with depths [2, 2, 6, 2]; two blocks a stage keep both the
    # plain window block and the shifted one (its mask added through a 5-d view of the scores).
    return SwinTransformer(
        patch_size=[4, 4], embed_dim=96, depths=[2, 2, 2, 2], num_heads=[3, 6, 12, 24], window_size=[7, 7], stochastic_depth_prob=0.2
    )


def swin_v2_t(ci):
    import torchvision
    from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformer, SwinTransformerBlockV2

    if not ci:
        return torchvision.models.swin_v2_t()
    # swin_v2_t() is this constructor with depths [2, 2, 6, 2]: cosine attention (q and k
    # normalized, a logit scale per head), a position bias from a small MLP over log-spaced
    # coordinates, post-norm blocks; two blocks a stage keep the plain and the shifted one.
    return SwinTransformer(
        patch_size=[4, 4],
        embed_dim=96,
        depths=[2, 2, 2, 2],
        num_heads=[3, 6, 12, 24],
        window_size=[8, 8],
        stochastic_depth_prob=0.2,
        block=SwinTransformerBlockV2,
        downsample_layer=PatchMergingV2,
    )


def vit_b_16(ci):
    import torchvision
    from torchvision.models.vision_transformer import VisionTransformer

    if not ci:
        return torchvision.models.vit_b_16()
    # vit_b_16() is this constructor with 12 layers (torchvision's _vision_transformer).
    return VisionTransformer(image_size=224, patch_size=16, num_layers=CI_LAYERS, num_heads=12, hidden_dim=768, mlp_dim=3072)


def resnet50(ci):
    import torchvision
    from torchvision.models.resnet import Bottleneck, ResNet

    if not ci:
        return torchvision.models.resnet50()
    # resnet50() is ResNet(Bottleneck, [3, 4, 6, 3]); one bottleneck per stage keeps every
    # stage's downsampling block.
    return ResNet(Bottleneck, [1, 1, 1, 1])


def mobilenet_v3_large(ci):
    import torchvision

    # Depthwise convolutions, squeeze-and-excitation and hardswish; 5.5M parameters, small enough
    # to trace whole under --ci.
    return torchvision.models.mobilenet_v3_large()


def mobilenet_v2(ci):
    import torchvision

    # Inverted residuals with ReLU6 (nn.ReLU6(inplace=True): hardtanh_(x, 0, 6)) after the
    # expansion and depthwise convolutions; 3.5M parameters, small enough to trace whole.
    return torchvision.models.mobilenet_v2()


def convnext_tiny(ci):
    import torchvision
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    if not ci:
        return torchvision.models.convnext_tiny()
    # convnext_tiny() is these four stages with 3, 3, 9 and 3 blocks (depthwise 7x7 convolution,
    # LayerNorm over channels through a permute, Linear-GELU-Linear, layer scale); one block each.
    widths = [(96, 192), (192, 384), (384, 768), (768, None)]
    return ConvNeXt([CNBlockConfig(i, o, 1) for i, o in widths], stochastic_depth_prob=0.1)


MODELS = [
    Model("gpt2", "gpt2", "GPT2LMHeadModel(GPT2Config()): GPT-2 small, 12 layers", gpt2, 8, 1024, vocab=50257, ci_vocab=50257),
    Model("llama", "llama", "LlamaForCausalLM: hidden 2048, 16 heads, 4 KV heads, MLP 5632, 4 layers", llama, 4, 1024, vocab=32000, ci_vocab=CI_VOCAB),
    Model("llama_eager", "llama", "LlamaForCausalLM as llama, attn_implementation=\"eager\": explicit products, fp32 softmax", llama_eager, 4, 1024, vocab=32000, ci_vocab=CI_VOCAB),
    Model("qwen2", "qwen2", "Qwen2ForCausalLM: Qwen2-0.5B's dims, 4 layers", qwen2, 4, 1024, vocab=151936, ci_vocab=CI_VOCAB),
    Model("pythia", "gpt_neox", "GPTNeoXForCausalLM: Pythia-160m, 12 layers", pythia, 8, 512, vocab=50304, ci_vocab=CI_VOCAB),
    Model("phi3", "phi3", "Phi3ForCausalLM: hidden 1536, 16 heads of 96, fused qkv and gate_up, 4 layers", phi3, 4, 1024, vocab=32064, ci_vocab=CI_VOCAB),
    Model("gptj", "gptj", "GPTJForCausalLM: hidden 1024, 16 heads of 64, eager attention, pairs rotary, 4 layers", gptj, 8, 512, vocab=50400, ci_vocab=CI_VOCAB),
    Model("falcon", "falcon", "FalconForCausalLM: hidden 2048, 32 heads of 64, one K/V head, parallel attention, 4 layers (held out)", falcon, 4, 1024, vocab=65024, ci_vocab=CI_VOCAB),
    Model("qwen3", "qwen3", "Qwen3ForCausalLM: Qwen3-0.6B's dims, q and k RMSNorms, 4 layers (held out)", qwen3, 4, 1024, vocab=151936, ci_vocab=CI_VOCAB),
    Model("gemma", "gemma", "GemmaForCausalLM: Gemma-2B's dims, heads of 256, one K/V head, GeGLU, 4 layers (held out)", gemma, 2, 1024, vocab=256000, ci_vocab=CI_VOCAB),
    Model("cohere", "cohere", "CohereForCausalLM: Command-R's layout at hidden 2048, written-out LayerNorm, parallel block, pairs rotary, 4 layers (held out)", cohere, 2, 1024, vocab=256000, ci_vocab=CI_VOCAB),
    Model("gpt_neo", "gpt_neo", "GPTNeoForCausalLM: GPT-Neo-125m, global and local attention in turn, 12 layers (held out)", gpt_neo, 8, 512, vocab=50257, ci_vocab=CI_VOCAB),
    Model("codegen", "codegen", "CodeGenForCausalLM: CodeGen-350M's dims, the scale after the added mask, parallel block, 4 layers (held out)", codegen, 4, 1024, vocab=51200, ci_vocab=CI_VOCAB),
    Model("opt", "opt", "OPTForCausalLM(OPTConfig()): OPT-125m, 12 layers", opt, 8, 512, vocab=50272, ci_vocab=CI_VOCAB),
    Model("bert", "bert", "BertModel(BertConfig()): BERT-base, padding mask passed in", bert, 32, 512, vocab=30522, ci_vocab=CI_VOCAB, padding_mask=True, max_seq=512),
    Model("t5_encoder", "t5", "T5EncoderModel: t5-base's dims, relative position bias in SDPA's float mask, padding mask passed in, 12 layers (held out)", t5_encoder, 16, 512, vocab=32128, ci_vocab=CI_VOCAB, padding_mask=True),
    Model("vit_b_16", "vit", "torchvision vit_b_16 (nn.MultiheadAttention)", vit_b_16, 32, None),
    Model("resnet50", "resnet", "torchvision resnet50", resnet50, 32, None, ci_layers=1),
    Model("mobilenet_v3_large", "mobilenet", "torchvision mobilenet_v3_large (depthwise, SE, hardswish)", mobilenet_v3_large, 32, None, ci_layers=15),
    Model("mobilenet_v2", "mobilenet_v2", "torchvision mobilenet_v2 (depthwise, ReLU6) (held out)", mobilenet_v2, 32, None, ci_layers=17),
    Model("convnext_tiny", "convnext", "torchvision convnext_tiny (depthwise 7x7, LayerNorm, Linear MLP)", convnext_tiny, 32, None, ci_layers=1),
    Model("mpnet", "mpnet", "MPNetModel: MPNet-base, a relative position bias and the padding mask added in turn in eager attention, padding mask passed in (held out)", mpnet, 32, 512, vocab=30527, ci_vocab=CI_VOCAB, padding_mask=True, max_seq=512),
    Model("mpt", "mpt", "MptForCausalLM: hidden 2048, 16 heads of 128, ALiBi before a causal fill, 4 layers (held out)", mpt, 4, 1024, vocab=50368, ci_vocab=CI_VOCAB),
    Model("convnextv2", "convnextv2", "ConvNextV2Model: ConvNeXt V2-tiny, Global Response Normalization in every block (held out)", convnextv2, 32, None),
    Model("beit", "beit", "BeitModel: BEiT-base, a relative position bias per layer through SDPA's mask (held out)", beit, 32, None),
    Model("swin_v2_t", "swin_v2", "torchvision swin_v2_t (cosine attention: a logit scale per head, a position bias from an MLP; shifted windows) (held out)", swin_v2_t, 32, None, ci_layers=2),
    Model("swin_t", "swin", "torchvision swin_t (window attention with a relative position bias; shifted windows) (held out)", swin_t, 32, None, ci_layers=2),
]


def starcoder2(ci):
    from transformers import Starcoder2Config, Starcoder2ForCausalLM

    # StarCoder2-3B's heads and MLP at 4 layers: hidden 3072, 24 heads of 128 over 2 KV heads,
    # LayerNorm with bias, a GELU-tanh MLP of 12288 with biases, rotary.
    config = Starcoder2Config(hidden_size=3072, num_attention_heads=24, num_key_value_heads=2, intermediate_size=12288,
                              num_hidden_layers=layers(ci, 4), vocab_size=CI_VOCAB if ci else 49152)
    return CausalLM(Starcoder2ForCausalLM(config))


def stablelm(ci):
    from transformers import StableLmConfig, StableLmForCausalLM

    # StableLM-2-1.6B's layout: hidden 2048, 32 heads of 64, LayerNorm, a quarter of each head
    # rotary, a SiLU-gated MLP of 5632, 4 layers.
    config = StableLmConfig(hidden_size=2048, num_attention_heads=32, num_key_value_heads=32, intermediate_size=5632,
                            partial_rotary_factor=0.25, num_hidden_layers=layers(ci, 4),
                            vocab_size=CI_VOCAB if ci else 100352)
    return CausalLM(StableLmForCausalLM(config))


def distilbert(ci):
    from transformers import DistilBertConfig, DistilBertModel

    # DistilBertConfig() is DistilBERT-base: 6 layers, 768 wide, learned positions.
    config = DistilBertConfig(n_layers=layers(ci, 6), **({"vocab_size": CI_VOCAB} if ci else {}))
    return Encoder(DistilBertModel(config))


def efficientnet_b0(ci):
    import torchvision

    # Depthwise convolutions, squeeze-and-excitation gates and SiLU.
    return torchvision.models.efficientnet_b0()


def regnet_y_1_6gf(ci):
    import torchvision

    # Grouped 3x3 convolutions (groups of 24 channels) with squeeze-and-excitation.
    return torchvision.models.regnet_y_1_6gf()


# Families the zoo does not hold and fact was not tuned on, at the sizes users run: measured by
# name on the GPU machine (compose_time.py, run.py, serve.py) as models built outside the
# repository are, and left out of the zoo's own runs and tests.
HELD_OUT = [
    Model("starcoder2", "starcoder2", "Starcoder2ForCausalLM: StarCoder2-3B's layout at 4 layers, 24 heads over 2 KV heads", starcoder2, 4, 1024, vocab=49152, ci_vocab=CI_VOCAB),
    Model("stablelm", "stablelm", "StableLmForCausalLM: hidden 2048, 32 heads of 64, partial rotary, LayerNorm, 4 layers", stablelm, 4, 1024, vocab=100352, ci_vocab=CI_VOCAB),
    Model("distilbert", "distilbert", "DistilBertModel(DistilBertConfig()): DistilBERT-base, padding mask passed in", distilbert, 32, 512, vocab=30522, ci_vocab=CI_VOCAB, padding_mask=True, max_seq=512),
    Model("efficientnet_b0", "efficientnet", "torchvision efficientnet_b0 (depthwise, SE, SiLU)", efficientnet_b0, 32, None),
    Model("regnet_y_1_6gf", "regnet", "torchvision regnet_y_1_6gf (grouped convolutions, SE)", regnet_y_1_6gf, 32, None),
]


def by_name():
    """The zoo's models and the held-out ones, by name."""
    return {m.name: m for m in MODELS + HELD_OUT}


def select(names):
    """The models named in a comma-separated list (the zoo's when None: held-out ones only by
    name), in the zoo's order."""
    if not names:
        return list(MODELS)
    wanted = names.split(",")
    known = by_name()
    if bad := [n for n in wanted if n not in known]:
        raise SystemExit(f"unknown zoo models {bad}: the zoo has {', '.join(known)}")
    return [m for m in MODELS + HELD_OUT if m.name in wanted]


def build(model, ci, device="cpu", dtype=torch.float32):
    """The seeded model in eval mode on `device` in `dtype` (floating parameters and buffers)."""
    torch.manual_seed(SEED)
    module = model.build(ci).eval()
    # Some libraries zero-initialise a layer (torchvision's ViT its classification head), which
    # makes the output zero: nothing to verify against fp64 (the relative error is 0/0). Such
    # weight matrices get the small random values the other layers have.
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.02)
    if ci:
        share_repeated_blocks(module)
    return module.to(device=device, dtype=dtype)


def share_repeated_blocks(module):
    """Under --ci, the blocks after the first in each list of blocks (a ModuleList or Sequential
    of one class) take the first one's parameters wherever name and shape agree. The graph and
    every shape stay as they were; the fixture files hold each weight once, which roughly halves
    them (two layers a decoder), and CI's disk is not always roomy."""
    lists = [m for m in module.modules() if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential))]
    for blocks in lists:
        children = list(blocks.children())
        if len(children) < 2 or len({type(c) for c in children}) != 1:
            continue
        first = dict(children[0].named_parameters())
        for child in children[1:]:
            for name, p in list(child.named_parameters()):
                q = first.get(name)
                if q is None or q is p or q.shape != p.shape or q.dtype != p.dtype:
                    continue
                owner, _, leaf = name.rpartition(".")
                setattr(child.get_submodule(owner) if owner else child, leaf, q)


def describe_inputs(inputs):
    return [{"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch.")} for x in inputs]


def dynamic_shapes(model, inputs):
    """Batch and sequence dims (batch alone for images) left to export: Dim.AUTO keeps a dim
    dynamic where the model allows and specializes it where it does not (a batch of 1 always)."""
    from torch.export import Dim

    dims = {0: Dim.AUTO} if model.seq is None else {0: Dim.AUTO, 1: Dim.AUTO}
    return tuple(dims for _ in inputs)


def export(model, module, inputs, path):
    """torch.export.export of the wrapper as a user calls it (strict=False), saved to `path`:
    None, or torch's error (its first line) where the model does not export."""
    try:
        with torch.no_grad():
            program = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes(model, inputs), strict=False)
        torch.export.save(program, path)
        return None
    except Exception as e:  # noqa: BLE001 - the zoo records torch's reason and goes on
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def trace_ci(out_dir, models):
    """Traces and exports each model at batch 1 on the CPU into out_dir (NAME.pt, NAME.pt2), and
    writes manifest.json (a model that does not export has `pt2_error`, torch's reason)."""
    os.makedirs(out_dir, exist_ok=True)
    manifest = []
    for m in models:
        module = build(m, ci=True)
        inputs = m.inputs(ci=True)
        with torch.no_grad():
            traced = torch.jit.trace(module, inputs, strict=False, check_trace=False)
        path = os.path.join(out_dir, f"{m.name}.pt")
        traced.save(path)
        entry = {"name": m.name, "family": m.family, "file": f"{m.name}.pt", "layers": m.ci_layers, "inputs": describe_inputs(inputs)}
        error = export(m, module, inputs, os.path.join(out_dir, f"{m.name}.pt2"))
        if error is None:
            entry["pt2"] = f"{m.name}.pt2"
        else:
            entry["pt2_error"] = error
        manifest.append(entry)
        print(f"traced {m.name} -> {path}; " + (f"exported -> {m.name}.pt2" if error is None else f"export failed: {error}"), flush=True)
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print the zoo")
    ap.add_argument("--ci", metavar="OUT_DIR", help="trace and export every model at batch 1 on the CPU into OUT_DIR")
    ap.add_argument("--models", help="comma-separated model names (default: all)")
    args = ap.parse_args()
    if args.list:
        for m in MODELS:
            size = f"B {m.batch}, T {m.seq}" if m.seq else f"B {m.batch}, 3x224x224"
            print(f"{m.name:20} {m.family:10} {size:16} {m.what}")
    elif args.ci:
        torch.set_num_threads(min(2, os.cpu_count() or 1))
        # Tracing's warnings about Python values taken as constants (sizes, masks' shapes) are
        # what tracing a user's model prints too; the CI log does without them.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        import logging

        import transformers

        transformers.logging.set_verbosity_error()
        # Export's notes that a batch of 1 specializes its dim (Dim.AUTO keeps the others dynamic).
        logging.getLogger("torch._export").setLevel(logging.ERROR)
        trace_ci(args.ci, select(args.models))
    else:
        ap.print_help()
        sys.exit(2)


if __name__ == "__main__":
    main()
