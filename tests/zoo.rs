//! The zoo in CI: every model of benches/zoo traced at batch 1 on the CPU (`models.py --ci`) and
//! `fact discover`ed; the patterns each must show are one table, EXPECT, that grows as rules
//! land. Also the MultiheadAttention fixture (discover must see past the op) and `fact plot-e2e
//! --over` on hand-written records. The zoo's GPU runs (benches/zoo/run.py) are not tested here.

use crate::common::{fact, fixture, zoo_fixtures};
use fact::plan::Plan;
use std::collections::BTreeMap;
use std::path::Path;

/// What discover must find in one zoo model. Rules are named by their id without an epilogue's
/// digest (`gemm_rcr_ep_silu_mul`, not `gemm_rcr_ep_silu_mul_a73cef95`); the counts are exact, per
/// layer (times the fixture's layers, from manifest.json) plus once per model, so a rule that stops
/// matching, or starts matching elsewhere, changes them. `wanted` is what an open issue asks
/// discover to find there that no rule finds yet: printed with the count of that kind found today,
/// not asserted. When a rule lands, its patterns move from `wanted` into the counts. `kv_heads`:
/// the grouped-query models' attention reads K/V with that many heads, in place.
struct Expect {
    model: &'static str,
    per_layer: &'static [(&'static str, usize)],
    once: &'static [(&'static str, usize)],
    /// (pattern kind, what an open issue wants found).
    wanted: &'static [(&'static str, &'static str)],
    kv_heads: Option<i64>,
}

