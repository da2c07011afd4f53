//! Rendering a GEMM kernel's translation unit from its spec (templates/sm90_gemm.cu.hbs,
//! sm80_gemm.cu.hbs, sm90_gemm_x3.cu.hbs and their partials), its dispatch signature, and the
//! GEMM kind's section of the torch op library (`fact::gemm`, `fact::gemm_ep`).

use super::epilogue::Transcendentals;
use super::KernelSpec;
use crate::codegen::{dtype_abi, templates, unit_of, OpCode, Source};
use crate::types::Arch;
use handlebars::Handlebars;
use serde_json::json;
use std::sync::OnceLock;

const SM90_GEMM: &str = include_str!("templates/sm90_gemm.cu.hbs");
const SM80_GEMM: &str = include_str!("templates/sm80_gemm.cu.hbs");
const SM90_GEMM_X3: &str = include_str!("templates/sm90_gemm_x3.cu.hbs");
const SM90_GEMM_CORE: &str = include_str!("templates/sm90_gemm_core.hbs");
const SM90_GEMM_TYPES: &str = include_str!("templates/sm90_gemm_types.hbs");
const FUSED_EPILOGUE: &str = include_str!("templates/fused_epilogue.hbs");
const GEMM_CALL: &str = include_str!("templates/gemm_call.hbs");

fn registry() -> &'static Handlebars<'static> {
    static R: OnceLock<Handlebars<'static>> = OnceLock::new();
    R.get_or_init(|| {
        templates(
            &[
                ("sm90_gemm_core", SM90_GEMM_CORE),
                ("sm90_gemm_types", SM90_GEMM_TYPES),
                ("fused_epilogue", FUSED_EPILOGUE),
                ("gemm_call", GEMM_CALL),
                crate::codegen::PER_DEVICE,
            ],
            &[
                ("sm90_gemm", SM90_GEMM),
                ("sm80_gemm", SM80_GEMM),
                ("sm90_gemm_x3", SM90_GEMM_X3),
            ],
        )
    })
}

fn kernel_vars(v: &KernelSpec) -> serde_json::Value {
    // The kernel is rendered from its spec without launch knobs, so every variant of it shares
    // one source text, one object and one symbol.
    let k = v.kernel();
    let [im, inn, ik] = k.instruction();
    let math_op = match k.math {
        crate::types::MathType::Tf32x3 => "cutlass::arch::OpMultiplyAddFastF32",
        _ => "cutlass::arch::OpMultiplyAdd",
    };
    let epilogue_schedule = match k.epilogue {
        crate::kinds::gemm::space::EpilogueKind::Tma => k.schedule.epilogue_tag(),
        crate::kinds::gemm::space::EpilogueKind::NoSmem => {
            "cutlass::epilogue::NoSmemWarpSpecialized"
        }
    };
    let warp = |i: usize| k.tile[i].checked_div(k.warps[i]).unwrap_or(0);
    // The tf32 split writes torch's b K-major (transposing an rrr b), so both WGMMA GEMMs read
    // their operands from shared memory; the bf16 split keeps the layout.
    let tf32_split = k.family == crate::kinds::gemm::space::Family::Sm90GemmX3;
    let bf16_split = k.family == crate::kinds::gemm::space::Family::Sm90GemmBf16x3;
    let cutlass_layout_a = if tf32_split {
        crate::kinds::gemm::GemmLayout::Rcr.cutlass_layout_a()
    } else {
        k.layout.cutlass_layout_a()
    };
    json!({
        "name": k.kernel_name(),
        "spec_json": k.to_json(),
        "element": if bf16_split { "cutlass::bfloat16_t" } else { k.dtype.cutlass_tag() },
        "element_out": k.dtype.cutlass_tag(),
        // A padded split's GEMMs read aligned parts and write an aligned output (a workspace
        // when torch's output is not).
        "align_out": if k.is_padded_split() { 16 / k.dtype.bytes() as u32 } else { k.align_out() },
        "padded": k.is_padded_split(),
        "k_parts": if k.is_padded_split() { "kp" } else { "k" },
        "n_parts": if k.is_padded_split() { "np" } else { "n" },
        "out_expr": if k.is_padded_split() { "out" } else { "p.out" },
        "b_n_major": k.layout.b() == crate::kinds::gemm::Major::Row && !tf32_split,
        "bf16_split": bf16_split,
        "transpose_b": tf32_split && k.layout == crate::kinds::gemm::GemmLayout::Rrr,
        "b_k_major": k.layout.b() == crate::kinds::gemm::Major::Col,
        "dtype": k.dtype.short_name(),
        "layout": k.layout.short_name(),
        "cutlass_layout_a": cutlass_layout_a,
        "cutlass_layout_b": k.layout.cutlass_layout_b(),
        // Whether CUTLASS's A (torch's Bᵀ) and B (torch's aᵀ) are row-major: K-contiguous for A,
        // N-contiguous (torch's M) for B.
        "a_row_major": k.layout.b() == crate::kinds::gemm::Major::Col,
        "b_row_major": k.layout.a() == crate::kinds::gemm::Major::Col,
        "align": k.gemm_align(),
        "tile_m": k.tile[0], "tile_n": k.tile[1], "tile_k": k.tile[2],
        "cluster_m": k.cluster[0], "cluster_n": k.cluster[1], "cluster_k": k.cluster[2],
        "warp_m": warp(0), "warp_n": warp(1),
        "inst_m": im, "inst_n": inn, "inst_k": ik,
        "stages": k.stages,
        "math_op": math_op,
        "kernel_schedule": k.schedule.cutlass_tag(),
        "epilogue_schedule": epilogue_schedule,
        "tile_scheduler": k.scheduler.cutlass_tag(),
        "stream_k": k.scheduler == crate::kinds::gemm::space::TileScheduler::StreamK,
        "bias": k.bias,
        "c_operand": k.family.is_split(),
    })
    .as_object()
    .cloned()
    .map(|mut o| {
        o.extend(call_vars(&k));
        o.extend(if k.family == crate::kinds::gemm::space::Family::Sm80Gemm {
            sm80_fusion_vars(&k)
        } else {
            fusion_vars(&k)
        });
        serde_json::Value::Object(o)
    })
    .expect("kernel vars are an object")
}

