//! Rotary's templates rendered: the kernel's translation unit (rotary.cu.hbs, CUDA's own types, no
//! CUTLASS) and its section of the torch op library (rotary_op.cpp.hbs: `fact::rotary`,
//! `fact::rotary_qk` and their fallback, the replaced nodes' own aten ops). Both templates live
//! in this folder. Pure, like every rendering: the same spec renders the same text.

use super::RotarySpec;
use crate::codegen::{self, OpCode, Source};
use crate::types::Arch;
use handlebars::Handlebars;
use serde_json::json;
use std::sync::OnceLock;

const KERNEL: &str = include_str!("rotary.cu.hbs");
const OP: &str = include_str!("rotary_op.cpp.hbs");

fn templates() -> &'static Handlebars<'static> {
    static R: OnceLock<Handlebars<'static>> = OnceLock::new();
    R.get_or_init(|| codegen::templates(&[], &[("rotary", KERNEL), ("op", OP)]))
}

/// The translation unit of one rotary kernel.
pub fn render(s: &RotarySpec) -> Source {
    let element = codegen::cuda_element(s.dtype);
    let vec_type = codegen::vector_type(&s.name(), s.vector * s.dtype.bytes() as u32);
    let vars = json!({
        "name": s.name(),
        "spec_json": serde_json::to_string(s).expect("spec serializes"),
        "form": s.form.name(),
        "pairs": s.form == super::Form::Pairs,
        "dtype": s.dtype.short_name(),
        "dtype_abi": codegen::dtype_abi(s.dtype),
        "element": element,
        "vec_type": vec_type,
        "head_dim": s.head_dim,
        "rotary": s.rotary_dim,
        "half": s.rotary_dim / 2,
        "vector": s.vector,
        "block": s.block,
        "per_thread": s.per_thread,
    });
    let text = templates()
        .render("rotary", &vars)
        .unwrap_or_else(|e| panic!("rendering {}: {e}", s.name()));
    Source {
        file_name: format!("{}.cu", s.name()),
        text,
    }
}

/// Rotary's section of the op library for `arch`.
pub fn op_code(arch: Arch) -> OpCode {
    OpCode {
        prelude: String::new(),
        body: templates()
            .render("op", &codegen::op_vars(arch))
            .expect("the rotary op renders"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{candidates, Form, RotaryProblem};
    use super::*;
    use crate::types::DType;

    #[test]
    fn rotary_render_is_golden_and_compiles_the_head_in() {
        let p =
            RotaryProblem::from_rule("rotary_halves_qk", &[4, 16, 4, 1024, 128, 128], DType::Bf16)
                .unwrap();
        let s = candidates(&p, Arch::Sm90).remove(0);
        let text = render(&s).text;
        expect_test::expect_file!["golden/rope_halves_bf16_d128_r128_v8_t256_u2.cu"]
            .assert_eq(&text);
        for line in [
            "using Element = __nv_bfloat16;",
            "using Vec = uint4;",
            "constexpr int kHeadDim = 128;",
            "constexpr int kRotary = 128;",
            "constexpr bool kPairs = false;",
            "constexpr int kPerThread = 2;",
        ] {
            assert!(text.contains(line), "{line}");
        }
        assert!(
            text.contains("fact_k_rope_halves_bf16_d128_r128_v8_t256_u2_run")
                && !text.contains("cutlass")
        );
        let pairs = render(&super::super::RotarySpec {
            form: Form::Pairs,
            dtype: DType::F32,
            vector: 2,
            rotary_dim: 64,
            ..s.clone()
        })
        .text;
        assert!(
            pairs.contains("constexpr bool kPairs = true;")
                && pairs.contains("using Vec = uint2;")
                && pairs.contains("rot(x)[2i] = -x[2i+1]")
        );
        // The dispatch table lists it as a rotary kernel.
        let d = crate::kinds::render_dispatch(&[s.clone().into()]).text;
        assert!(
            d.contains(&format!("{{\"{}\", \"rotary\", \"q[", s.name()))
                && d.contains(&format!("fact_k_{}_run", s.name())),
            "{d}"
        );
        assert_eq!(crate::kinds::Spec::from(s.clone()).render(), render(&s));
    }

    #[test]
    fn rotary_op_section_is_golden() {
        let body = op_code(Arch::Sm90).body;
        expect_test::expect_file!["golden/rotary_op.cpp"].assert_eq(&body);
        assert!(
            body.contains("disabled(kRotaryKind)") && body.contains("rotary_replay(q, cos, sin")
        );
    }
}
