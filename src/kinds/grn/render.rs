//! GRN's templates rendered, both in this folder: the kernel's translation unit (grn.cu.hbs,
//! CUDA's own types, no CUTLASS) and its section of the torch op library (grn_op.cpp.hbs:
//! `fact::grn` and its fallback, which replays the replaced ops). Pure, like every rendering: the
//! same spec renders the same text.

use super::GrnSpec;
use crate::codegen::{self, OpCode, Source};
use crate::types::Arch;
use handlebars::Handlebars;
use serde_json::json;
use std::sync::OnceLock;

const KERNEL: &str = include_str!("grn.cu.hbs");
const OP: &str = include_str!("grn_op.cpp.hbs");

fn templates() -> &'static Handlebars<'static> {
    static R: OnceLock<Handlebars<'static>> = OnceLock::new();
    R.get_or_init(|| codegen::templates(&[], &[("grn", KERNEL), ("op", OP)]))
}

/// The translation unit of one GRN kernel.
pub fn render(s: &GrnSpec) -> Source {
    let vars = json!({
        "name": s.name(),
        "spec_json": serde_json::to_string(s).expect("spec serializes"),
        "dtype": s.dtype.short_name(),
        "dtype_abi": codegen::dtype_abi(s.dtype),
        "element": codegen::cuda_element(s.dtype),
        "vec_type": codegen::vector_type(&s.name(), s.vector * s.dtype.bytes() as u32),
        "vector": s.vector,
        "sum_rows": s.sum_rows,
    });
    let text = templates()
        .render("grn", &vars)
        .unwrap_or_else(|e| panic!("rendering {}: {e}", s.name()));
    Source {
        file_name: format!("{}.cu", s.name()),
        text,
    }
}

/// GRN's section of the op library for `arch`.
pub fn op_code(arch: Arch) -> OpCode {
    OpCode {
        prelude: String::new(),
        body: templates()
            .render("op", &codegen::op_vars(arch))
            .expect("the grn op renders"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    #[test]
    fn grn_render_is_golden_and_compiles_the_knobs_in() {
        let s = GrnSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            vector: 8,
            sum_rows: 8,
        };
        let text = render(&s).text;
        expect_test::expect_file!["../../../tests/golden/grn_bf16_v8_s8.cu"].assert_eq(&text);
        for line in [
            "using Element = __nv_bfloat16;",
            "using Vec = uint4;",
            "constexpr int kVector = 8;",
            "constexpr int kSumRows = 8;",
            "constexpr int kDtype = 1;",
        ] {
            assert!(text.contains(line), "{line}");
        }
        assert!(text.contains("fact_k_grn_bf16_v8_s8_workspace_size") && !text.contains("cutlass"));
        let narrow = render(&GrnSpec {
            dtype: DType::F32,
            vector: 2,
            sum_rows: 4,
            ..s
        })
        .text;
        assert!(narrow.contains("using Vec = uint2;") && narrow.contains("using Element = float;"));
        let op = op_code(Arch::Sm90).body;
        assert!(
            op.contains("if (!disabled(kGrnKind))") && op.contains("at::addcmul(bias, weight, t)")
        );
    }
}