/// The call as templates/gemm_call.hbs reads it from the ABI: the dtype, how torch's operands
/// lie, and the epilogue's leaves by kind (the enumerators of its `Leaf`, in the program's order).
fn call_vars(k: &KernelSpec) -> serde_json::Map<String, serde_json::Value> {
    use super::{LeafKind, Major};
    let leaf_kinds: Vec<&str> = k
        .fusion
        .iter()
        .flat_map(|e| &e.leaves)
        .map(|l| match l {
            LeafKind::Full => "Full",
            LeafKind::Row => "Row",
            LeafKind::Col => "Col",
            LeafKind::Scalar => "Scalar",
        })
        .collect();
    json!({
        "dtype_abi": dtype_abi(k.dtype),
        "a_row": k.layout.a() == Major::Row,
        "b_row": k.layout.b() == Major::Row,
        "leaf_count": leaf_kinds.len(),
        "leaf_kinds": leaf_kinds,
    })
    .as_object()
    .cloned()
    .expect("object")
}

/// The fused functor's body: one fp32 line per program value, `v0` from `v0_expr`.
fn program_lines(
    e: &crate::kinds::gemm::Epilogue,
    v0_expr: &str,
    f: Transcendentals,
) -> Vec<String> {
    use crate::kinds::gemm::epilogue::Arg;
    let mut lines = vec![format!("const float v0 = {v0_expr};")];
    for (n, ins) in e.instrs.iter().enumerate() {
        let operands: Vec<String> = ins
            .args
            .iter()
            .map(|a| match a {
                Arg::Value(v) => format!("v{v}"),
                Arg::Leaf(l) => format!("l{l}[i]"),
                Arg::Scalar(s) => s.device_literal(),
            })
            .collect();
        let scalars: Vec<Option<f64>> = ins
            .args
            .iter()
            .map(|a| {
                if let Arg::Scalar(s) = a {
                    Some(s.0)
                } else {
                    None
                }
            })
            .collect();
        lines.push(format!(
            "const float v{} = {};",
            n + 1,
            ins.op.device_expr(&operands, &scalars, f)
        ));
    }
    lines
}

/// The Sm80EVT visitor tree of an sm80 kernel's fused epilogue: one compute node (the same fp32
/// functor as sm90's) over the accumulator, the bias and the leaves, stored by an aux-store node.
/// The tree runs on torch's row-major problem out[m,n] (the one the unfused kernels' column-major
/// GemmUniversal transposes back into), so torch's n is the problem's N: the bias and row leaves
/// are row broadcasts, col leaves column broadcasts, and each full leaf (a residual) is an aux
/// load with the output's strides; sm80 has no C source, and one aux load per full leaf.
fn sm80_fusion_vars(k: &KernelSpec) -> serde_json::Map<String, serde_json::Value> {
    use crate::kinds::gemm::epilogue::LeafKind;
    let Some(e) = &k.fusion else {
        return json!({ "fusion": false })
            .as_object()
            .cloned()
            .expect("object");
    };
    let row = "cutlass::epilogue::threadblock::VisitorRowBroadcast<OutputTileThreadMap, Element, Stride<_0, _1, int64_t>>";
    let mut params = vec!["T const& acc".to_string()];
    let mut children = Vec::new();
    let mut child_args = Vec::new();
    if k.bias {
        params.push("T const& bias".into());
        children.push(row.to_string());
        child_args.push("{static_cast<const Element*>(p.bias), Element(0), {}}".to_string());
    }
    for (i, leaf) in e.leaves.iter().enumerate() {
        params.push(format!("T const& l{i}"));
        let ptr = |ty: &str| format!("static_cast<{ty}*>(p.leaves[{i}])");
        let (child, arg) = match leaf {
            LeafKind::Row => (row.to_string(), format!("{{{}, Element(0), {{}}}}", ptr("const Element"))),
            LeafKind::Col => (
                "cutlass::epilogue::threadblock::VisitorColBroadcast<OutputTileThreadMap, Element, Stride<_1, _0, int64_t>>".to_string(),
                format!("{{{}, Element(0), {{}}}}", ptr("const Element")),
            ),
            LeafKind::Scalar => (
                "cutlass::epilogue::threadblock::VisitorScalarBroadcast<ElementCompute>".to_string(),
                format!("{{{{ElementCompute(0)}}, {{{}}}, {{}}}}", ptr("const ElementCompute")),
            ),
            // VisitorAuxLoad's pointer is not const; the kernel only reads it.
            LeafKind::Full => (
                "cutlass::epilogue::threadblock::VisitorAuxLoad<OutputTileThreadMap, Element, Stride<int64_t, _1, int64_t>>".to_string(),
                format!("{{const_cast<Element*>({}), Element(0), {{int64_t(N), _1{{}}, mn}}}}", ptr("const Element")),
            ),
        };
        children.push(child);
        child_args.push(arg);
    }
    let v0 = ["acc[i]", if k.bias { " + bias[i]" } else { "" }].concat();
    json!({
        "fusion": true,
        "fusion_text": e.text(),
        "fusion_params": params.join(", "),
        "fusion_lines": program_lines(e, &v0, Transcendentals::for_math(k.math)),
        "fusion_out": format!("v{}", e.instrs.len()),
        "fusion_children": children,
        "fusion_child_args": child_args,
        // torch's operands as the row-major problem reads them.
        "layout_a": if k.layout.a() == crate::kinds::gemm::Major::Row { "cutlass::layout::RowMajor" } else { "cutlass::layout::ColumnMajor" },
        "layout_b": if k.layout.b() == crate::kinds::gemm::Major::Row { "cutlass::layout::RowMajor" } else { "cutlass::layout::ColumnMajor" },
    })
    .as_object()
    .cloned()
    .expect("object")
}