const EXPECT: &[Expect] = &[
    Expect {
        model: "gpt2",
        // Conv1D is addmm over a flattened input with W row-major, read through its views: c_attn
        // alone; c_fc with the written-out tanh GELU; both projections with the residual add
        // (through view and eval dropout); the causal SDPA on the mask the graph computes;
        // layernorms before attention and MLP. The embeddings' sum stays torch's, and the first
        // ln_1 plain: the sum is read again through eval dropout (rules::residual), and GPT2Model
        // sizes it (`output_shape`) before ln_1, where the op's call would stand.
        per_layer: &[
            ("gemm_rrr_bias", 1),
            ("gemm_rrr_bias_ep_mul_pow_mul_add_mul_tanh_add_mul", 1),
            ("gemm_rrr_bias_ep_add", 2),
            ("sdpa_causal_mask", 1),
            ("layernorm_affine", 2),
        ],
        // ln_f; the lm_head against the tied 50257-row embedding, padded to 50264.
        once: &[("layernorm_affine", 1), ("gemm_rcr_padn", 1)],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "llama",
        // q, k and v; gate and up as one GEMM with silu times up; o and down with the residual;
        // grouped-query SDPA (K/V heads repeated by repeat_kv, read in place) on the computed
        // causal mask; q and k rotated in one kernel; the input and post-attention RMSNorms,
        // written out (traced in fp32: one rounding). Each residual add before a norm is the o or
        // down projection's epilogue, not the norm's (rules::residual says why); the first norm
        // reads the embeddings alone.
        per_layer: &[
            ("gemm_rcr", 3),
            ("glu_silu", 1),
            ("gemm_rcr_ep_add", 2),
            ("sdpa_causal_mask", 1),
            ("rmsnorm_weight", 2),
            ("rotary_halves_qk", 1),
        ],
        // The lm_head and the final norm. The rotary frequencies (inv_freq · positions, K = 1)
        // are no GEMM pattern: an outer product, left to torch (and to the memo).
        once: &[("gemm_rcr", 1), ("rmsnorm_weight", 1)],
        wanted: &[],
        kv_heads: Some(4),
    },
    Expect {
        model: "llama_eager",
        // llama's patterns, its attention written out as Hugging Face's eager attention computes
        // it: q·kᵀ times the scale, the causal mask added, the softmax in fp32 cast back, ·v,
        // on the K/V heads repeat_kv expanded (one pattern, the explicit form's causal rule).
        per_layer: &[
            ("gemm_rcr", 3),
            ("glu_silu", 1),
            ("gemm_rcr_ep_add", 2),
            ("attention_causal_mask", 1),
            ("rmsnorm_weight", 2),
            ("rotary_halves_qk", 1),
        ],
        once: &[("gemm_rcr", 1), ("rmsnorm_weight", 1)],
        wanted: &[],
        kv_heads: Some(4),
    },
    Expect {
        model: "qwen2",
        // q, k, v with bias; gate and up as one GEMM with silu times up; o and down with the
        // residual; q and k rotated in one kernel; two RMSNorms (the adds before them Llama's way).
        per_layer: &[
            ("gemm_rcr_bias", 3),
            ("glu_silu", 1),
            ("gemm_rcr_ep_add", 2),
            ("sdpa_causal_mask", 1),
            ("rmsnorm_weight", 2),
            ("rotary_halves_qk", 1),
        ],
        once: &[("gemm_rcr", 1), ("rmsnorm_weight", 1)],
        wanted: &[],
        kv_heads: Some(2),
    },
    Expect {
        model: "pythia",
        // Two layernorms off one residual; fused qkv and dense; fc with GELU; the MLP's out
        // projection adding the attention output and the residual (parallel residual); partial
        // rotary (the first quarter of each head) on q and k in one kernel.
        per_layer: &[
            ("layernorm_affine", 2),
            ("gemm_rcr_bias", 2),
            ("gemm_rcr_bias_ep_gelu", 1),
            ("gemm_rcr_bias_ep_add_add", 1),
            ("sdpa_causal_mask", 1),
            ("rotary_halves_qk", 1),
        ],
        once: &[("layernorm_affine", 1), ("gemm_rcr", 1)],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "phi3",
        // The fused qkv_proj; the fused gate_up_proj chunked in two, one GLU over its weight's
        // halves; o and down with the residual; the causal SDPA; two RMSNorms; q and k (sliced
        // from qkv, then viewed) rotated in one kernel, each cut to cos's width (the whole head)
        // with the empty rest put back by a cat.
        per_layer: &[
            ("gemm_rcr", 1),
            ("glu_silu", 1),
            ("gemm_rcr_ep_add", 2),
            ("sdpa_causal_mask", 1),
            ("rmsnorm_weight", 2),
            ("rotary_halves_qk", 1),
        ],
        once: &[("gemm_rcr", 1), ("rmsnorm_weight", 1)],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "gptj",
        // q, k and v; eager attention (q and k cast to fp32, the computed causal mask added to
        // the scores, the probabilities cast back); q and k rotated in pairs on the first
        // quarter of each head, in one kernel (each by its own, equal, cos and sin); one
        // LayerNorm; fc_in with the written-out tanh GELU; fc_out with its bias; out_proj adding
        // the MLP's output and the residual (parallel residual).
        per_layer: &[
            ("gemm_rcr", 3),
            ("attention_causal_mask", 1),
            ("rotary_pairs_qk", 1),
            ("layernorm_affine", 1),
            ("gemm_rcr_bias_ep_mul_pow_mul_add_mul_tanh_add_mul", 1),
            ("gemm_rcr_bias", 1),
            ("gemm_rcr_ep_add_add", 1),
        ],
        // ln_f; the lm_head with its bias.
        once: &[("layernorm_affine", 1), ("gemm_rcr_bias", 1)],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "falcon",
        // Held out (added after the rules were written). The fused qkv and dense; the MLP's
        // dense_h_to_4h with GELU; dense_4h_to_h adding the attention output and the residual
        // (parallel attention); q and k rotated in one kernel; the causal SDPA over one K/V head
        // that SDPA broadcasts to every query head (multi-query); one LayerNorm a layer.
        per_layer: &[
            ("gemm_rcr", 2),
            ("gemm_rcr_ep_gelu", 1),
            ("gemm_rcr_ep_add_add", 1),
            ("sdpa_causal_mask", 1),
            ("rotary_halves_qk", 1),
            ("layernorm_affine", 1),
        ],
        once: &[("gemm_rcr", 1), ("layernorm_affine", 1)],
        wanted: &[],
        kv_heads: Some(1),
    },
    Expect {
        model: "qwen3",
        // Held out. q (projecting up: 16 heads of 128 over a hidden 1024), k and v; gate and up
        // as one GEMM; o and down with the residual; the grouped-query SDPA; the two RMSNorms
        // and the RMSNorms of each head of q and k before rotary; q and k rotated in one kernel.
        per_layer: &[
            ("gemm_rcr", 3),
            ("glu_silu", 1),
            ("gemm_rcr_ep_add", 2),
            ("sdpa_causal_mask", 1),
            ("rmsnorm_weight", 4),
            ("rotary_halves_qk", 1),
        ],
        once: &[("gemm_rcr", 1), ("rmsnorm_weight", 1)],
        wanted: &[],
        kv_heads: Some(8),
    },
    Expect {
        model: "gemma",
        // Held out. q, k and v; gate and up as one GEMM with the tanh GELU; o and down with the
        // residual; the SDPA over one K/V head repeated by repeat_kv (read in place); Gemma's
        // RMSNorms (times 1 + w, in fp32); q and k rotated in one kernel.
        per_layer: &[
            ("gemm_rcr", 3),
            ("glu_gelu_tanh", 1),
            ("gemm_rcr_ep_add", 2),
            ("sdpa_causal_mask", 1),
            ("rmsnorm_weight", 2),
            ("rotary_halves_qk", 1),
        ],
        once: &[("gemm_rcr", 1), ("rmsnorm_weight", 1)],
        wanted: &[],
        kv_heads: Some(1),
    },
    Expect {
        model: "cohere",
        // Held out. q, k and v and o; gate and up as one GEMM with SiLU times up; down with the
        // parallel block's two adds (the attention's output and the residual); the written-out
        // LayerNorm (no bias, the weight in fp32) read as the weight-only problem; the pairs
        // rotary on q and k; the SDPA over 4 K/V heads.
        per_layer: &[
            ("gemm_rcr", 4),
            ("glu_silu", 1),
            ("gemm_rcr_ep_add_add", 1),
            ("sdpa_causal_mask", 1),
            ("layernorm_weight", 1),
            ("rotary_pairs_qk", 1),
        ],
        // The final norm, and the lm_head with logit_scale in its epilogue.
        once: &[("layernorm_weight", 1), ("gemm_rcr_ep_mul", 1)],
        wanted: &[],
        kv_heads: Some(4),
    },
    Expect {
        model: "gpt_neo",
        // Held out. q, k and v without bias; out_proj and c_proj with bias and the residual;
        // c_fc with the written-out tanh GELU; two LayerNorms; the eager attention, q and k cast
        // to fp32 (their lengths read, so the casts stay), unscaled, `where(causal buffer,
        // scores, finfo.min)` and the computed causal mask added: both masks classified, the
        // local layer's window (256) past the fixture's 64 tokens, so causal.
        per_layer: &[
            ("gemm_rcr", 3),
            ("gemm_rcr_bias_ep_add", 2),
            ("gemm_rcr_bias_ep_mul_pow_mul_add_mul_tanh_add_mul", 1),
            ("attention_causal_mask", 1),
            ("layernorm_affine", 2),
        ],
        once: &[("gemm_rcr", 1), ("layernorm_affine", 1)],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "codegen",
        // Held out. The fused qkv_proj (no bias); out_proj taking the parallel block's two adds
        // (the MLP's output and the residual); fc_in with the written-out tanh GELU; fc_out with
        // its bias; one LayerNorm a layer; the pairs rotary on q and k; the eager attention, q
        // and k cast to fp32, the causal mask added and the sum divided by √D after it.
        per_layer: &[
            ("gemm_rcr", 1),
            ("gemm_rcr_ep_add_add", 1),
            ("gemm_rcr_bias_ep_mul_pow_mul_add_mul_tanh_add_mul", 1),
            ("gemm_rcr_bias", 1),
            ("attention_causal_mask", 1),
            ("rotary_pairs_qk", 1),
            ("layernorm_affine", 1),
        ],
        // The lm_head (with its bias) and the final LayerNorm.
        once: &[("gemm_rcr_bias", 1), ("layernorm_affine", 1)],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "opt",
        // q with OPT's scaling in its epilogue; k, v; out_proj and fc2 with the residual; fc1
        // with relu.
        per_layer: &[
            ("layernorm_affine", 2),
            ("gemm_rcr_bias_ep_mul", 1),
            ("gemm_rcr_bias", 2),
            ("gemm_rcr_bias_ep_add", 2),
            ("gemm_rcr_bias_ep_relu", 1),
            ("sdpa_causal_mask", 1),
        ],
        // The lm_head. The final LayerNorm is one more layernorm_affine, and the first layer's
        // self_attn_layer_norm one less: it takes the token and position embeddings' sum, which
        // it writes for the first residual (no GEMM reaches that add).
        once: &[("add_layernorm_affine_sum", 1), ("gemm_rcr", 1)],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "bert",
        // q, k, v; both output denses with their residual; the intermediate with GELU; SDPA on
        // the key-padding mask built from the attention_mask input (each sequence's key length).
        per_layer: &[
            ("gemm_rcr_bias", 3),
            ("gemm_rcr_bias_ep_add", 2),
            ("gemm_rcr_bias_ep_gelu", 1),
            ("layernorm_affine", 2),
            ("sdpa_padded", 1),
        ],
        // The embeddings' LayerNorm with the add of the position embeddings before it (the word
        // and token-type sum before that stays torch's); nothing else reads the sum.
        once: &[("add_layernorm_affine", 1)],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "t5_encoder",
        // q, k and v; o and wo with the residual (the first layer's o too: its projection is
        // returned beside the position bias in a tuple the bridge unpacks); wi with ReLU; T5's
        // RMSNorm (no mean, no bias) before attention and MLP; SDPA whose float mask is the
        // relative position bias selected by the padding mask (`where(mask, bias, finfo.min)`):
        // the kernel takes the padding as key lengths and adds the shared bias; the bias, permuted
        // from [Tq,Tk,H], leaves the where's keys strided (`_strided`: torch's own call runs its
        // math path there).
        per_layer: &[
            ("gemm_rcr", 3),
            ("gemm_rcr_ep_add", 2),
            ("gemm_rcr_ep_relu", 1),
            ("rmsnorm_weight", 2),
            ("sdpa_padded_bias_strided", 1),
        ],
        // The final norm.
        once: &[("rmsnorm_weight", 1)],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "vit_b_16",
        // aten::_native_multi_head_attention read as what it computes: the [3E] in-projection,
        // SDPA, the out-projection with the residual; the MLP (GELU; the residual through eval
        // dropout).
        per_layer: &[
            ("gemm_rcr_bias", 1),
            ("sdpa", 1),
            ("gemm_rcr_bias_ep_gelu", 1),
            ("gemm_rcr_bias_ep_add", 2),
            ("layernorm_affine", 2),
        ],
        // The 16x16 stride-16 patch embedding, a convolution with bias (the patch kind's). The position
        // embedding's add stays torch's: its sum is read again (the first residual) through the
        // eval dropout before ln_1, which the add's call could not take over (rules::residual).
        once: &[
            ("layernorm_affine", 1),
            ("gemm_rcr_bias", 1),
            ("patch_conv_bias", 1),
        ],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "resnet50",
        // One bottleneck per stage under --ci, every convolution with its BatchNorm: the stem
        // (7x7 s2, ReLU) before max_pool2d; per block 1x1 and 3x3 (s2 after the first stage)
        // with ReLU, then the last 1x1 with the residual add and ReLU, its downsample (1x1, s2
        // after the first stage) keeping its BatchNorm alone; the classifier.
        per_layer: &[],
        once: &[
            ("conv2d_s2_p3_d1_bias_relu", 1),
            ("conv2d_s1_p0_d1_bias_relu", 4),
            ("conv2d_s1_p1_d1_bias_relu", 1),
            ("conv2d_s2_p1_d1_bias_relu", 3),
            ("conv2d_s1_p0_d1_bias_add_relu", 4),
            ("conv2d_s1_p0_d1_bias", 1),
            ("conv2d_s2_p0_d1_bias", 3),
            ("gemm_rcr_bias", 1),
        ],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "mobilenet_v3_large",
        // The two classifier Linears (hardswish between them is no epilogue op). The stem (3x3
        // s2, hardswish); each block's 1x1 expansion (ReLU or hardswish) and 1x1 projection
        // (BatchNorm alone, or with the residual add); the squeeze-excitation's two 1x1
        // convolutions with bias (ReLU, then hardsigmoid, fact's functor); the last 1x1
        // (hardswish). Each block's depthwise convolution (groups = C: 3x3 or 5x5, stride 1 or
        // 2) with its BatchNorm and ReLU or hardswish; those over 72, 120, 184 and 200 channels
        // (no multiple of 16) are patterns whose plan says no kernel takes them.
        per_layer: &[],
        once: &[
            ("conv2d_s2_p1_d1_bias_hardswish", 1),
            ("conv2d_s1_p0_d1_bias_relu", 13),
            ("conv2d_s1_p0_d1_bias_hardswish", 10),
            ("conv2d_s1_p0_d1_bias", 5),
            ("conv2d_s1_p0_d1_bias_hardsigmoid", 8),
            ("conv2d_s1_p0_d1_bias_add", 10),
            ("conv2d_s1_p1_d1_g16_bias_relu", 1),
            ("conv2d_s2_p1_d1_g64_bias_relu", 1),
            ("conv2d_s1_p1_d1_g72_bias_relu", 1),
            ("conv2d_s2_p2_d1_g72_bias_relu", 1),
            ("conv2d_s1_p2_d1_g120_bias_relu", 2),
            ("conv2d_s2_p1_d1_g240_bias_hardswish", 1),
            ("conv2d_s1_p1_d1_g200_bias_hardswish", 1),
            ("conv2d_s1_p1_d1_g184_bias_hardswish", 2),
            ("conv2d_s1_p1_d1_g480_bias_hardswish", 1),
            ("conv2d_s1_p1_d1_g672_bias_hardswish", 1),
            ("conv2d_s2_p2_d1_g672_bias_hardswish", 1),
            ("conv2d_s1_p2_d1_g960_bias_hardswish", 2),
            ("gemm_rcr_bias", 2),
        ],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "mobilenet_v2",
        // Held out. The stem (3x3 s2) and every expansion 1x1 with its BatchNorm and ReLU6
        // (`hardtanh_(x, 0, 6)`: fact's functor in the epilogue); each depthwise 3x3 (stride 1 or
        // 2) with BatchNorm and ReLU6; each projection 1x1 with its BatchNorm alone, or with the
        // residual add; the last 1x1 (ReLU6) and the classifier.
        per_layer: &[],
        once: &[
            ("conv2d_s2_p1_d1_bias_relu6", 1),
            ("conv2d_s1_p0_d1_bias_relu6", 17),
            ("conv2d_s1_p0_d1_bias", 7),
            ("conv2d_s1_p0_d1_bias_add", 10),
            ("conv2d_s1_p1_d1_g32_bias_relu6", 1),
            ("conv2d_s2_p1_d1_g96_bias_relu6", 1),
            ("conv2d_s1_p1_d1_g144_bias_relu6", 1),
            ("conv2d_s2_p1_d1_g144_bias_relu6", 1),
            ("conv2d_s1_p1_d1_g192_bias_relu6", 2),
            ("conv2d_s2_p1_d1_g192_bias_relu6", 1),
            ("conv2d_s1_p1_d1_g384_bias_relu6", 4),
            ("conv2d_s1_p1_d1_g576_bias_relu6", 2),
            ("conv2d_s2_p1_d1_g576_bias_relu6", 1),
            ("conv2d_s1_p1_d1_g960_bias_relu6", 3),
            ("gemm_rcr_bias", 1),
        ],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "convnext_tiny",
        // One block per stage under --ci: its LayerNorm over channels and Linear-GELU-Linear;
        // the stem's, downsamplers' and head's LayerNorm2d (a permuted layer_norm); the head.
        // The stem's 4x4 s4 convolution with bias (the patch kind's: x is the NCHW image) and the
        // downsamplers' 2x2 s2 ones (the convolution kind's: x channels-last); each block's
        // 7x7 depthwise convolution with its bias (groups = C; the permute after it is no
        // epilogue op). Each block's second linear takes the permute back to NCHW, the layer
        // scale and the residual (a turned epilogue: mul by a row, add a full-size leaf).
        per_layer: &[],
        once: &[
            ("layernorm_affine", 9),
            ("gemm_rcr_bias_ep_gelu", 4),
            ("gemm_rcr_bias_ep_mul_add", 4),
            ("gemm_rcr_bias", 1),
            ("patch_conv_bias", 1),
            ("conv2d_s2_p0_d1_bias", 3),
            ("conv2d_s1_p3_d1_g96_bias", 1),
            ("conv2d_s1_p3_d1_g192_bias", 1),
            ("conv2d_s1_p3_d1_g384_bias", 1),
            ("conv2d_s1_p3_d1_g768_bias", 1),
        ],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "mpnet",
        // BERT's layout: q, k and v with bias; the output projections with the residual; the
        // intermediate with GELU; two norms. The eager attention adds the relative position
        // bias (in place) and then the padding mask: the kernel adds the bias and takes the
        // padding as key lengths (`attention_padded_bias`, one bias at batch 1). The bias, a
        // function of the positions, is the memo's. The embeddings' norm with the position
        // embeddings' add.
        per_layer: &[
            ("gemm_rcr_bias", 3),
            ("gemm_rcr_bias_ep_add", 2),
            ("gemm_rcr_bias_ep_gelu", 1),
            ("layernorm_affine", 2),
            ("attention_padded_bias", 1),
        ],
        once: &[("add_layernorm_affine", 1)],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "mpt",
        // Wqkv; out_proj and down_proj with the residual; up_proj with GELU; LayerNorms without
        // bias before attention and MLP. The eager attention adds ALiBi ([H,1,Tk], one row of
        // keys per head) and then fills the causal mask's cells with finfo.min: the kernel adds
        // the row to every query's scores and skips the blocks past the diagonal
        // (`attention_causal_bias_keys`; traced in fp32, where ALiBi is q's dtype). The final
        // norm and the lm_head.
        per_layer: &[
            ("gemm_rcr", 1),
            ("gemm_rcr_ep_add", 2),
            ("gemm_rcr_ep_gelu", 1),
            ("layernorm_weight", 2),
            ("attention_causal_bias_keys", 1),
        ],
        once: &[("layernorm_weight", 1), ("gemm_rcr", 1)],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "convnextv2",
        // Held out (Hugging Face's ConvNeXt V2-tiny, one block a stage under --ci): ConvNeXt's
        // block with Global Response Normalization between its linears (`grn`: the norms over
        // the spatial dims, their mean over the channels, the scale, bias and residual, one
        // kernel of fact's own); the first linear with GELU, the second with the block's
        // residual (through the permute back). The LayerNorms of the blocks, the stem and the
        // downsamplers; the stem's and downsamplers' convolutions, each block's 7x7 depthwise.
        // The pooled output's final LayerNorm reads a mean (left to torch).
        per_layer: &[],
        once: &[
            ("grn", 4),
            ("gemm_rcr_bias_ep_gelu", 4),
            ("gemm_rcr_bias_ep_add", 4),
            ("layernorm_affine", 8),
            ("patch_conv_bias", 1),
            ("conv2d_s2_p0_d1_bias", 3),
            ("conv2d_s1_p3_d1_g96_bias", 1),
            ("conv2d_s1_p3_d1_g192_bias", 1),
            ("conv2d_s1_p3_d1_g384_bias", 1),
            ("conv2d_s1_p3_d1_g768_bias", 1),
        ],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "beit",
        // Each layer: q and v with bias, k without; the MLP's first linear with GELU; the
        // attention output and the MLP's second linear each with the layer scale and the residual
        // (`mul_add`); the two norms; SDPA with the relative position bias added through its
        // float mask (`sdpa_bias`). The bias is gathered from its table by an index BEiT rebuilds
        // in place every forward, all of it the memo's. The 16x16 s16 patch embedding.
        per_layer: &[
            ("gemm_rcr", 1),
            ("gemm_rcr_bias", 2),
            ("gemm_rcr_bias_ep_gelu", 1),
            ("gemm_rcr_bias_ep_mul_add", 2),
            ("layernorm_affine", 2),
            ("sdpa_bias", 1),
        ],
        once: &[("patch_conv_bias", 1)],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "swin_v2_t",
        // Two blocks a stage under --ci, post-norm (each residual branch normed before its add).
        // Cosine attention: q and k normalized (torch's ops), their product scaled by the logit
        // scale, one per head (the kernel reads head h's), the position bias `16 *
        // sigmoid(mlp(..))` added (`attention_bias`; the shifted blocks' window masks with it,
        // one bias per window: 49, 16 and 4 windows of 8x8 in the first three stages). The
        // bias MLP's layers (the memo's, from parameters alone), the patch merging's reduction
        // and norm, the patch embedding and the head.
        per_layer: &[],
        once: &[
            ("add_layernorm_affine", 1),
            ("attention_bias", 5),
            ("attention_bias_windows49", 1),
            ("attention_bias_windows16", 1),
            ("attention_bias_windows4", 1),
            ("patch_conv_bias", 1),
            ("gemm_rcr", 7),
            ("gemm_rcr_bias", 25),
            ("gemm_rcr_bias_ep_gelu", 8),
            ("gemm_rcr_padn", 4),
            ("layernorm_affine", 20),
        ],
        wanted: &[],
        kv_heads: None,
    },
    Expect {
        model: "swin_t",
        // Two blocks a stage under --ci (the last stage's 7x7 map is one window, so neither of
        // its blocks shifts): each block's qkv and output projections with bias, its MLP (GELU;
        // the residual), the norm after each residual add with the add in it (the stochastic
        // depth is eval's identity), the patch merging's norm and reduction, the 4x4 s4 patch
        // embedding with its norm, and the head. Every window's attention (q scaled before the
        // product) adds the relative position bias [1,H,49,49] (`attention_bias`); the shifted
        // ones add their mask through a 5-d view of the scores too, one bias per window (64,
        // 16 and 4 windows in the first three stages).
        per_layer: &[],
        once: &[
            ("add_layernorm_affine_sum", 8),
            ("attention_bias", 5),
            ("attention_bias_windows64", 1),
            ("attention_bias_windows16", 1),
            ("attention_bias_windows4", 1),
            ("patch_conv_bias", 1),
            ("gemm_rcr", 3),
            ("gemm_rcr_bias", 17),
            ("gemm_rcr_bias_ep_add", 8),
            ("gemm_rcr_bias_ep_gelu", 8),
            ("layernorm_affine", 13),
        ],
        wanted: &[],
        kv_heads: None,
    },
];

