//! RMSNorm's templates rendered, both in this folder: the kernel's translation unit
//! (rmsnorm.cu.hbs, CUDA's own types, no CUTLASS) and its section of the torch op library
//! (rmsnorm_op.cpp.hbs: `fact::rmsnorm` and its fallback, which replays the replaced ops). Pure,
//! like every rendering: the same spec renders the same text.

use super::RmsNormSpec;
use crate::codegen::{self, OpCode, Source};
use crate::types::Arch;
use handlebars::Handlebars;
use serde_json::json;
use std::sync::OnceLock;

const KERNEL: &str = include_str!("rmsnorm.cu.hbs");
const OP: &str = include_str!("rmsnorm_op.cpp.hbs");

fn templates() -> &'static Handlebars<'static> {
    static R: OnceLock<Handlebars<'static>> = OnceLock::new();
    R.get_or_init(|| {
        codegen::templates(&[codegen::RESIDUAL_ADD], &[("rmsnorm", KERNEL), ("op", OP)])
    })
}

/// The translation unit of one RMSNorm kernel.
pub fn render(s: &RmsNormSpec) -> Source {
    let element = codegen::cuda_element(s.dtype);
    let vec_type = codegen::vector_type(&s.name(), s.vector * s.dtype.bytes() as u32);
    let mut vars = json!({
        "name": s.name(),
        "spec_json": serde_json::to_string(s).expect("spec serializes"),
        "dtype": s.dtype.short_name(),
        "dtype_abi": codegen::dtype_abi(s.dtype),
        "element": element,
        "vec_type": vec_type,
        "cols": s.cols,
        "threads": s.threads,
        "vector": s.vector,
        "rows": s.rows_per_block,
        "loads": s.loads(),
        "add": s.add.is_some(),
        // Loads first, operands streamed (RowReads::EarlyStreamed).
        "early": !s.reads.is_in_turn(),
    });
    if let Some(add) = s.add {
        for (key, d) in [("a", add.a), ("b", add.b), ("sum", add.sum)] {
            vars[format!("{key}_dtype")] = json!(d.short_name());
            vars[format!("{key}_element")] = json!(codegen::cuda_element(d));
            vars[format!("{key}_abi")] = json!(codegen::dtype_abi(d));
        }
    }
    let text = templates()
        .render("rmsnorm", &vars)
        .unwrap_or_else(|e| panic!("rendering {}: {e}", s.name()));
    Source {
        file_name: format!("{}.cu", s.name()),
        text,
    }
}