/// The visitor tree of a fused epilogue: the functor's body (one fp32 line per program value),
/// its inputs as the compute node's children, and their runtime arguments from the kernel's call
/// (templates/gemm_call.hbs).
fn fusion_vars(k: &KernelSpec) -> serde_json::Map<String, serde_json::Value> {
    use crate::kinds::gemm::epilogue::LeafKind;
    use crate::kinds::gemm::space::LeafRead;
    // The split families add their first GEMM's result (read as C) and the bias in the second
    // GEMM's epilogue: a visitor tree even without an epilogue program.
    let split = k.family.is_split() && (k.bias || k.fusion.is_some());
    let empty = crate::kinds::gemm::Epilogue {
        leaves: vec![],
        instrs: vec![],
    };
    let e = match &k.fusion {
        Some(e) => e,
        None if split => &empty,
        None => {
            return json!({ "fusion": false, "two_gemms": false })
                .as_object()
                .cloned()
                .expect("object")
        }
    };
    let col_broadcast = "cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, ElementD, ElementCompute, Stride<_1, _0, int64_t>, AlignmentD>";
    let mut params = vec!["T const& acc".to_string()];
    let mut children = Vec::new();
    let mut child_args = Vec::new();
    let (mut element_c, mut c_pointer) = ("void", "nullptr".to_string());
    if split {
        params.push("T const& c".into());
        children.push("cutlass::epilogue::fusion::Sm90SrcFetch<ElementD>".to_string());
        child_args.push("{}".to_string());
        element_c = "ElementD";
        c_pointer = format!(
            "static_cast<const ElementD*>({})",
            if k.is_padded_split() { "out" } else { "p.out" }
        );
    }
    if k.bias {
        params.push("T const& bias".into());
        children.push(col_broadcast.to_string());
        child_args.push("{static_cast<const ElementD*>(p.bias), ElementD(0), {}}".to_string());
    }
    let reads = k.leaf_reads();
    for (i, leaf) in e.leaves.iter().enumerate() {
        params.push(format!("T const& l{i}"));
        let ptr = |ty: &str| format!("static_cast<const {ty}*>(p.leaves[{i}])");
        // torch's rows are the CUTLASS problem's columns: a per-n vector is a column broadcast.
        let (child, arg) = match leaf {
            LeafKind::Row => (col_broadcast.to_string(), format!("{{{}, ElementD(0), {{}}}}", ptr("ElementD"))),
            LeafKind::Col => (
                "cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, ElementD, ElementCompute, Stride<_0, _1, int64_t>, AlignmentD>".to_string(),
                format!("{{{}, ElementD(0), {{}}}}", ptr("ElementD")),
            ),
            LeafKind::Scalar => (
                "cutlass::epilogue::fusion::Sm90ScalarBroadcast<ElementCompute, Stride<_0, _0, int64_t>>".to_string(),
                format!("{{{{ElementCompute(0)}}, {{{}}}, {{}}}}", ptr("ElementCompute")),
            ),
            LeafKind::Full if reads[i] == Some(LeafRead::C) => {
                element_c = "ElementD";
                c_pointer = ptr("ElementD");
                ("cutlass::epilogue::fusion::Sm90SrcFetch<ElementD>".to_string(), "{}".to_string())
            }
            LeafKind::Full => ("AuxLoad".to_string(), format!("{{{}, ElementAux(0), stride_aux}}", ptr("ElementAux"))),
        };
        children.push(child);
        child_args.push(arg);
    }
    let v0 = [
        "acc[i]",
        if split { " + c[i]" } else { "" },
        if k.bias { " + bias[i]" } else { "" },
    ]
    .concat();
    let lines = program_lines(e, &v0, Transcendentals::for_math(k.math));
    json!({
        "fusion": true,
        "two_gemms": split,
        "fusion_text": if e.instrs.is_empty() { "the bias".to_string() } else { e.text() },
        "fusion_params": params.join(", "),
        "fusion_lines": lines,
        "fusion_out": format!("v{}", e.instrs.len()),
        "fusion_children": children,
        "fusion_child_args": child_args,
        "aux_loads": k.aux_loads() > 0,
        "element_c": element_c,
        "c_pointer": c_pointer,
    })
    .as_object()
    .cloned()
    .expect("object")
}

/// The translation unit of one kernel.
pub fn render(k: &KernelSpec) -> Source {
    let text = registry()
        .render(k.family.template(), &kernel_vars(k))
        .unwrap_or_else(|e| panic!("rendering {}: {e}", k.kernel_name()));
    Source {
        file_name: format!("{}.cu", k.kernel_name()),
        text,
    }
}

/// One translation unit holding several kernels (each in its own namespace), so a sweep builds
/// as one unit per core rather than one per kernel. Named for its contents.
pub fn render_unit(kernels: &[KernelSpec]) -> Source {
    let sources: Vec<Source> = kernels.iter().map(render).collect();
    unit_of(&sources.iter().collect::<Vec<_>>())
}

/// What a GEMM kernel's tensors are, by position (FactKernelInfo::signature).
pub fn signature(k: &KernelSpec) -> String {
    use super::{LeafKind, Major};
    let a = match k.layout.a() {
        Major::Row => "a[L,M,K]",
        Major::Col => "a[L,M,K] (stored [L,K,M])",
    };
    let b = match k.layout.b() {
        Major::Row => "b[L,K,N]",
        Major::Col => "b[L,K,N] (stored [L,N,K])",
    };
    let bias = if k.bias {
        "bias[N]"
    } else {
        "bias (NULL data)"
    };
    let leaves = k.fusion.iter().flat_map(|e| &e.leaves).map(|l| match l {
        LeafKind::Full => "full[L,M,N]",
        LeafKind::Row => "row[N]",
        LeafKind::Col => "col[M]",
        LeafKind::Scalar => "scalar f32[1]",
    });
    let tensors: Vec<&str> = [a, b, bias]
        .into_iter()
        .chain(leaves)
        .chain(["out[L,M,N]"])
        .collect();
    format!("{}; no scalars", tensors.join(" "))
}

const OP: &str = include_str!("templates/gemm_op.cpp.hbs");

