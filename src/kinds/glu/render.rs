//! The GLU kind's templates rendered: the fused kernel's translation unit
//! (templates/sm90_glu.cu.hbs: the GEMM kind's sm90 mainloop under an epilogue collective of
//! fact's own), the split one (templates/glu_split.cu.hbs: the GEMM kind's kernel as it renders it,
//! then one elementwise kernel), and the kind's section of the torch op library
//! (templates/glu_op.cpp.hbs: `fact::glu` and its fallback, the graph's own ops). Pure: the same
//! spec renders the same text.

use super::spec::{Form, GluSpec};
use crate::codegen::{self, OpCode, Source};
use crate::kinds::gemm;
use crate::types::{Arch, DType};
use handlebars::Handlebars;
use serde_json::json;
use std::sync::OnceLock;

const FUSED: &str = include_str!("templates/sm90_glu.cu.hbs");
const SPLIT: &str = include_str!("templates/glu_split.cu.hbs");
const OP: &str = include_str!("templates/glu_op.cpp.hbs");

fn templates() -> &'static Handlebars<'static> {
    static R: OnceLock<Handlebars<'static>> = OnceLock::new();
    R.get_or_init(|| {
        codegen::templates(
            &[codegen::PER_DEVICE],
            &[("fused", FUSED), ("split", SPLIT), ("op", OP)],
        )
    })
}

/// The translation unit of one GLU kernel (launch knobs aside: every variant shares it).
pub fn render(s: &GluSpec) -> Source {
    let k = s.kernel();
    let g = &k.gemm;
    let element = match g.dtype {
        DType::Bf16 => "cutlass::bfloat16_t",
        DType::F16 => "cutlass::half_t",
        DType::F32 => "float",
    };
    let mut vars = json!({
        "name": k.kernel_name(),
        "spec_json": serde_json::to_string(&k).expect("spec serializes"),
        "act": k.act.short_name(),
        "act_expr": k.act.device_expr(),
        "element": element,
        "dtype_abi": codegen::dtype_abi(g.dtype),
        "bias": g.bias,
        "align": 16 / g.dtype.bytes(),
    });
    let extra = match k.glu {
        Form::Fused => json!({
            "tile_m": g.tile[0], "tile_n": g.tile[1], "tile_k": g.tile[2],
            "cluster_m": g.cluster[0], "cluster_n": g.cluster[1], "cluster_k": g.cluster[2],
            "stages": g.stages,
            "kernel_schedule": g.schedule.cutlass_tag(),
            "tile_scheduler": g.scheduler.cutlass_tag(),
        }),
        Form::Split => json!({
            "gemm": g.kernel_name(),
            "gemm_source": gemm::render::render(g).text,
        }),
    };
    vars.as_object_mut()
        .expect("object")
        .extend(extra.as_object().expect("object").clone());
    let template = match k.glu {
        Form::Fused => "fused",
        Form::Split => "split",
    };
    let text = templates()
        .render(template, &vars)
        .unwrap_or_else(|e| panic!("rendering {}: {e}", k.name()));
    Source {
        file_name: format!("{}.cu", k.kernel_name()),
        text,
    }
}

/// What the kernels' tensors are, by position.
pub const SIGNATURE: &str =
    "x[M,K] w[2I,K] (gate and up rows interleaved in blocks of 8) bias[2I]? (NULL data when absent) out[M,I]";

/// The GLU kind's section of the op library for `arch`.
pub fn op_code(arch: Arch) -> OpCode {
    OpCode {
        prelude: String::new(),
        body: templates()
            .render("op", &codegen::op_vars(arch))
            .expect("the glu op renders"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::problem::GluProblem;
    use super::super::spec::candidates;
    use super::*;

    fn first(form: Form, rule: &str) -> GluSpec {
        let p = GluProblem::from_rule(rule, &[4096, 5632, 2048], DType::Bf16).unwrap();
        candidates(&p, crate::types::MathType::Bf16, Arch::Sm90)
            .into_iter()
            .find(|s| s.glu == form)
            .expect("a candidate of the form")
    }

    #[test]
    fn fused_render_is_golden_and_pairs_gate_with_up() {
        let s = first(Form::Fused, "glu_silu");
        let text = render(&s).text;
        expect_test::expect_file!["../../../tests/golden/glu_fused.cu"].assert_eq(&text);
        assert!(text.contains(&format!("fact_k_{}_run", s.kernel_name())));
        assert!(text.contains("using Element = cutlass::bfloat16_t;"));
        assert!(text.contains("constexpr bool kBias = false;"));
        assert!(text.contains("return g / (1.0f + expf(-g));"));
        assert!(text.contains(s.gemm.schedule.cutlass_tag()));
        let gelu = render(&first(Form::Fused, "glu_gelu_tanh_bias")).text;
        assert!(gelu.contains("tanhf(") && gelu.contains("constexpr bool kBias = true;"));
        // The dispatch table lists it as a glu kernel.
        let d = crate::kinds::render_dispatch(&[s.clone().into()]).text;
        assert!(
            d.contains(&format!("{{\"{}\", \"glu\", \"x[M,K] w[2I,K]", s.name())),
            "{d}"
        );
    }

    #[test]
    fn split_render_is_golden_and_holds_the_gemm_kinds_kernel() {
        let s = first(Form::Split, "glu_gelu");
        let text = render(&s).text;
        expect_test::expect_file!["../../../tests/golden/glu_split.cu"].assert_eq(&text);
        let gemm = gemm::render::render(&s.gemm).text;
        assert!(
            text.contains(&gemm),
            "the GEMM's unit as the GEMM kind renders it"
        );
        assert!(text.contains(&format!("fact_k_{}_run(&gemm", s.gemm.kernel_name())));
        assert!(text.contains("erff("));
    }

    #[test]
    fn op_section_replays_the_graphs_ops() {
        let body = op_code(Arch::Sm90).body;
        for call in [
            "at::silu(g)",
            "at::gelu(g, \"tanh\")",
            "at::linear(x, w_gate, b_gate)",
            "count_fell_back(fell_back_as(run, kernel), why)",
        ] {
            assert!(body.contains(call), "{call}");
        }
    }
}