/// `fact discover --json` on `model` with no pattern tables: (the plan, or discover's stderr).
fn discover(model: &Path) -> Result<Plan, String> {
    discover_with(model, &[])
}

/// `fact discover --json` with `args` after the model.
fn discover_with(model: &Path, args: &[&str]) -> Result<Plan, String> {
    let dir = tempfile::tempdir().unwrap();
    let out = fact()
        .env("FACT_TABLE", dir.path().join("t.json"))
        .env("FACT_SHIPPED_TABLE", dir.path().join("none.json"))
        .arg("discover")
        .arg(model)
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Ok(serde_json::from_value(v["plan"].clone()).expect("discover --json's plan"))
}

/// The zoo fixtures' manifest.json: one entry per model, in the zoo's order.
fn manifest(dir: &Path) -> Vec<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

/// A rule id without the epilogue program's digest (`_` and eight hex digits at the end).
fn rule_name(rule: &str) -> &str {
    match rule.rsplit_once('_') {
        Some((head, digest))
            if digest.len() == 8 && digest.chars().all(|c| c.is_ascii_hexdigit()) =>
        {
            head
        }
        _ => rule,
    }
}

fn counts<'a>(items: impl Iterator<Item = &'a str>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for i in items {
        *out.entry(i.to_string()).or_insert(0) += 1;
    }
    out
}

