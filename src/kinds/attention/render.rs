//! Attention's templates rendered: the kernel's translation unit (templates/sm80_fmha.cu.hbs,
//! CUTLASS's examples/41; templates/sm90_fmha.cu.hbs, its examples/88 with the mask and the
//! schedule compiled in) and its section of the torch op library (templates/attention_op.cpp.hbs:
//! `fact::attention`, the mask classifier it shares with the bridge, and the fallback that replays
//! the graph's own ops as the form records them). Pure: the same spec renders the same text.

use super::{AttentionFamily, AttentionSpec, Sm90Schedule};
use crate::codegen::{self, OpCode, Source};
use crate::types::Arch;
use handlebars::Handlebars;
use serde_json::json;
use std::sync::OnceLock;

const SM80_FMHA: &str = include_str!("templates/sm80_fmha.cu.hbs");
const SM90_FMHA: &str = include_str!("templates/sm90_fmha.cu.hbs");
const OP: &str = include_str!("templates/attention_op.cpp.hbs");

/// The attention mask classifier, shared with the bridge (which includes the header): the op
/// library classifies the masks calls pass with the same code that classified the graph's.
const MASK_CLASS: &str = include_str!("../../torch/mask_class.h");

fn templates() -> &'static Handlebars<'static> {
    static R: OnceLock<Handlebars<'static>> = OnceLock::new();
    R.get_or_init(|| {
        codegen::templates(
            &[codegen::PER_DEVICE],
            &[
                ("sm80_fmha", SM80_FMHA),
                ("sm90_fmha", SM90_FMHA),
                ("op", OP),
            ],
        )
    })
}

/// The translation unit of one attention kernel.
pub fn render(a: &AttentionSpec) -> Source {
    let mut vars = json!({
        "name": a.name(),
        "arch": a.arch.short_name(),
        "element": a.dtype.cutlass_tag(),
        "dtype_abi": codegen::dtype_abi(a.dtype),
        "math": a.math.short_name(),
        "tf32": a.math == crate::types::MathType::Tf32,
        "queries": a.queries_per_block,
        "keys": a.keys_per_block,
        "max_k": a.max_k,
        "bias": a.bias,
    });
    let template = match a.family {
        AttentionFamily::Sm80 => "sm80_fmha",
        AttentionFamily::Sm90 {
            schedule,
            causal,
            overlap,
            prefetch_q,
            key_lengths,
        } => {
            vars["overlap"] = json!(overlap);
            vars["prefetch_q"] = json!(prefetch_q);
            // examples/88's five unless the name says fewer (`_kvN`).
            vars["kv_stages"] = json!(a.fewer_kv_stages());
            vars["schedule"] = json!(schedule.cutlass_policy());
            vars["smem_per_cta"] = json!(crate::types::Arch::Sm90.hardware().smem_per_cta);
            vars["persistent"] = json!(schedule.persistent());
            let (tile_scheduler, tile_order) = schedule.tile_scheduler();
            vars["tile_scheduler"] = json!(tile_scheduler);
            vars["tile_order"] = json!(tile_order);
            vars["rotated"] = json!(schedule == Sm90Schedule::Persistent);
            vars["paired"] = json!(schedule == Sm90Schedule::Paired);
            vars["causal"] = json!(causal);
            vars["key_lengths"] = json!(key_lengths);
            // Without a causal mask the keys past Tk (or past the sequence's length, which the
            // key-length mainloop hands the fusion as Tk) in the last key block still need one.
            vars["fusion"] = json!(match (causal, key_lengths) {
                (true, false) => "cutlass::fmha::collective::CausalFusion",
                (true, true) => "CausalLengthFusion",
                (false, _) => "TailFusion",
            });
            "sm90_fmha"
        }
    };
    let text = templates()
        .render(template, &vars)
        .unwrap_or_else(|e| panic!("rendering {}: {e}", a.name()));
    Source {
        file_name: format!("{}.cu", a.name()),
        text,
    }
}