/// RMSNorm's section of the op library for `arch`.
pub fn op_code(arch: Arch) -> OpCode {
    OpCode {
        prelude: String::new(),
        body: templates()
            .render("op", &codegen::op_vars(arch))
            .expect("the rmsnorm op renders"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::rows::RowReads;
    use crate::types::DType;

    fn llama() -> RmsNormSpec {
        RmsNormSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            cols: 2048,
            threads: 128,
            vector: 8,
            rows_per_block: 2,
            add: None,
            reads: RowReads::InTurn,
        }
    }

    #[test]
    fn rmsnorm_render_is_golden_and_compiles_c_and_the_knobs_in() {
        let s = llama();
        let text = render(&s).text;
        expect_test::expect_file!["golden/rms_bf16_c2048_t128_v8_r2.cu"].assert_eq(&text);
        for line in [
            "using Element = __nv_bfloat16;",
            "using Vec = uint4;",
            "constexpr int kCols = 2048;",
            "constexpr int kThreads = 128;",
            "constexpr int kRows = 2;",
            "constexpr int kDtype = 1;",
        ] {
            assert!(text.contains(line), "{line}");
        }
        assert!(
            text.contains("fact_k_rms_bf16_c2048_t128_v8_r2_run") && !text.contains("cutlass"),
            "CUDA's own types"
        );
        let narrow = render(&RmsNormSpec {
            dtype: DType::F32,
            vector: 2,
            ..s.clone()
        })
        .text;
        assert!(narrow.contains("using Vec = uint2;") && narrow.contains("using Element = float;"));
        // The dispatch table lists it as an rmsnorm kernel.
        let d = crate::kinds::render_dispatch(&[s.clone().into()]).text;
        assert!(
            d.contains(&format!(
                "{{\"{}\", \"rmsnorm\", \"x[R,C] out[R,C]",
                s.name()
            )) && d.contains(&format!("fact_k_{}_run", s.name())),
            "{d}"
        );
        assert_eq!(crate::kinds::Spec::from(s.clone()).render(), render(&s));
    }

    #[test]
    fn an_add_kernel_reads_both_operands_and_rounds_where_the_graph_does() {
        use crate::rules::residual::AddDtypes;
        let s = RmsNormSpec {
            add: Some(AddDtypes {
                a: DType::Bf16,
                b: DType::Bf16,
                sum: DType::Bf16,
            }),
            ..llama()
        };
        assert_eq!(s.name(), "rms_bf16_c2048_t128_v8_r2_add");
        let text = render(&s).text;
        expect_test::expect_file!["golden/rms_bf16_c2048_t128_v8_r2_add.cu"].assert_eq(&text);
        for line in [
            "using ElementA = __nv_bfloat16;",
            "using ElementS = __nv_bfloat16;",
            "constexpr int kDtypeS = 1;",
            "if (sr != nullptr) store_as(sr + col, s);",
            "a->num_tensors != 5",
        ] {
            assert!(text.contains(line), "{line}");
        }
        // An fp32 residual stream before a bf16 norm: its own name and element types.
        let mixed = RmsNormSpec {
            add: Some(AddDtypes {
                a: DType::F32,
                b: DType::Bf16,
                sum: DType::F32,
            }),
            ..llama()
        };
        assert_eq!(mixed.name(), "rms_bf16_c2048_t128_v8_r2_add_f32_bf16_f32");
        let text = render(&mixed).text;
        for line in [
            "using ElementA = float;",
            "using ElementB = __nv_bfloat16;",
            "using ElementS = float;",
            "using Element = __nv_bfloat16;",
        ] {
            assert!(text.contains(line), "{line}");
        }
        let d = crate::kinds::render_dispatch(&[mixed.into()]).text;
        assert!(d.contains("\"a[O,I,C] b[O,I,C] sum[R,C]? out[R,C]"), "{d}");
    }

    #[test]
    fn reading_early_loads_the_weight_with_the_row_and_streams_only_the_operands() {
        use crate::rules::residual::AddDtypes;
        let add = RmsNormSpec {
            add: Some(AddDtypes {
                a: DType::Bf16,
                b: DType::Bf16,
                sum: DType::Bf16,
            }),
            reads: RowReads::EarlyStreamed,
            ..llama()
        };
        assert_eq!(add.name(), "rms_bf16_c2048_t128_v8_r2_es_add");
        let text = render(&add).text;
        expect_test::expect_file!["golden/rms_bf16_c2048_t128_v8_r2_es_add.cu"].assert_eq(&text);
        for line in [
            "const ElementA* ar = a + row_at_early(a_rows, live ? row : 0);",
            "const A raw = __ldcs(reinterpret_cast<const A*>(p) + c);",
            "const float(&w)[kVector] = wr[i];",
        ] {
            assert!(text.contains(line), "{line}");
        }
        // The weight, read by every row, keeps the read-only path.
        assert!(text.contains("const Vec raw = __ldg(reinterpret_cast<const Vec*>(p));"));
        let plain = render(&RmsNormSpec {
            reads: RowReads::EarlyStreamed,
            ..llama()
        })
        .text;
        assert!(plain.contains("load_row(xr + col, v[i]);"));
        let in_turn = render(&llama()).text;
        assert!(!in_turn.contains("load_row") && !in_turn.contains("__ldcs"));
    }

    #[test]
    fn the_op_section_is_golden_and_replays_every_form() {
        let body = op_code(Arch::Sm90).body;
        expect_test::expect_file!["golden/rmsnorm_op_sm90.cpp"].assert_eq(&body);
        for form in [
            "\"rms_norm\"",
            "\"rmsnorm_weight\"",
            "\"rmsnorm_cast_weight\"",
            "\"rmsnorm_weight1p\"",
            "\"rmsnorm\"",
        ] {
            assert!(body.contains(form), "{form}");
        }
        assert!(
            body.contains("at::rms_norm_symint(x, c10::SymDimVector{x.sym_size(-1)}, weight, eps)")
        );
        assert!(body.contains("compute capability 9.0"));
        assert!(op_code(Arch::Sm80).body.contains("an sm80 library"));
    }
}