/// What discover found in one model and what it left, for a reader of the test's output.
fn report(e: &Expect, layers: usize, plan: &Plan, found: &BTreeMap<String, usize>) -> String {
    let kinds = counts(plan.patterns.iter().map(|p| p.problem.kind().name()));
    let mut s = format!(
        "{} ({layers} layers): rules {found:?}; kinds {kinds:?}; unmatched {:.1}% of the estimate\n",
        e.model,
        plan.unmatched_share * 100.0
    );
    for r in plan.unmatched.iter().take(3) {
        let mut by_kind: Vec<(String, usize)> =
            counts(r.kinds.iter().map(|k| k.trim_start_matches("aten::")))
                .into_iter()
                .collect();
        // The ops that do the work first (attention, convolutions, products, norms), then the
        // most frequent.
        let heavy = |k: &str| {
            ["attention", "convolution", "matmul", "mm", "norm", "mean"]
                .iter()
                .any(|h| k.contains(h))
        };
        by_kind.sort_by(|a, b| {
            heavy(&b.0)
                .cmp(&heavy(&a.0))
                .then_with(|| b.1.cmp(&a.1))
                .then_with(|| a.0.cmp(&b.0))
        });
        let most: Vec<String> = by_kind
            .iter()
            .take(6)
            .map(|(k, n)| format!("{k} x{n}"))
            .collect();
        let name: String = r.name.chars().take(120).collect();
        s += &format!(
            "    unmatched {:5.1}%, {} nodes ({}): {name}\n",
            r.share * 100.0,
            r.nodes.len(),
            most.join(", ")
        );
    }
    for (kind, what) in e.wanted {
        s += &format!(
            "    wanted, {kind}: {what}; {kind} patterns found: {}\n",
            kinds.get(*kind).unwrap_or(&0)
        );
    }
    s
}