/// The kind's section of the op library.
pub fn op_code(arch: Arch) -> OpCode {
    static R: OnceLock<Handlebars<'static>> = OnceLock::new();
    OpCode {
        prelude: String::new(),
        body: R
            .get_or_init(|| templates(&[], &[("op", OP)]))
            .render("op", &crate::codegen::op_vars(arch))
            .expect("the gemm op renders"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::gemm::space::{EpilogueKind, KernelSchedule, Knowledge, TileScheduler};
    use crate::kinds::gemm::{GemmLayout, GemmProblem};
    use crate::types::{Arch, DType, MathType};

    fn spec(bias: bool) -> KernelSpec {
        let p = GemmProblem {
            m: 4096,
            n: 4096,
            k: 4096,
            layout: GemmLayout::Rcr,
            dtype: DType::F32,
            bias,
            batch: 1,
            epilogue: None,
            padded_from: None,
        };
        Knowledge::shipped()
            .kernels(&p, MathType::Tf32, Arch::Sm90)
            .into_iter()
            .find(|k| {
                k.tile == [128, 128, 32]
                    && k.cluster == [1, 2, 1]
                    && k.schedule == KernelSchedule::WsCooperative
                    && k.scheduler == TileScheduler::Persistent
                    && k.epilogue == EpilogueKind::Tma
            })
            .unwrap()
    }

    /// The 4096³ linear kernel of `spec(true)` fused with an epilogue over every leaf kind.
    fn fused() -> KernelSpec {
        let e = crate::kinds::gemm::Epilogue::parse(
            "leaves=full,row,col,scalar;v1=gelu_tanh(v0);v2=mul(v1,l1);v3=sigmoid(v0);v4=mul(v2,v3);v5=add(v4,l2);v6=div(v5,l3);v7=pow(v6,3.0);v8=add(l0,v7);v9=clamp(v8,-inf,6.0)",
        )
        .unwrap();
        KernelSpec {
            fusion: Some(e),
            ..spec(true)
        }
    }

    fn sm80(math: MathType, bias: bool) -> KernelSpec {
        let p = GemmProblem {
            m: 256,
            n: 256,
            k: 524288,
            layout: GemmLayout::Rrr,
            dtype: DType::F32,
            bias,
            batch: 1,
            epilogue: None,
            padded_from: None,
        };
        Knowledge::shipped()
            .kernels(&p, math, Arch::Sm90)
            .into_iter()
            .find(|k| {
                k.family == crate::kinds::gemm::space::Family::Sm80Gemm
                    && k.tile == [128, 128, 32]
                    && k.scheduler == TileScheduler::Persistent
            })
            .unwrap()
    }

    /// A persistent 2x1x1 split-family kernel of `tile` for the 4096³ fp32-accurate rrr GEMM.
    fn split_kernel(family: crate::kinds::gemm::space::Family, tile: [u32; 3]) -> KernelSpec {
        let p = GemmProblem {
            m: 4096,
            n: 4096,
            k: 4096,
            layout: GemmLayout::Rrr,
            dtype: DType::F32,
            bias: false,
            batch: 1,
            epilogue: None,
            padded_from: None,
        };
        Knowledge::shipped()
            .kernels(&p, MathType::Tf32x3, Arch::Sm90)
            .into_iter()
            .find(|k| {
                k.family == family
                    && k.tile == tile
                    && k.cluster == [2, 1, 1]
                    && k.scheduler == TileScheduler::Persistent
            })
            .unwrap()
    }

    #[test]
    fn sm80_render_is_golden_and_names_its_math() {
        let k = render(&sm80(MathType::Tf32x3, true));
        expect_test::expect_file!["../../../tests/golden/sm80_gemm_rrr_tf32x3_bias.cu"]
            .assert_eq(&k.text);
        assert!(k.text.contains("OpMultiplyAddFastF32"));
        let plain = render(&sm80(MathType::Tf32, false)).text;
        assert!(plain.contains("cutlass::arch::OpMultiplyAdd>"), "{plain}");
    }

    /// The first sm80-build candidate (tile `tile`, persistent) for torch's `layout` problem
    /// 4096x4096x4096 with `epilogue`.
    fn for_sm80(
        dtype: DType,
        layout: GemmLayout,
        bias: bool,
        epilogue: Option<&str>,
        tile: [u32; 3],
    ) -> KernelSpec {
        let epilogue = epilogue.map(|e| crate::kinds::gemm::Epilogue::parse(e).unwrap());
        let p = GemmProblem {
            m: 4096,
            n: 4096,
            k: 4096,
            layout,
            dtype,
            bias,
            batch: 1,
            epilogue,
            padded_from: None,
        };
        let math = MathType::for_tensor(dtype, crate::types::Precision::Tf32).unwrap();
        Knowledge::shipped()
            .kernels(&p, math, Arch::Sm80)
            .into_iter()
            .find(|k| k.tile == tile && k.scheduler == TileScheduler::Persistent)
            .unwrap_or_else(|| panic!("an sm80 {tile:?} kernel"))
    }

    #[test]
    fn sm80_builds_render_golden_and_differ_from_sm90_builds_in_name_and_spec_alone() {
        let k = for_sm80(DType::F32, GemmLayout::Rcr, false, None, [128, 128, 32]);
        assert_eq!(
            k.kernel_name(),
            "sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_align4_for_sm80"
        );
        let text = render(&k).text;
        expect_test::expect_file!["../../../tests/golden/sm80_gemm_rcr_tf32_for_sm80.cu"]
            .assert_eq(&text);
        let on_sm90 = KernelSpec {
            arch: Arch::Sm90,
            ..k.clone()
        };
        let same = render(&on_sm90)
            .text
            .replace(&on_sm90.kernel_name(), &k.kernel_name())
            .replace(&on_sm90.to_json(), &k.to_json());
        assert_eq!(
            same, text,
            "one template, two targets: nvcc's flags make the difference"
        );
    }

    #[test]
    fn sm80_evt_render_is_golden_and_reads_torch_s_problem_row_major() {
        // bias + gelu + residual: the GPT block's MLP output with its skip connection.
        let k = for_sm80(
            DType::F32,
            GemmLayout::Rcr,
            true,
            Some("leaves=full;v1=gelu(v0);v2=add(v1,l0)"),
            [128, 128, 32],
        );
        assert_eq!(k.invalid_reason(), None);
        assert!(
            k.kernel_name()
                .starts_with("sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_")
                && k.kernel_name().ends_with("_align4_for_sm80"),
            "{}",
            k.kernel_name()
        );
        let text = render(&k).text;
        expect_test::expect_file!["../../../tests/golden/sm80_gemm_rcr_tf32_bias_ep_for_sm80.cu"]
            .assert_eq(&text);
        assert!(
            text.contains("const float v0 = acc[i] + bias[i];")
                && text.contains("const float v2 = v1 + l0[i];")
        );
        assert!(text.contains("using LayoutA = cutlass::layout::RowMajor;\nusing LayoutB = cutlass::layout::ColumnMajor;\nusing LayoutC = cutlass::layout::RowMajor;"));
        assert!(
            text.contains("const int64_t lda = K, ldb = K;"),
            "rcr: a is [m,k], b is [n,k]"
        );
        assert!(text.contains("VisitorRowBroadcast<OutputTileThreadMap, Element, Stride<_0, _1, int64_t>>,\n    cutlass::epilogue::threadblock::VisitorAuxLoad<"));
        assert!(
            text.contains("fact_erf_approx(v0 * 0.70710678118654752f)") && !text.contains("GELU"),
            "tf32: erf through the hardware's tanh, in fact's own functor"
        );
        // Every leaf kind, on bf16 rrr Stream-K.
        let k = for_sm80(DType::Bf16, GemmLayout::Rrr, false, Some("leaves=full,row,col,scalar;v1=mul(v0,l1);v2=add(v1,l2);v3=div(v2,l3);v4=add(v3,l0)"), [128, 128, 32]);
        let sk = KernelSpec {
            scheduler: TileScheduler::StreamK,
            ..k
        };
        let text = render(&sk).text;
        for line in [
            "using LayoutA = cutlass::layout::RowMajor;\nusing LayoutB = cutlass::layout::RowMajor;",
            "const int64_t lda = K, ldb = N;",
            "cutlass::gemm::threadblock::ThreadblockSwizzleStreamK,",
            "VisitorColBroadcast<OutputTileThreadMap, Element, Stride<_1, _0, int64_t>>",
            "VisitorScalarBroadcast<ElementCompute>",
            "{ {}, {const_cast<Element*>(static_cast<const Element*>(p.leaves[0])), Element(0), {int64_t(N), _1{}, mn}}, {static_cast<const Element*>(p.leaves[1]), Element(0), {}}, {static_cast<const Element*>(p.leaves[2]), Element(0), {}}, {{ElementCompute(0)}, {static_cast<const ElementCompute*>(p.leaves[3])}, {}}, {} },",
            // The call's leaves as the ABI passes them, in the program's order.
            "constexpr int kLeaves = 4;",
            "constexpr Leaf kLeafKinds[FACT_MAX_LEAVES] = { Leaf::Full, Leaf::Row, Leaf::Col, Leaf::Scalar, };",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        // Each residual is an aux load of its own, so sm80 takes two where sm90's C operand takes one.
        let two = for_sm80(
            DType::F32,
            GemmLayout::Rcr,
            true,
            Some("leaves=full,full;v1=add(v0,l0);v2=add(v1,l1)"),
            [128, 128, 32],
        );
        assert_eq!(two.invalid_reason(), None);
        assert_eq!(render(&two).text.matches("VisitorAuxLoad<").count(), 2);
        // The sm90 family takes the same two residuals, the second through an aux load.
        let sm90 = KernelSpec {
            fusion: two.fusion.clone(),
            ..spec(true)
        };
        assert_eq!((sm90.invalid_reason(), sm90.aux_loads()), (None, 1));
    }

    #[test]
    fn x3_render_is_golden_and_runs_two_gemms() {
        let k = split_kernel(
            crate::kinds::gemm::space::Family::Sm90GemmX3,
            [128, 256, 32],
        );
        let text = render(&k).text;
        expect_test::expect_file!["../../../tests/golden/sm90x3_gemm_rrr_tf32x3.cu"]
            .assert_eq(&text);
        assert!(
            text.contains("return make_arguments(p, a, b, 1.0f, 2 * p.k, 2 * p.k);"),
            "the second GEMM accumulates over both K halves"
        );
        assert!(text.contains(
            "launch_adapter<SecondGemm, SecondKernel>(second_arguments(p, a_parts, b_parts)"
        ));
        // torch's rrr b is split into K-major parts, so the passes read a RowMajor CUTLASS A.
        assert!(
            text.contains("split_parts_transposed<<<")
                && text.contains("using LayoutA = cutlass::layout::RowMajor;")
        );
        let rcr = KernelSpec {
            layout: GemmLayout::Rcr,
            ..k
        };
        assert!(!render(&rcr).text.contains("split_parts_transposed<<<"));
    }

    #[test]
    fn split_families_fuse_bias_and_epilogue_into_their_second_gemm() {
        let p = GemmProblem {
            m: 4096,
            n: 4096,
            k: 4096,
            layout: GemmLayout::Rcr,
            dtype: DType::F32,
            bias: true,
            batch: 1,
            epilogue: Some(crate::kinds::gemm::Epilogue::parse("leaves=;v1=gelu(v0)").unwrap()),
            padded_from: None,
        };
        let k = Knowledge::shipped()
            .kernels(&p, MathType::Tf32x3, Arch::Sm90)
            .into_iter()
            .find(|k| {
                k.family == crate::kinds::gemm::space::Family::Sm90GemmBf16x3
                    && k.invalid_reason().is_none()
            })
            .expect("a bf16-split kernel for a fused f32-accurate problem");
        assert!(k.fits(&p));
        let text = render(&k).text;
        assert!(
            text.contains("namespace plain {") && text.contains("namespace fused {"),
            "two GEMM types"
        );
        assert!(
            text.contains("const float v0 = acc[i] + c[i] + bias[i];"),
            "the first GEMM's result comes in as C"
        );
        assert!(text.contains("0.5f * v0 * (1.f + erff(v0 * 0.70710678118654752f))"));
        assert_eq!(
            text.matches("using ElementC = void;").count(),
            1,
            "the first GEMM reads no C"
        );
        assert_eq!(text.matches("using ElementC = ElementD;").count(), 1);
        // Bias alone takes the same path.
        let bias_only = KernelSpec {
            fusion: None,
            ..k.clone()
        };
        assert!(render(&bias_only)
            .text
            .contains("const float v0 = acc[i] + c[i] + bias[i];"));
    }

    #[test]
    fn bf16_split_render_is_golden_and_keeps_the_layout() {
        let k = split_kernel(
            crate::kinds::gemm::space::Family::Sm90GemmBf16x3,
            [128, 256, 64],
        );
        assert!(
            k.kernel_name()
                .starts_with("sm90b3_gemm_rrr_bf16x3_f32_128x256x64_"),
            "{}",
            k.kernel_name()
        );
        let text = render(&k).text;
        expect_test::expect_file!["../../../tests/golden/sm90b3_gemm_rrr_bf16x3.cu"]
            .assert_eq(&text);
        for line in [
            "using Element = cutlass::bfloat16_t;",
            "using ElementD = float;",
            "constexpr int Alignment = 8;",
            "constexpr int AlignmentD = 4;",
            "using LayoutA = cutlass::layout::ColumnMajor;",
        ] {
            assert!(text.contains(line), "{line}");
        }
        assert!(!text.contains("split_parts_transposed"));
    }

    #[test]
    fn variants_of_one_kernel_share_its_source_and_symbol() {
        let k = sm80(MathType::Tf32x3, false);
        let v = k.with_knobs(crate::kinds::gemm::space::Knobs {
            splits: 8,
            ..Default::default()
        });
        assert_eq!(render(&k), render(&v));
        let d = crate::kinds::render_dispatch(&[k.clone().into(), v.clone().into()]).text;
        assert_eq!(
            d.matches(&format!(
                "extern \"C\" int32_t fact_k_{}_run",
                k.kernel_name()
            ))
            .count(),
            1
        );
        assert!(d.contains(&format!("{{\"{}\"", v.name())) && d.contains("{ 8, 0, 1 }}"));
        let unit = render_unit(&[spec(false), k.clone()]);
        assert!(unit.file_name.starts_with("unit_2k_"));
        assert_eq!(
            unit,
            unit_of(&[&render(&spec(false)), &render(&k)]),
            "a unit of rendered kernels is the same unit"
        );
        assert!(
            unit.text
                .contains(&format!("fact_k_{}_run", k.kernel_name()))
                && unit
                    .text
                    .contains(&format!("fact_k_{}_run", spec(false).kernel_name()))
        );
    }

    #[test]
    fn kernel_render_is_deterministic_and_golden() {
        let a = render(&spec(true));
        assert_eq!(a, render(&spec(true)));
        expect_test::expect_file!["../../../tests/golden/sm90_gemm_rcr_tf32_bias.cu"]
            .assert_eq(&a.text);
    }

    #[test]
    fn only_f32_accurate_kernels_compute_tanh_exp_and_erf_accurately() {
        let e = crate::kinds::gemm::Epilogue::parse(
            "leaves=;v1=gelu_tanh(v0);v2=sigmoid(v1);v3=exp(v2);v4=gelu(v3)",
        )
        .unwrap();
        let lines =
            |m: MathType| program_lines(&e, "acc[i]", Transcendentals::for_math(m)).join("\n");
        for m in [MathType::Tf32, MathType::Bf16, MathType::F16] {
            let text = lines(m);
            assert!(
                text.contains("fact_tanh_approx(")
                    && text.contains("fact_exp_approx(-v1)")
                    && text.contains("fact_erf_approx(v3 * "),
                "{m:?}: {text}"
            );
            assert!(
                !text.contains("tanhf(") && !text.contains(" expf(") && !text.contains("erff("),
                "{m:?}: {text}"
            );
        }
        let exact = lines(MathType::Tf32x3);
        assert!(
            exact.contains("tanhf(")
                && exact.contains("expf(-v1)")
                && exact.contains("erff(v3 * ")
                && !exact.contains("approx")
        );
    }

    #[test]
    fn fused_render_is_golden_and_computes_each_value_once() {
        let k = fused();
        assert_eq!(k.invalid_reason(), None);
        let text = render(&k).text;
        expect_test::expect_file!["../../../tests/golden/sm90_gemm_rcr_tf32_bias_ep.cu"]
            .assert_eq(&text);
        // v0 (acc + bias) feeds gelu and sigmoid: one line defines it, both read it.
        assert_eq!(
            text.matches("const float v0 = acc[i] + bias[i];").count(),
            1
        );
        assert!(text.contains("const float v3 = 1.f / (1.f + fact_exp_approx(-v0));"));
        assert!(
            text.contains("const float v7 = v6 * v6 * v6;"),
            "pow 3 as torch computes it"
        );
        assert!(
            text.contains("Sm90SrcFetch<ElementD>")
                && text.contains("Sm90RowBroadcast")
                && text.contains("Sm90ScalarBroadcast")
        );
        assert!(
            text.contains("(1.f + fact_tanh_approx(0.79788456080286536f * (v0 + ")
                && !text.contains("GELU_taylor"),
            "tf32: the hardware tanh, in fact's own functor"
        );
        // Without a full-size leaf the kernel loads no C.
        let mut no_c = k.clone();
        no_c.fusion = Some(crate::kinds::gemm::Epilogue::parse("leaves=;v1=relu(v0)").unwrap());
        assert!(render(&no_c).text.contains("using ElementC = void;"));
        assert_ne!(no_c.kernel_name(), k.kernel_name());
        assert!(
            k.kernel_name()
                .contains("_bias_ep_gelu_tanh_mul_sigmoid_mul_add_div_pow_add_clamp_"),
            "{}",
            k.kernel_name()
        );
        // The dispatch entry carries the program for the op to check against its call, and the
        // signature the tensors in the order the kernel reads them.
        let d = crate::kinds::render_dispatch(&[k.clone().into()]).text;
        assert!(d.contains(&format!(
            "R\"fact_ep({})fact_ep\"",
            k.fusion.as_ref().unwrap().text()
        )));
        assert!(d.contains("\"gemm\", \"a[L,M,K] b[L,K,N] (stored [L,N,K]) bias[N] full[L,M,N] row[N] col[M] scalar f32[1] out[L,M,N]; no scalars\""));
        assert!(text.contains(
            "constexpr Leaf kLeafKinds[FACT_MAX_LEAVES] = { Leaf::Full, Leaf::Row, Leaf::Col, Leaf::Scalar, };"
        ));
    }

    /// A 128x128 cooperative persistent kernel of `family` for the GPT block's projection under
    /// `math` (65536x768x768 linear with bias) fused with `program`.
    fn projection(
        family: crate::kinds::gemm::space::Family,
        math: MathType,
        program: &str,
    ) -> KernelSpec {
        let e = crate::kinds::gemm::Epilogue::parse(program).unwrap();
        let p = GemmProblem {
            m: 65536,
            n: 768,
            k: 768,
            layout: GemmLayout::Rcr,
            dtype: DType::F32,
            bias: true,
            batch: 1,
            epilogue: Some(e),
            padded_from: None,
        };
        let k = Knowledge::shipped()
            .kernels(&p, math, Arch::Sm90)
            .into_iter()
            .find(|k| {
                k.family == family
                    && k.tile[..2] == [128, 128]
                    && k.schedule == KernelSchedule::WsCooperative
                    && k.scheduler == TileScheduler::Persistent
                    && k.cluster == [1, 2, 1]
            })
            .expect("a 128x128 cooperative kernel");
        assert_eq!(k.invalid_reason(), None, "{}", k.name());
        assert!(k.fits(&p), "{}", k.name());
        k
    }

    #[test]
    fn a_second_residual_is_an_aux_load_beside_the_c_operand() {
        let k = projection(
            crate::kinds::gemm::space::Family::Sm90Gemm,
            MathType::Tf32,
            "leaves=full,full;v1=add(v0,l0);v2=add(v1,l1)",
        );
        assert_eq!(
            k.leaf_reads(),
            vec![
                Some(crate::kinds::gemm::space::LeafRead::C),
                Some(crate::kinds::gemm::space::LeafRead::Aux)
            ]
        );
        let text = render(&k).text;
        expect_test::expect_file!["../../../tests/golden/sm90_gemm_rcr_tf32_bias_ep_aux.cu"]
            .assert_eq(&text);
        // l0 rides on C, l1 on its own TMA load, with its own stride.
        assert!(
            text.contains("{ {}, static_cast<const ElementD*>(p.leaves[0]), stride_d,"),
            "l0 is the C operand"
        );
        assert!(text
            .contains("{static_cast<const ElementAux*>(p.leaves[1]), ElementAux(0), stride_aux}"));
        assert!(text.contains("auto stride_aux = cutlass::make_cute_packed_stride(typename AuxLoadDescriptor::Stride{}, {M, N, L});"));
        assert_eq!(
            text.matches("cutlass::epilogue::fusion::Sm90SrcFetch<ElementD>")
                .count(),
            1
        );
        assert!(text.contains("    AuxLoad>;") && text.contains("const float v2 = v1 + l1[i];"));
        // The leaves' order is in the program's text, so in the name's digest: swapping which
        // residual rides on C names another kernel.
        let swapped = projection(
            crate::kinds::gemm::space::Family::Sm90Gemm,
            MathType::Tf32,
            "leaves=full,full;v1=add(v0,l1);v2=add(v1,l0)",
        );
        assert_ne!(swapped.kernel_name(), k.kernel_name());
        // One full-size leaf renders as before: C alone, no aux load.
        let one = projection(
            crate::kinds::gemm::space::Family::Sm90Gemm,
            MathType::Tf32,
            "leaves=full;v1=add(v0,l0)",
        );
        assert_eq!(one.aux_loads(), 0);
        assert!(!render(&one).text.contains("AuxLoad"));
    }

    #[test]
    fn the_split_families_take_a_residual_through_an_aux_load() {
        let k = projection(
            crate::kinds::gemm::space::Family::Sm90GemmBf16x3,
            MathType::Tf32x3,
            "leaves=full;v1=add(l0,v0)",
        );
        assert_eq!(
            k.leaf_reads(),
            vec![Some(crate::kinds::gemm::space::LeafRead::Aux)]
        );
        let text = render(&k).text;
        expect_test::expect_file!["../../../tests/golden/sm90b3_gemm_rcr_bf16x3_bias_ep_aux.cu"]
            .assert_eq(&text);
        // The second GEMM: C is the first's result, the residual an aux load; the first reads none.
        assert!(
            text.contains("const float v0 = acc[i] + c[i] + bias[i];")
                && text.contains("const float v1 = l0[i] + v0;")
        );
        assert!(text.contains("{ {}, static_cast<const ElementD*>(p.out), stride_d,"));
        assert!(text
            .contains("{static_cast<const ElementAux*>(p.leaves[0]), ElementAux(0), stride_aux}"));
        assert_eq!(
            text.matches("using AuxLoad = ").count(),
            1,
            "in the fused GEMM only"
        );
        assert_eq!(text.matches("using ElementC = void;").count(), 1);
        // Two residuals are two aux loads: beside C that is 192 KB of 128-row subtiles, which
        // leaves the mainloop no two stages, so the cooperative kernels are refused.
        let two = KernelSpec {
            fusion: Some(
                crate::kinds::gemm::Epilogue::parse("leaves=full,full;v1=add(l0,v0);v2=add(v1,l1)")
                    .unwrap(),
            ),
            ..k.clone()
        };
        assert_eq!(two.aux_loads(), 2);
        assert!(
            two.invalid_reason()
                .unwrap()
                .contains("(2 aux load(s) as deep as C) do not fit in shared memory"),
            "{:?}",
            two.invalid_reason()
        );
    }

    /// The 2048x4096x8192 problem of `a.t() @ b` (crr) or `a.t() @ b.t()` (ccr).
    fn transposed(layout: GemmLayout, family: crate::kinds::gemm::space::Family) -> KernelSpec {
        let p = GemmProblem {
            m: 2048,
            n: 4096,
            k: 8192,
            layout,
            dtype: DType::F32,
            bias: false,
            batch: 1,
            epilogue: None,
            padded_from: None,
        };
        Knowledge::shipped()
            .kernels(&p, MathType::Tf32, Arch::Sm90)
            .into_iter()
            .find(|k| {
                k.family == family
                    && k.tile[..2] == [128, 128]
                    && k.scheduler == TileScheduler::Persistent
                    && (k.family == crate::kinds::gemm::space::Family::Sm80Gemm
                        || (k.schedule == KernelSchedule::WsCooperative
                            && k.epilogue == EpilogueKind::Tma
                            && k.cluster == [1, 2, 1]))
            })
            .unwrap()
    }

    #[test]
    fn transposed_layouts_render_golden_and_read_operands_in_place() {
        // crr: torch's a is column-major, CUTLASS's B (aᵀ) row-major; B stays as in rrr.
        let crr = transposed(GemmLayout::Crr, crate::kinds::gemm::space::Family::Sm90Gemm);
        assert_eq!(
            crr.kernel_name(),
            "sm90_gemm_crr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4"
        );
        let text = render(&crr).text;
        expect_test::expect_file!["../../../tests/golden/sm90_gemm_crr_tf32.cu"].assert_eq(&text);
        assert!(text.contains("using LayoutA = cutlass::layout::ColumnMajor;\nusing LayoutB = cutlass::layout::RowMajor;"));
        // ccr on the sm80 family: both CUTLASS operands row-major, leading dims K (A) and N (B).
        let ccr = transposed(GemmLayout::Ccr, crate::kinds::gemm::space::Family::Sm80Gemm);
        assert!(
            ccr.kernel_name()
                .starts_with("sm80_gemm_ccr_tf32_f32_128x128x"),
            "{}",
            ccr.kernel_name()
        );
        let text = render(&ccr).text;
        expect_test::expect_file!["../../../tests/golden/sm80_gemm_ccr_tf32.cu"].assert_eq(&text);
        assert!(text.contains("using LayoutA = cutlass::layout::RowMajor;\nusing LayoutB = cutlass::layout::RowMajor;"));
        assert!(
            text.contains("const int64_t lda = K;")
                && text.contains("const int64_t ldb = N, ldd = M;")
        );
        // The dispatch entry carries the layout the op checks the call against.
        assert!(crate::kinds::render_dispatch(&[ccr.clone().into()])
            .text
            .contains(&format!("{})fact_spec\", \"f32\", \"ccr\",", ccr.to_json())));
    }

    /// The 4099x5003x3001 rrr problem: every contiguous dim odd (alignment 1).
    fn ragged(math: MathType) -> Vec<KernelSpec> {
        let p = GemmProblem {
            m: 4099,
            n: 5003,
            k: 3001,
            layout: GemmLayout::Rrr,
            dtype: DType::F32,
            bias: false,
            batch: 1,
            epilogue: None,
            padded_from: None,
        };
        Knowledge::shipped()
            .kernels(&p, math, Arch::Sm90)
            .into_iter()
            .filter(|k| k.invalid_reason().is_none())
            .collect()
    }

    #[test]
    fn cp_async_render_is_golden_and_stores_element_wise() {
        let k = ragged(MathType::Tf32)
            .into_iter()
            .find(|k| {
                k.schedule == KernelSchedule::CpAsyncWsCooperative
                    && k.tile == [128, 128, 32]
                    && k.scheduler == TileScheduler::Persistent
            })
            .unwrap();
        assert_eq!(
            k.kernel_name(),
            "sm90_gemm_rrr_tf32_f32_128x128x32_1x1x1_cp_ws_coop_dp_nosmem_align1"
        );
        let text = render(&k).text;
        expect_test::expect_file!["../../../tests/golden/sm90_gemm_rrr_tf32_cp_async_align1.cu"]
            .assert_eq(&text);
        for line in [
            "constexpr int Alignment = 1;",
            "constexpr int AlignmentD = 1;",
            "    cutlass::gemm::KernelCpAsyncWarpSpecializedCooperative>::CollectiveOp;",
            "    cutlass::epilogue::NoSmemWarpSpecialized,",
        ] {
            assert!(text.contains(line), "{line}");
        }
        // Alignment 2 rows keep CUTLASS's output alignment of 1.
        let even = GemmProblem {
            m: 64,
            n: 30,
            k: 64,
            layout: GemmLayout::Rcr,
            dtype: DType::F32,
            bias: false,
            batch: 1,
            epilogue: None,
            padded_from: None,
        };
        let k2 = Knowledge::shipped()
            .kernels(&even, MathType::Tf32, Arch::Sm90)
            .into_iter()
            .find(|k| k.schedule.is_cpasync())
            .unwrap();
        let text = render(&k2).text;
        assert!(
            text.contains("constexpr int Alignment = 2;\nconstexpr int AlignmentD = 1;"),
            "{}",
            k2.name()
        );
    }

    #[test]
    fn padded_split_render_is_golden_and_pads_its_parts() {
        let find = |family| {
            ragged(MathType::Tf32x3)
                .into_iter()
                .find(|k| {
                    k.family == family
                        && k.tile[..2] == [128, 256]
                        && k.schedule == KernelSchedule::WsCooperative
                        && k.scheduler == TileScheduler::Persistent
                })
                .unwrap()
        };
        let x3 = find(crate::kinds::gemm::space::Family::Sm90GemmX3);
        assert!(
            x3.kernel_name()
                .starts_with("sm90x3_gemm_rrr_tf32x3_f32_128x256x32_")
                && x3.kernel_name().ends_with("_ws_coop_dp_nosmem_align1"),
            "{}",
            x3.kernel_name()
        );
        let text = render(&x3).text;
        expect_test::expect_file!["../../../tests/golden/sm90x3_gemm_rrr_tf32x3_padded.cu"]
            .assert_eq(&text);
        // The GEMMs read aligned parts and write an aligned output.
        assert!(text.contains("constexpr int Alignment = 4;\nconstexpr int AlignmentD = 4;"));
        assert!(text.contains("split_parts_transposed<<<grid, dim3(32, 8), 0, s>>>(static_cast<const float*>(p.b), b_parts, p.k, p.n, kp, np);"));
        assert!(text.contains("copy_out<<<") && !text.contains("if (p.k % 4 != 0"));
        // The bf16 split of an rrr b keeps it n-major: rows of np, kp of them per part.
        let b3 = ragged(MathType::Tf32x3)
            .into_iter()
            .find(|k| k.family == crate::kinds::gemm::space::Family::Sm90GemmBf16x3)
            .unwrap();
        let b3 = render(&b3).text;
        assert!(
            b3.contains("const PaddedSplit sb{p.batch, p.k, p.n, kp, np, size_t(np),")
                && b3.contains("constexpr int Alignment = 8;")
        );
    }

    #[test]
    fn dispatch_render_is_golden() {
        let d = crate::kinds::render_dispatch(&[spec(true).into(), spec(false).into()]);
        expect_test::expect_file!["../../../tests/golden/fact_dispatch.cpp"].assert_eq(&d.text);
    }

    #[test]
    fn generated_files_say_where_they_come_from() {
        let k = render(&spec(false));
        assert!(k
            .text
            .starts_with("// generated from templates/sm90_gemm.cu.hbs; do not edit\n// spec: {"));
        assert!(k
            .text
            .contains(&format!("fact_k_{}_run", spec(false).name())));
        assert!(
            !k.text.contains("LinCombPerRowBias"),
            "no bias epilogue without bias"
        );
    }
}
