//! Renders kernel libraries from the handlebars templates in templates/: one translation unit per
//! kernel, the dispatch table, and the torch op. Pure: the same specs render byte-identical source,
//! and nothing here touches the disk or the GPU (templates are compiled into the binary).

use crate::space::KernelSpec;
use handlebars::Handlebars;
use serde_json::json;
use std::sync::OnceLock;

const SM90_GEMM: &str = include_str!("../../templates/sm90_gemm.cu.hbs");
const DISPATCH: &str = include_str!("../../templates/dispatch.cu.hbs");
const TORCH_OP: &str = include_str!("../../templates/torch_op.cpp.hbs");

fn registry() -> &'static Handlebars<'static> {
    static R: OnceLock<Handlebars<'static>> = OnceLock::new();
    R.get_or_init(|| {
        let mut h = Handlebars::new();
        h.set_strict_mode(true);
        h.register_escape_fn(handlebars::no_escape);
        for (name, text) in [("sm90_gemm", SM90_GEMM), ("dispatch", DISPATCH), ("torch_op", TORCH_OP)] {
            h.register_template_string(name, text).unwrap_or_else(|e| panic!("template {name}: {e}"));
        }
        h
    })
}

/// A rendered source file, named for the build.
#[derive(Clone, Debug, PartialEq)]
pub struct Source {
    pub file_name: String,
    pub text: String,
}

fn kernel_vars(k: &KernelSpec) -> serde_json::Value {
    json!({
        "name": k.name(),
        "spec_json": k.to_json(),
        "element": k.dtype.cutlass_tag(),
        "dtype": k.dtype.short_name(),
        "layout": k.layout.short_name(),
        "cutlass_layout_a": k.layout.cutlass_layout_a(),
        "align": k.align,
        "tile_m": k.tile[0], "tile_n": k.tile[1], "tile_k": k.tile[2],
        "cluster_m": k.cluster[0], "cluster_n": k.cluster[1], "cluster_k": k.cluster[2],
        "kernel_schedule": k.schedule.cutlass_tag(),
        "epilogue_schedule": k.schedule.epilogue_tag(),
        "tile_scheduler": k.scheduler.cutlass_tag(),
        "bias": k.bias,
    })
}

/// The translation unit of one kernel.
pub fn render_kernel(k: &KernelSpec) -> Source {
    let text = registry()
        .render(k.family.template(), &kernel_vars(k))
        .unwrap_or_else(|e| panic!("rendering {}: {e}", k.name()));
    Source { file_name: format!("{}.cu", k.name()), text }
}

/// The dispatch table over `kernels`, in the given order (index = position).
pub fn render_dispatch(kernels: &[KernelSpec]) -> Source {
    let vars: Vec<_> = kernels.iter().map(kernel_vars).collect();
    let text = registry().render("dispatch", &json!({ "kernels": vars, "count": kernels.len() })).expect("dispatch renders");
    Source { file_name: "fact_dispatch.cu".into(), text }
}

/// The torch op wrapper; it is the same for every library of one arch.
pub fn render_torch_op(arch: crate::types::Arch) -> Source {
    let (major, minor) = match arch {
        crate::types::Arch::Sm90 => (9, 0),
    };
    let text = registry()
        .render(
            "torch_op",
            &json!({
                "arch": arch.short_name(),
                "cc_major": major,
                "cc_minor": minor,
                "gemm_schema": crate::torch::GEMM_OP_SCHEMA,
            }),
        )
        .expect("torch op renders");
    Source { file_name: "fact_torch_op.cpp".into(), text }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{GemmLayout, GemmProblem};
    use crate::space::gemm_candidates;
    use crate::types::{Arch, DType, MathType};

    fn spec(bias: bool) -> KernelSpec {
        let p = GemmProblem { m: 4096, n: 4096, k: 4096, layout: GemmLayout::Rcr, dtype: DType::F32, bias, batch: 1 };
        gemm_candidates(&p, MathType::Tf32, Arch::Sm90)
            .into_iter()
            .find(|k| k.tile == [128, 256, 32])
            .unwrap()
    }

    #[test]
    fn kernel_render_is_deterministic_and_golden() {
        let a = render_kernel(&spec(true));
        assert_eq!(a, render_kernel(&spec(true)));
        expect_test::expect_file!["../../tests/golden/sm90_gemm_rcr_tf32_bias.cu"].assert_eq(&a.text);
    }

    #[test]
    fn dispatch_render_is_golden() {
        let d = render_dispatch(&[spec(true), spec(false)]);
        expect_test::expect_file!["../../tests/golden/fact_dispatch.cu"].assert_eq(&d.text);
    }

    #[test]
    fn torch_op_render_is_golden() {
        expect_test::expect_file!["../../tests/golden/fact_torch_op.cpp"].assert_eq(&render_torch_op(Arch::Sm90).text);
    }

    #[test]
    fn generated_files_say_where_they_come_from() {
        let k = render_kernel(&spec(false));
        assert!(k.text.starts_with("// generated from templates/sm90_gemm.cu.hbs; do not edit\n// spec: {"));
        assert!(k.text.contains(&format!("fact_k_{}_run", spec(false).name())));
        assert!(!k.text.contains("LinCombPerRowBias"), "no bias epilogue without bias");
    }
}