#[test]
fn zoo_models_discover_the_expected_patterns() {
    let dir = zoo_fixtures();
    let manifest = manifest(dir);
    let names: Vec<&str> = manifest
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    let rows: Vec<&str> = EXPECT.iter().map(|e| e.model).collect();
    assert_eq!(
        names, rows,
        "every zoo model has one row in EXPECT, in the zoo's order"
    );
    let mut failures = Vec::new();
    for (e, m) in EXPECT.iter().zip(&manifest) {
        let layers = m["layers"].as_u64().unwrap() as usize;
        let plan = match discover(&dir.join(m["file"].as_str().unwrap())) {
            Ok(plan) => plan,
            Err(stderr) => {
                failures.push(format!("{}: discover failed: {stderr}", e.model));
                continue;
            }
        };
        let found = counts(plan.patterns.iter().map(|p| rule_name(&p.rule)));
        let mut expected: BTreeMap<String, usize> = BTreeMap::new();
        for (rule, n) in e.per_layer {
            *expected.entry(rule.to_string()).or_insert(0) += n * layers;
        }
        for (rule, n) in e.once {
            *expected.entry(rule.to_string()).or_insert(0) += n;
        }
        print!("{}", report(e, layers, &plan, &found));
        for p in plan
            .patterns
            .iter()
            .filter(|p| p.rule.starts_with("sdpa") || p.rule.starts_with("attention"))
        {
            let Some(a) = p.problem.get::<fact::kinds::attention::AttentionProblem>() else {
                panic!("{}: {} is no attention problem", e.model, p.rule);
            };
            if a.kv_heads != e.kv_heads {
                failures.push(format!(
                    "{}: {} reads k/v with {:?} heads, EXPECT says {:?}",
                    e.model, p.id, a.kv_heads, e.kv_heads
                ));
            }
        }
        if found != expected {
            failures.push(format!(
                "{}: discover found {found:?}, EXPECT says {expected:?}",
                e.model
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_layers_q_k_and_v_are_one_gemm_when_asked() {
    // Llama's projections view their outputs; GPT-J's read their sizes first (`_split_heads`).
    let dir = zoo_fixtures();
    let manifest = manifest(dir);
    for model in ["llama", "gptj"] {
        let m = manifest.iter().find(|m| m["name"] == model).unwrap();
        let layers = m["layers"].as_u64().unwrap() as usize;
        let plan = discover_with(&dir.join(m["file"].as_str().unwrap()), &["--fuse-siblings"])
            .unwrap_or_else(|e| panic!("{e}"));
        let found = counts(plan.patterns.iter().map(|p| rule_name(&p.rule)));
        // Every GEMM without bias left is one the model has once (the lm_head).
        let e = EXPECT.iter().find(|e| e.model == model).unwrap();
        let once = e
            .once
            .iter()
            .find(|(r, _)| *r == "gemm_rcr")
            .map(|(_, n)| n);
        assert_eq!(
            (found.get("siblings_rcr"), found.get("gemm_rcr")),
            (Some(&layers), once),
            "{model}: {found:?}"
        );
    }
}

/// The Llama-style decoder builds its causal mask and rotary tables from its positions: the
/// bridge marks those ops as the memo's, and discover counts them apart, not as unmatched.
#[test]
fn a_decoders_masks_and_positions_are_the_memos() {
    let plan = discover(&zoo_fixtures().join("llama.pt")).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        plan.memo_ops > 0 && plan.memo_share > 0.05,
        "{} ops, {:.1}%",
        plan.memo_ops,
        plan.memo_share * 100.0
    );
    for r in &plan.unmatched {
        assert!(
            !r.kinds
                .iter()
                .any(|k| k == "aten::arange" || k == "aten::cos"),
            "the mask and the rotary tables are the memo's: {}",
            r.name
        );
    }
}

#[test]
fn discover_sees_past_multihead_attention() {
    // _native_multi_head_attention returns an undefined weights tensor: shape propagation must
    // carry on to the Linear after it, whose operand shape comes from the attention's output.
    let plan = discover(&fixture("mha.pt")).unwrap_or_else(|e| panic!("{e}"));
    let linear = plan
        .patterns
        .iter()
        .find(|p| p.rule == "gemm_rcr_bias")
        .expect("the Linear after the attention is a pattern");
    assert_eq!(linear.input_shapes[0], vec![2, 16, 32]);
    assert!(plan.patterns.iter().any(|p| p.rule == "layernorm_affine"));
}

#[test]
fn plot_e2e_draws_fact_over_torch_compile() {
    // Test data, written by hand: no measurement.
    let records = serde_json::json!({
        "meta": {"device": "test GPU", "torch": "2.11.0", "date": "2026-01-01"},
        "records": [
            {"model": "alpha", "family": "a", "policy": "tf32", "eager_ms": 9.0, "traced_ms": 8.5,
             "compile_ms": 6.0, "max_autotune_ms": 5.0, "fact_ms": 4.0, "errors": {}},
            {"model": "alpha", "family": "a", "policy": "bf16", "eager_ms": 5.0, "traced_ms": null,
             "compile_ms": 3.0, "max_autotune_ms": null, "fact_ms": 4.0, "errors": {}},
            {"model": "beta", "family": "b", "policy": "tf32", "eager_ms": 7.0, "traced_ms": 7.0,
             "compile_ms": 5.0, "max_autotune_ms": null, "fact_ms": null,
             "errors": {"compose": "fact compose exited with 1"}},
            {"model": "gamma", "family": "c", "policy": "tf32", "eager_ms": 2.0,
             "compile_ms": null, "fact_ms": 1.0, "errors": {"compile": "timed out"}}
        ]
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zoo.json");
    std::fs::write(&path, records.to_string()).unwrap();
    let svg_path = dir.path().join("zoo.svg");
    let out = fact()
        .args(["plot-e2e", "--over", "torch.compile", "--out"])
        .arg(&svg_path)
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let bar = |reference: f64, ms: f64| format!("{:.2}x ({ms:.3} ms)", reference / ms);
    for (reference, ms) in [(6.0, 6.0), (6.0, 5.0), (6.0, 4.0), (6.0, 9.0), (3.0, 4.0)] {
        assert!(svg.contains(&bar(reference, ms)), "{}", bar(reference, ms));
    }
    // torch.compile first in each group: the reference bar of every group is 1.00x.
    let alpha = svg.find("alpha (tf32)").unwrap();
    let first_bar = svg[alpha..].find("x (").unwrap() + alpha;
    assert_eq!(&svg[first_bar - 4..first_bar + 1], "1.00x");
    assert!(svg.contains("no fact time (compose: fact compose exited with 1)"));
    assert!(svg.contains("no torch.compile time (compile: timed out)"));
    let geo_tf32 = 6.0f64 / 4.0;
    let geo_bf16 = 3.0f64 / 4.0;
    assert!(svg.contains(&format!(
        "fact over torch.compile, geomean: tf32 {geo_tf32:.2}x (1 model), bf16 {geo_bf16:.2}x (1 model)"
    )));

    let bad = fact()
        .args(["plot-e2e", "--over", "jit", "--out"])
        .arg(&svg_path)
        .arg(&path)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("eager, traced, torch.compile, max-autotune"),
        "{err}"
    );
}