/// What an attention kernel's tensors and scalars are, by position (FactKernelInfo::signature).
pub fn signature(a: &AttentionSpec) -> String {
    let out = match a.family {
        AttentionFamily::Sm80 => "out[B,Hq,Tq,D] (stored [B,Tq,Hq,D])",
        AttentionFamily::Sm90 { .. } => "out[B,Hq,Tq,D]",
    };
    let lengths = match a.family {
        AttentionFamily::Sm90 {
            key_lengths: true, ..
        } => "lengths i32[B]",
        AttentionFamily::Sm90 { .. } => "lengths (NULL data)",
        AttentionFamily::Sm80 => "lengths i32[B]?",
    };
    let bias = if a.bias {
        "bias[B,Hq,Tq,Tk]"
    } else {
        "bias (NULL data)"
    };
    format!("q[B,Hq,Tq,D] k[B,Hkv,Tk,D] v[B,Hkv,Tk,D] {out} factor f32[1]? {lengths} {bias} (NULL data when absent; Hkv divides Hq); scale causal power (scale·factor^power)")
}

/// Attention's section of the op library for `arch`, after the mask classifier (before the
/// library's namespace: a header of its own).
pub fn op_code(arch: Arch) -> OpCode {
    OpCode {
        prelude: format!(
            "// The attention mask classifier the bridge uses at load, src/torch/mask_class.h as codegen\n// inlines it.\n{}\n",
            MASK_CLASS.replace("#pragma once\n", "")
        ),
        body: templates()
            .render("op", &codegen::op_vars(arch))
            .expect("the attention op renders"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DType, MathType};

    #[test]
    fn attention_renders_are_golden_and_only_tf32_multiplies_once() {
        let a = AttentionSpec {
            arch: Arch::Sm90,
            dtype: DType::F32,
            math: MathType::Tf32,
            queries_per_block: 32,
            keys_per_block: 128,
            max_k: 128,
            family: AttentionFamily::Sm80,
            bias: false,
        };
        let text = render(&a).text;
        expect_test::expect_file!["../../../tests/golden/sm80_fmha_tf32_f32_q32_k128_d128.cu"]
            .assert_eq(&text);
        assert!(text.contains(
            "AttentionKernel<float, cutlass::arch::Sm80, /*isAligned=*/true, 32, 128, 128,"
        ));
        let x3 = render(&AttentionSpec {
            math: MathType::Tf32x3,
            ..a.clone()
        })
        .text;
        assert!(
            !x3.contains("DefaultGemmType")
                && text.contains("using Operator = cutlass::arch::OpMultiplyAdd;"),
            "3xTF32 keeps the example's own float MMA"
        );
        let bf16 = render(&AttentionSpec {
            dtype: DType::Bf16,
            math: MathType::Bf16,
            ..a.clone()
        })
        .text;
        assert!(
            bf16.contains("AttentionKernel<cutlass::bfloat16_t,") && bf16.contains("t->dtype != 1")
        );
        // A kernel without knobs gets zeros in the dispatch table (registry tests: one table lists
        // every kind in the order given).
        let d = crate::kinds::render_dispatch(&[a.clone().into()]).text;
        assert!(
            d.contains(&format!("{{\"{}\", \"attention\"", a.name())),
            "{d}"
        );
        assert!(d.contains(&format!(
            "fact_k_{0}_can_implement, fact_k_{0}_workspace_size, fact_k_{0}_run, {{ 0, 0, 0 }}}},",
            a.name()
        )));
    }

    #[test]
    fn sm80_attention_render_is_golden_and_says_its_target() {
        let a = AttentionSpec {
            arch: Arch::Sm80,
            dtype: DType::Bf16,
            math: MathType::Bf16,
            queries_per_block: 64,
            keys_per_block: 64,
            max_k: 64,
            family: AttentionFamily::Sm80,
            bias: false,
        };
        assert_eq!(a.name(), "sm80_fmha_bf16_bf16_q64_k64_d64_for_sm80");
        let text = render(&a).text;
        expect_test::expect_file![
            "../../../tests/golden/sm80_fmha_bf16_bf16_q64_k64_d64_for_sm80.cu"
        ]
        .assert_eq(&text);
        assert!(
            text.contains("sm80 mma.sync code, built for sm80)")
                && text.contains("fact_k_sm80_fmha_bf16_bf16_q64_k64_d64_for_sm80_run")
        );
        // Every sm80 kernel is the variable-length one: grouped heads and key lengths are
        // arguments of the launch, not of the compiled code.
        assert!(
            text.contains(
                "c.p, c.factor, c.factor_step, a->scalars[2] > 0 ? 1 : -1, c.lengths, c.group);"
            ) && text
                .contains("if (lengths != nullptr) p.num_keys = cutlass::fast_min(p.num_keys,")
                && text.contains("if (H % Hkv != 0 ||")
        );
    }

    #[test]
    fn sm90_attention_render_is_golden_and_compiles_the_mask_in() {
        let sm90 = |schedule, causal| AttentionSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            math: MathType::Bf16,
            queries_per_block: 128,
            keys_per_block: 128,
            max_k: 128,
            family: AttentionFamily::Sm90 {
                schedule,
                causal,
                overlap: false,
                prefetch_q: false,
                key_lengths: false,
            },
            bias: false,
        };
        let a = sm90(Sm90Schedule::Cooperative, true);
        let text = render(&a).text;
        expect_test::expect_file![
            "../../../tests/golden/sm90_fmha_bf16_bf16_q128_k128_d128_coop_causal.cu"
        ]
        .assert_eq(&text);
        assert!(text.contains("Shape<_128, _128, _128>") && text.contains("cutlass::fmha::collective::CausalFusion, cutlass::gemm::KernelTmaWarpSpecializedCooperative>"));
        assert!(
            text.contains("constexpr bool kCausal = true;")
                && text.contains("fact_k_sm90_fmha_bf16_bf16_q128_k128_d128_coop_causal_run")
        );
        assert!(!text.contains("RotatedTileScheduler"));
        let full = render(&sm90(Sm90Schedule::Pingpong, false)).text;
        assert!(
            full.contains("TailFusion, cutlass::gemm::KernelTmaWarpSpecializedPingpong>")
                && full.contains("constexpr bool kCausal = false;")
                && !full.contains("RotatedTileScheduler")
        );
        // fact's tile order replaces examples/88's persistent scheduler; the overlapped loop and
        // the four Q stages are knobs of it.
        let rotated = AttentionSpec {
            max_k: 96,
            family: AttentionFamily::Sm90 {
                schedule: Sm90Schedule::Persistent,
                causal: true,
                overlap: true,
                prefetch_q: true,
                key_lengths: false,
            },
            ..a.clone()
        };
        assert_eq!(
            rotated.name(),
            "sm90_fmha_bf16_bf16_q128_k128_d96_persist_ovl_pq_causal"
        );
        let text = render(&rotated).text;
        expect_test::expect_file![
            "../../../tests/golden/sm90_fmha_bf16_bf16_q128_k128_d96_persist_ovl_pq_causal.cu"
        ]
        .assert_eq(&text);
        assert!(
            text.contains("Epilogue, RotatedTileScheduler, Options...>")
                && text.contains("Shape<_128, _128, _96>")
                && text.contains("KernelTmaWarpSpecializedPingpong,\n    cutlass::fmha::kernel::Option<cutlass::fmha::kernel::Tag::kStagesQ, _4>>")
                && text.contains("return overlapped(blk, wg, p, masked(blk, params, p, problem), rest...);")
        );
        assert!(!text.contains("PairedTileScheduler"));
        // Under a causal mask the sweep's order is the paired one.
        let paired = AttentionSpec {
            max_k: 64,
            family: AttentionFamily::Sm90 {
                schedule: Sm90Schedule::Paired,
                causal: true,
                overlap: false,
                prefetch_q: true,
                key_lengths: false,
            },
            ..a.clone()
        };
        assert_eq!(
            paired.name(),
            "sm90_fmha_bf16_bf16_q128_k128_d64_pair_pq_causal"
        );
        let text = render(&paired).text;
        expect_test::expect_file![
            "../../../tests/golden/sm90_fmha_bf16_bf16_q128_k128_d64_pair_pq_causal.cu"
        ]
        .assert_eq(&text);
        assert!(
            text.contains("Epilogue, PairedTileScheduler, Options...>")
                && text.contains("fact's paired tile order")
                && !text.contains("RotatedTileScheduler")
                && text.contains(
                    "return Base::compute(blk, wg, p, masked(blk, params, p, problem), rest...);"
                )
        );
        let coop = render(&a).text;
        assert!(
            coop.contains(
                "return Base::compute(blk, wg, p, masked(blk, params, p, problem), rest...);"
            ) && !coop.contains("overlapped(")
                && !coop.contains("kStagesQ")
        );
        let f16 = render(&AttentionSpec {
            dtype: DType::F16,
            math: MathType::F16,
            ..a.clone()
        })
        .text;
        assert!(f16.contains("using Element = cutlass::half_t;") && f16.contains("t->dtype != 2"));
        let d = crate::kinds::render_dispatch(&[a.clone().into()]).text;
        assert!(d.contains(&format!("{{\"{}\", \"attention\"", a.name())));
    }

    #[test]
    fn an_sm90_head_dim_256_render_is_golden_with_the_stages_that_fit() {
        let a = AttentionSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            math: MathType::Bf16,
            queries_per_block: 128,
            keys_per_block: 64,
            max_k: 256,
            family: AttentionFamily::Sm90 {
                schedule: Sm90Schedule::Paired,
                causal: true,
                overlap: false,
                prefetch_q: false,
                key_lengths: false,
            },
            bias: false,
        };
        assert_eq!(
            a.name(),
            "sm90_fmha_bf16_bf16_q128_k64_d256_kv3_pair_causal"
        );
        let text = render(&a).text;
        expect_test::expect_file![
            "../../../tests/golden/sm90_fmha_bf16_bf16_q128_k64_d256_kv3_pair_causal.cu"
        ]
        .assert_eq(&text);
        assert!(text.contains("Tag::kStagesKV, _3>") && text.contains("Shape<_128, _64, _256>"));
        // One CTA per tile has no output buffers beside the mainloop: examples/88's five stages.
        let coop = AttentionSpec {
            family: AttentionFamily::Sm90 {
                schedule: Sm90Schedule::Cooperative,
                causal: true,
                overlap: false,
                prefetch_q: false,
                key_lengths: false,
            },
            ..a.clone()
        };
        assert_eq!(coop.name(), "sm90_fmha_bf16_bf16_q128_k64_d256_coop_causal");
        assert!(!render(&coop).text.contains("kStagesKV"));
    }

    #[test]
    fn sm90_key_length_renders_are_golden_and_compile_the_lengths_in() {
        let klen = |causal, schedule, overlap| AttentionSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            math: MathType::Bf16,
            queries_per_block: 128,
            keys_per_block: 128,
            max_k: 128,
            family: AttentionFamily::Sm90 {
                schedule,
                causal,
                overlap,
                prefetch_q: false,
                key_lengths: true,
            },
            bias: false,
        };
        // A Llama-style padded decoder: the causal mask and each sequence's length in one fusion.
        let causal = klen(true, Sm90Schedule::Paired, true);
        assert_eq!(
            causal.name(),
            "sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen"
        );
        let text = render(&causal).text;
        expect_test::expect_file![
            "../../../tests/golden/sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen.cu"
        ]
        .assert_eq(&text);
        assert!(
            text.contains("struct CausalLengthFusion : cutlass::fmha::collective::CausalFusion")
                && text.contains(
                    "CausalLengthFusion, cutlass::gemm::KernelTmaWarpSpecializedPingpong>"
                )
                && text.contains("using Fusion = CausalLengthFusion;")
                && text.contains("constexpr bool kKeyLengths = true;")
                && !text.contains("struct TailFusion")
        );
        // BERT's padded encoder: the tail fusion masks past the length the mainloop hands it.
        let full = render(&klen(false, Sm90Schedule::Cooperative, false)).text;
        assert!(
            full.contains("TailFusion, cutlass::gemm::KernelTmaWarpSpecializedCooperative>")
                && full.contains("constexpr bool kKeyLengths = true;")
                && !full.contains("CausalLengthFusion")
        );
        // Under capture it reads the call's mask for a sequence without a length: the consumers'
        // problem carries the mask, and the tail fusion applies it to every key block.
        assert!(
            full.contains("struct MaskedProblem : P {")
                && full.contains("    ResidualFusion::before_softmax(acc_qk, index_qk, problem_size);\n    apply_call_mask(acc_qk, index_qk, problem_size);")
                && full.contains("    if (has_mask(problem_size)) return get_trip_count(blk_coord, tile_shape, problem_size);")
                && full.contains("      if (reads_mask(blk, params)) return problem;")
        );
        // The causal kernel refuses a mask (its fusion would mask on top of one that need not be
        // causal) and never applies one.
        assert!(
            text.contains("    if (kCausal) return false;")
                && !text.contains("apply_call_mask(acc_qk, index_qk, problem_size);")
        );
        // Without lengths the same schedules compile the problem through unchanged.
        let plain = render(&AttentionSpec {
            family: AttentionFamily::Sm90 {
                schedule: Sm90Schedule::Paired,
                causal: true,
                overlap: true,
                prefetch_q: false,
                key_lengths: false,
            },
            ..causal.clone()
        })
        .text;
        assert!(
            plain.contains("constexpr bool kKeyLengths = false;")
                && !plain.contains("MaskedProblem")
                && !plain.contains("CausalLengthFusion")
                && plain.contains("cutlass::fmha::collective::CausalFusion, cutlass::gemm::KernelTmaWarpSpecializedPingpong>")
        );
    }

    #[test]
    fn a_bias_kernel_renders_golden_with_examples_41s_bias_and_checks_it_per_call() {
        let a = AttentionSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            math: MathType::Bf16,
            queries_per_block: 64,
            keys_per_block: 64,
            max_k: 64,
            family: AttentionFamily::Sm80,
            bias: true,
        };
        assert_eq!(a.name(), "sm80_fmha_bf16_bf16_q64_k64_d64_bias");
        let text = render(&a).text;
        expect_test::expect_file!["../../../tests/golden/sm80_fmha_bf16_bf16_q64_k64_d64_bias.cu"]
            .assert_eq(&text);
        assert!(text.contains("/*kSupportsDropout=*/false, /*kSupportsBias=*/true>;"));
        assert!(text.contains("p.attn_bias_ptr = static_cast<cutlass::bfloat16_t*>(bias.data);"));
        assert!(signature(&a).contains(" bias[B,Hq,Tq,Tk] "));
        // Without the bias the kernel refuses a call that passes one.
        let plain = render(&AttentionSpec { bias: false, ..a }).text;
        assert!(
            plain.contains("/*kSupportsBias=*/false>;")
                && plain.contains("if (bias.data != nullptr) return false;")
        );
        assert!(!plain.contains("attn_bias_ptr"));
    }

    #[test]
    fn attention_signatures_say_where_grouped_heads_and_lengths_go() {
        let sm80 = AttentionSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            math: MathType::Bf16,
            queries_per_block: 64,
            keys_per_block: 64,
            max_k: 64,
            family: AttentionFamily::Sm80,
            bias: false,
        };
        let sm90 = |key_lengths| AttentionSpec {
            queries_per_block: 128,
            keys_per_block: 128,
            family: AttentionFamily::Sm90 {
                schedule: Sm90Schedule::Persistent,
                causal: false,
                overlap: false,
                prefetch_q: false,
                key_lengths,
            },
            ..sm80.clone()
        };
        assert_eq!(
            signature(&sm80),
            "q[B,Hq,Tq,D] k[B,Hkv,Tk,D] v[B,Hkv,Tk,D] out[B,Hq,Tq,D] (stored [B,Tq,Hq,D]) factor f32[1]? lengths i32[B]? bias (NULL data) (NULL data when absent; Hkv divides Hq); scale causal power (scale·factor^power)"
        );
        assert_eq!(
            signature(&sm90(true)),
            "q[B,Hq,Tq,D] k[B,Hkv,Tk,D] v[B,Hkv,Tk,D] out[B,Hq,Tq,D] factor f32[1]? lengths i32[B] bias (NULL data) (NULL data when absent; Hkv divides Hq); scale causal power (scale·factor^power)"
        );
        assert!(signature(&sm90(false)).contains(" lengths (NULL data) "));
        // The dispatch table carries the signature the op reads.
        assert!(crate::kinds::render_dispatch(&[sm90(true).into()])
            .text
            .contains("lengths i32[B] bias (NULL data) (NULL data when absent"));
    }
}
