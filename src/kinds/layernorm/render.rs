//! LayerNorm's templates rendered: the kernel's translation unit (templates/layernorm.cu.hbs,
//! CUDA's own types, no CUTLASS) and its section of the torch op library
//! (templates/layernorm_op.cpp.hbs: `fact::layernorm` and its fallback, the same
//! `at::layer_norm` call). Pure, like every rendering: the same spec renders the same text.

use super::LayerNormSpec;
use crate::codegen::{self, OpCode, Source};
use crate::types::Arch;
use handlebars::Handlebars;
use serde_json::json;
use std::sync::OnceLock;

const KERNEL: &str = include_str!("templates/layernorm.cu.hbs");
const OP: &str = include_str!("templates/layernorm_op.cpp.hbs");

fn templates() -> &'static Handlebars<'static> {
    static R: OnceLock<Handlebars<'static>> = OnceLock::new();
    R.get_or_init(|| {
        codegen::templates(
            &[codegen::RESIDUAL_ADD],
            &[("layernorm", KERNEL), ("op", OP)],
        )
    })
}

/// The translation unit of one LayerNorm kernel.
pub fn render(l: &LayerNormSpec) -> Source {
    let element = codegen::cuda_element(l.dtype);
    let vec_type = codegen::vector_type(&l.name(), l.vector * l.dtype.bytes() as u32);
    let mut vars = json!({
        "name": l.name(),
        "spec_json": serde_json::to_string(l).expect("spec serializes"),
        "dtype": l.dtype.short_name(),
        "dtype_abi": codegen::dtype_abi(l.dtype),
        "element": element,
        "vec_type": vec_type,
        "cols": l.cols,
        "threads": l.threads_per_row,
        "vector": l.vector,
        "rows": l.rows_per_cta,
        "loads": l.loads(),
        "add": l.add.is_some(),
        // Loads first, operands streamed (RowReads::EarlyStreamed).
        "early": !l.reads.is_in_turn(),
    });
    if let Some(add) = l.add {
        for (key, d) in [("a", add.a), ("b", add.b), ("sum", add.sum)] {
            vars[format!("{key}_dtype")] = json!(d.short_name());
            vars[format!("{key}_element")] = json!(codegen::cuda_element(d));
            vars[format!("{key}_abi")] = json!(codegen::dtype_abi(d));
        }
    }
    let text = templates()
        .render("layernorm", &vars)
        .unwrap_or_else(|e| panic!("rendering {}: {e}", l.name()));
    Source {
        file_name: format!("{}.cu", l.name()),
        text,
    }
}

/// LayerNorm's section of the op library for `arch`.
pub fn op_code(arch: Arch) -> OpCode {
    OpCode {
        prelude: String::new(),
        body: templates()
            .render("op", &codegen::op_vars(arch))
            .expect("the layernorm op renders"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::rows::RowReads;
    use crate::types::DType;

    #[test]
    fn layernorm_render_is_golden_and_compiles_c_and_the_knobs_in() {
        let l = LayerNormSpec {
            arch: Arch::Sm90,
            dtype: DType::F32,
            cols: 768,
            threads_per_row: 32,
            vector: 4,
            rows_per_cta: 4,
            add: None,
            reads: RowReads::InTurn,
        };
        let text = render(&l).text;
        expect_test::expect_file!["../../../tests/golden/ln_f32_c768_t32_v4_r4.cu"]
            .assert_eq(&text);
        for line in [
            "using Element = float;",
            "using Vec = uint4;",
            "constexpr int kCols = 768;",
            "constexpr int kThreads = 32;",
            "constexpr int kRows = 4;",
        ] {
            assert!(text.contains(line), "{line}");
        }
        assert!(
            text.contains("fact_k_ln_f32_c768_t32_v4_r4_run") && !text.contains("cutlass"),
            "CUDA's own types"
        );
        let bf16 = render(&LayerNormSpec {
            dtype: DType::Bf16,
            vector: 8,
            ..l.clone()
        })
        .text;
        assert!(
            bf16.contains("using Element = __nv_bfloat16;")
                && bf16.contains("constexpr int kDtype = 1;")
        );
        let narrow = render(&LayerNormSpec {
            dtype: DType::F16,
            vector: 1,
            ..l.clone()
        })
        .text;
        assert!(
            narrow.contains("using Vec = unsigned short;")
                && narrow.contains("using Element = __half;")
        );
        // The dispatch table lists it as a layernorm kernel.
        let d = crate::kinds::render_dispatch(&[l.clone().into()]).text;
        assert!(
            d.contains(&format!(
                "{{\"{}\", \"layernorm\", \"x[R,C] out[R,C]",
                l.name()
            )) && d.contains(&format!("fact_k_{}_run", l.name()))
        );
        assert_eq!(crate::kinds::Spec::from(l.clone()).render(), render(&l));
    }

    #[test]
    fn reading_early_loads_the_weight_and_bias_with_the_row_and_streams_x() {
        let l = LayerNormSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            cols: 768,
            threads_per_row: 32,
            vector: 8,
            rows_per_cta: 4,
            add: None,
            reads: RowReads::EarlyStreamed,
        };
        assert_eq!(l.name(), "ln_bf16_c768_t32_v8_r4_es");
        let text = render(&l).text;
        expect_test::expect_file!["../../../tests/golden/ln_bf16_c768_t32_v8_r4_es.cu"]
            .assert_eq(&text);
        for line in [
            "load_row(xr + col, v[i]);",
            "if constexpr (kBias) load(bias + (i * kThreads + lane) * kVector, bsr[i]);",
            "const float(&b)[kVector] = bsr[i];",
            // x streamed; the weight and bias, read by every row, through the read-only path.
            "const Vec raw = __ldcs(reinterpret_cast<const Vec*>(p));",
            "const Vec raw = __ldg(reinterpret_cast<const Vec*>(p));",
        ] {
            assert!(text.contains(line), "{line}");
        }
        let in_turn = render(&LayerNormSpec {
            reads: RowReads::InTurn,
            ..l.clone()
        })
        .text;
        assert!(!in_turn.contains("load_row") && !in_turn.contains("__ldcs"));
    }

    #[test]
    fn an_add_kernel_is_golden_and_reads_both_operands() {
        use crate::rules::residual::AddDtypes;
        // BERT's and OPT's embeddings in bf16: the sum of two bf16 tensors, then the LayerNorm.
        let l = LayerNormSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            cols: 768,
            threads_per_row: 32,
            vector: 8,
            rows_per_cta: 4,
            add: Some(AddDtypes {
                a: DType::Bf16,
                b: DType::Bf16,
                sum: DType::Bf16,
            }),
            reads: RowReads::InTurn,
        };
        assert_eq!(l.name(), "ln_bf16_c768_t32_v8_r4_add");
        let text = render(&l).text;
        expect_test::expect_file!["../../../tests/golden/ln_bf16_c768_t32_v8_r4_add.cu"]
            .assert_eq(&text);
        for line in [
            "using ElementB = __nv_bfloat16;",
            "load_as(br + col, vb);",
            "a->num_tensors != 6",
        ] {
            assert!(text.contains(line), "{line}");
        }
        let d = crate::kinds::render_dispatch(&[l.into()]).text;
        assert!(
            d.contains("\"a[O,I,C] b[O,I,C] sum[R,C]? out[R,C] weight[C]? bias[C]?"),
            "{d}"
        );
    }
}
