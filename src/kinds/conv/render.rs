//! The convolution kind's templates rendered: the kernel's translation unit, one template per
//! family (templates/sm90_conv.cu.hbs: CUTLASS's sm90 conv collective builder with the problem's
//! epilogue as one of CUTLASS's fusion operations, bias per column, that is per output channel,
//! and the activation, the residual as C; templates/sm80_conv.cu.hbs: CUTLASS 2's
//! `ImplicitGemmConvolution` with the broadcast epilogue, the bias its vector, the residual its
//! C; templates/sm90_conv_gemm.cu.hbs: a 1x1 convolution as CUTLASS's sm90 GEMM builder's
//! persistent GEMM over the pixels' rows, the same epilogue), all reading the ABI's call through
//! one partial (templates/conv_call.hbs), the implicit GEMMs' entry points another
//! (templates/conv_entry.hbs), and its section of the torch op library (templates/conv_op.cpp.hbs: `fact::conv` and its fallback,
//! the replaced ops). Pure, like every rendering: the same spec renders the same text.

use super::problem::ConvAct;
use super::spec::ConvSpec;
use crate::codegen::{self, OpCode, Source};
use crate::types::Arch;
use handlebars::Handlebars;
use serde_json::json;
use std::sync::OnceLock;

const KERNEL: &str = include_str!("templates/sm90_conv.cu.hbs");
const POINTWISE: &str = include_str!("templates/sm90_conv_gemm.cu.hbs");
const KERNEL80: &str = include_str!("templates/sm80_conv.cu.hbs");
const DEPTHWISE: &str = include_str!("templates/sm80_dwconv.cu.hbs");
const CALL: &str = include_str!("templates/conv_call.hbs");
const ENTRY: &str = include_str!("templates/conv_entry.hbs");
const OP: &str = include_str!("templates/conv_op.cpp.hbs");

fn templates() -> &'static Handlebars<'static> {
    static R: OnceLock<Handlebars<'static>> = OnceLock::new();
    R.get_or_init(|| {
        codegen::templates(
            &[
                ("conv_call", CALL),
                ("conv_entry", ENTRY),
                codegen::PER_DEVICE,
            ],
            &[
                ("sm90_conv", KERNEL),
                ("sm90_conv_gemm", POINTWISE),
                ("sm80_conv", KERNEL80),
                ("sm80_dwconv", DEPTHWISE),
                ("op", OP),
            ],
        )
    })
}

/// The convolution section of the op library for `arch`.
pub fn op_code(arch: Arch) -> OpCode {
    OpCode {
        prelude: String::new(),
        body: templates()
            .render("op", &codegen::op_vars(arch))
            .expect("the conv op renders"),
    }
}

/// CUTLASS's functor for the activation (`Identity` for none).
fn act_functor(a: Option<ConvAct>) -> &'static str {
    match a {
        None => "cutlass::epilogue::thread::Identity",
        Some(ConvAct::Relu) => "cutlass::epilogue::thread::ReLu",
        Some(ConvAct::Silu) => "cutlass::epilogue::thread::SiLu",
        Some(ConvAct::Hardswish) => "cutlass::epilogue::thread::HardSwish",
        Some(ConvAct::Gelu) => "cutlass::epilogue::thread::GELU",
        Some(ConvAct::GeluTanh) => "cutlass::epilogue::thread::GELU_taylor",
        Some(ConvAct::Relu6) => "fact_act::ReLu6",
        Some(ConvAct::Sigmoid) => "cutlass::epilogue::thread::Sigmoid",
        Some(ConvAct::Hardsigmoid) => "fact_act::HardSigmoid",
    }
}

/// What the activation's functor needs defined before the epilogue names it: the ones CUTLASS's
/// activations lack, ReLU6 (min(max(x, 0), 6), propagating NaN as torch's hardtanh does) and
/// hardsigmoid (min(max(x + 3, 0), 6) / 6, torch's formula), on one value and on a fragment.
fn act_prelude(a: Option<ConvAct>) -> String {
    let (name, what, body) = match a {
        Some(ConvAct::Relu6) => (
            "ReLu6",
            "ReLU6: min(max(x, 0), 6), NaN propagated (torch's hardtanh(x, 0, 6))",
            "return mn(mx(value, T(0)), T(6));",
        ),
        Some(ConvAct::Hardsigmoid) => (
            "HardSigmoid",
            "hardsigmoid: min(max(x + 3, 0), 6) / 6, NaN propagated (torch's formula)",
            "return mn(mx(value + T(3), T(0)), T(6)) / T(6);",
        ),
        _ => return String::new(),
    };
    format!(
        "// {what}.
namespace fact_act {{
template <typename T>
struct {name} {{
  static const bool kIsHeavy = false;
  CUTLASS_HOST_DEVICE T operator()(T value) const {{
    cutlass::maximum<T, true> mx;
    cutlass::minimum<T, true> mn;
    {body}
  }}
}};
template <typename T, int N>
struct {name}<cutlass::Array<T, N>> {{
  static const bool kIsHeavy = false;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& frag) const {{
    cutlass::Array<T, N> out;
    {name}<T> op;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = op(frag[i]);
    return out;
  }}
}};
}}  // namespace fact_act

"
    )
}

/// The epilogue's fusion operation: D = act(acc + bias + C), each part where the spec has it.
fn fusion(s: &ConvSpec) -> String {
    let ns = "cutlass::epilogue::fusion";
    match (s.bias, s.act.is_some()) {
        (true, _) => format!(
            "{ns}::LinCombPerColBiasEltAct<{}, Element, ElementCompute, Element, ElementC, ElementCompute>",
            act_functor(s.act)
        ),
        (false, true) => format!(
            "{ns}::LinCombEltAct<{}, Element, ElementCompute, ElementC, ElementCompute>",
            act_functor(s.act)
        ),
        (false, false) => format!("{ns}::LinearCombination<Element, ElementCompute, ElementC, ElementCompute>"),
    }
}

/// The translation unit of one convolution kernel, from its family's template.
pub fn render(s: &ConvSpec) -> Source {
    let name = s.name();
    let [tm, tn, tk] = s.conv_tile;
    let [cm, cn, ck] = s.conv_cluster;
    let mut vars = json!({
        "name": name,
        "spec_json": serde_json::to_string(s).expect("spec serializes"),
        "element": s.dtype.cutlass_tag(),
        "dtype_abi": codegen::dtype_abi(s.dtype),
        "math": s.math_name(),
        "tile_m": tm, "tile_n": tn, "tile_k": tk,
        "bias": s.bias,
        "residual": s.residual,
        "act": s.act.map(ConvAct::name).unwrap_or_default(),
        "act_prelude": act_prelude(s.act),
    });
    let template = match (s.conv_depthwise, s.conv_warps, s.conv_stages) {
        _ if s.conv_gemm.is_some() => {
            let g = s.conv_gemm.expect("checked");
            let (kernel, epilogue) = g.cutlass();
            vars["schedule"] = json!(match g {
                super::spec::GemmSchedule::Coop => "cooperative",
                super::spec::GemmSchedule::Pingpong => "ping-pong",
            });
            vars["kernel_schedule"] = json!(kernel);
            vars["epilogue_schedule"] = json!(epilogue);
            vars["fusion"] = json!(fusion(s));
            "sm90_conv_gemm"
        }
        (Some(dw), Some([wm, _, _]), Some(stages)) => {
            let [r, f] = dw.filter;
            // -1: read at run time (CUTLASS's marker for the Optimized iterators).
            let [sh, sw] = dw.stride.map_or([-1, -1], |d| d.map(i64::from));
            let dilation = if dw.stride.is_some() { 1 } else { -1 };
            vars["tile_p"] = json!(tm);
            vars["tile_q"] = json!(tn);
            vars["groups"] = json!(tk);
            vars["filter_r"] = json!(r);
            vars["filter_s"] = json!(f);
            vars["warps"] = json!(wm);
            vars["stages"] = json!(stages);
            vars["stride_h"] = json!(sh);
            vars["stride_w"] = json!(sw);
            vars["dilation_h"] = json!(dilation);
            vars["dilation_w"] = json!(dilation);
            let (iterator, support, algorithm) = match dw.stride {
                Some(_) => (
                    "kFixedStrideDilation",
                    "kFixed",
                    "fixed-stride-and-dilation",
                ),
                None => (
                    "kOptimized",
                    "kStrided",
                    "optimized (run-time stride and dilation)",
                ),
            };
            vars["iterator"] = json!(iterator);
            vars["stride_support"] = json!(support);
            vars["algorithm"] = json!(algorithm);
            vars["act_functor"] = json!(act_functor(s.act));
            "sm80_dwconv"
        }
        (None, Some([wm, wn, _]), Some(stages)) => {
            vars["warp_m"] = json!(tm / wm);
            vars["warp_n"] = json!(tn / wn);
            vars["stages"] = json!(stages);
            vars["instruction"] = json!(if s.dtype == crate::types::DType::F32 {
                "16, 8, 8"
            } else {
                "16, 8, 16"
            });
            vars["act_functor"] = json!(act_functor(s.act));
            vars["fixed_channels"] = json!(s.conv_fixed_channels);
            "sm80_conv"
        }
        _ => {
            vars["cluster_m"] = json!(cm);
            vars["cluster_n"] = json!(cn);
            vars["cluster_k"] = json!(ck);
            vars["fusion"] = json!(fusion(s));
            "sm90_conv"
        }
    };
    let text = templates()
        .render(template, &vars)
        .unwrap_or_else(|e| panic!("rendering {name}: {e}"));
    Source {
        file_name: format!("{name}.cu"),
        text,
    }
}

/// What the kernel's tensors and scalars are, by position (the dispatch table's signature).
pub fn signature(s: &ConvSpec) -> String {
    format!(
        "x[N,C,H,W] {} (channels-last) bias[K]{} residual[N,K,P,Q]{} out[N,K,P,Q] (channels-last; NULL data when absent); stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w",
        if s.conv_depthwise.is_some() {
            "w[K,1,R,S] (depthwise: K = C)"
        } else {
            "w[K,C,R,S]"
        },
        if s.bias { "" } else { "?" },
        if s.residual { "" } else { "?" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::conv::ConvProblem;
    use crate::types::{Arch, DType};

    fn spec() -> ConvSpec {
        ConvSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            conv_tile: [128, 128, 64],
            conv_cluster: [1, 1, 1],
            conv_warps: None,
            conv_stages: None,
            conv_fixed_channels: None,
            conv_gemm: None,
            conv_depthwise: None,
            bias: true,
            residual: true,
            act: Some(ConvAct::Relu),
        }
    }

    #[test]
    fn sm90_conv_render_is_golden_and_carries_the_epilogue() {
        let s = spec();
        let text = render(&s).text;
        expect_test::expect_file![
            "../../../tests/golden/sm90_conv2d_fprop_bf16_128x128x64_1x1x1_bias_add_relu.cu"
        ]
        .assert_eq(&text);
        assert!(text.contains(
            "using FusionOp = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<cutlass::epilogue::thread::ReLu, Element, ElementCompute, Element, ElementC, ElementCompute>;"
        ));
        assert!(text.contains("using ElementC = Element;") && text.contains("fusion.beta = 1.0f;"));
        let plain = render(&ConvSpec {
            bias: false,
            residual: false,
            act: None,
            dtype: DType::F32,
            conv_tile: [128, 128, 32],
            ..s.clone()
        })
        .text;
        assert!(plain.contains("using Element = float;"));
        assert!(plain.contains("using ElementC = void;") && plain.contains("fusion.beta = 0.0f;"));
        assert!(plain.contains(
            "fusion::LinearCombination<Element, ElementCompute, ElementC, ElementCompute>"
        ));
        assert!(!plain.contains("bias_ptr"));
        let silu = render(&ConvSpec {
            bias: false,
            act: Some(ConvAct::GeluTanh),
            ..s.clone()
        })
        .text;
        assert!(silu.contains("LinCombEltAct<cutlass::epilogue::thread::GELU_taylor,"));
        assert_eq!(crate::kinds::Spec::from(s.clone()).render(), render(&s));
    }

    #[test]
    fn a_1x1_gemm_render_is_golden_and_carries_the_epilogue() {
        // resnet's bottleneck expansion under tf32: bias, residual and ReLU, cooperative.
        let s = ConvSpec {
            dtype: DType::F32,
            conv_tile: [128, 128, 32],
            conv_gemm: Some(super::super::GemmSchedule::Coop),
            ..spec()
        };
        assert_eq!(s.invalid_reason(), None);
        let text = render(&s).text;
        expect_test::expect_file![
            "../../../tests/golden/sm90_conv2d_fprop_tf32_128x128x32_1x1x1_1x1gemm_coop_bias_add_relu.cu"
        ]
        .assert_eq(&text);
        for line in [
            "using FusionOp = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<cutlass::epilogue::thread::ReLu, Element, ElementCompute, Element, ElementC, ElementCompute>;",
            "    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;",
            "    cutlass::epilogue::TmaWarpSpecializedCooperative,",
            "    Element, cutlass::layout::RowMajor, Alignment,\n    Element, cutlass::layout::ColumnMajor, Alignment,",
            "  return c.r == 1 && c.s == 1 && c.stride[0] == 1 && c.stride[1] == 1 && c.pad[0] == 0 && c.pad[1] == 0 &&",
            "  fusion.beta = 1.0f;",
        ] {
            assert!(text.contains(line), "{line}");
        }
        let pp = render(&ConvSpec {
            conv_tile: [64, 128, 64],
            conv_gemm: Some(super::super::GemmSchedule::Pingpong),
            residual: false,
            ..spec()
        })
        .text;
        assert!(pp.contains("cutlass::gemm::KernelTmaWarpSpecializedPingpong>::CollectiveOp;"));
        assert!(pp.contains("    cutlass::epilogue::TmaWarpSpecialized,"));
        assert!(pp.contains("using ElementC = void;") && pp.contains("fusion.beta = 0.0f;"));
        assert_eq!(crate::kinds::Spec::from(s.clone()).render(), render(&s));
    }

    #[test]
    fn the_op_section_replays_the_graphs_ops() {
        let body = op_code(Arch::Sm90).body;
        for call in [
            "at::conv2d(x, weight, bias, stride, padding, dilation, groups)",
            "at::_convolution(x, weight, bias, stride, padding, dilation, false, output_padding, groups",
            "at::batch_norm(y, bn_weight, bn_bias, bn_mean, bn_var, false, 0.1, f.eps, f.bn_cudnn)",
            "at::hardswish(y)",
            "count_fell_back(kernel, why)",
            "disabled(kConvKind)",
            "at::MemoryFormat::ChannelsLast",
        ] {
            assert!(body.contains(call), "{call}");
        }
        assert!(op_code(Arch::Sm80).body.contains("(an sm80 library)"));
    }

    #[test]
    fn sm80_conv_render_is_golden_and_carries_the_epilogue() {
        let s = ConvSpec {
            arch: Arch::Sm80,
            conv_tile: [128, 128, 32],
            conv_warps: Some([2, 2, 1]),
            conv_stages: Some(4),
            ..spec()
        };
        assert_eq!(s.invalid_reason(), None);
        let text = render(&s).text;
        expect_test::expect_file![
            "../../../tests/golden/sm80_conv2d_fprop_bf16_128x128x32_2x2x1_s4_bias_add_relu_for_sm80.cu"
        ]
        .assert_eq(&text);
        for line in [
            "using WarpShape = cutlass::gemm::GemmShape<64, 64, 32>;",
            "using InstructionShape = cutlass::gemm::GemmShape<16, 8, 16>;",
            "cutlass::epilogue::thread::ReLu<ElementCompute>, cutlass::plus<ElementCompute>, false, Element>;",
            "{ElementCompute(1), ElementCompute(1)},",
            "if (!channels_last(r)) return false;",
        ] {
            assert!(text.contains(line), "{line}");
        }
        let tf32 = render(&ConvSpec {
            dtype: crate::types::DType::F32,
            conv_tile: [128, 128, 16],
            residual: false,
            act: None,
            ..s.clone()
        })
        .text;
        assert!(
            tf32.contains("GemmShape<16, 8, 8>")
                && tf32.contains("thread::Identity<ElementCompute>")
        );
        assert!(tf32.contains("{ElementCompute(1), ElementCompute(0)},"));
        assert!(
            tf32.contains("IteratorAlgorithm::kOptimized,") && !tf32.contains("kFixedChannels")
        );
    }

    #[test]
    fn a_stems_fixed_channels_render_is_golden() {
        // resnet's tf32 stem on an H100: CUTLASS 2's code, C padded to 4, bias and ReLU.
        let s = ConvSpec {
            arch: Arch::Sm90,
            dtype: crate::types::DType::F32,
            conv_tile: [128, 64, 16],
            conv_warps: Some([2, 2, 1]),
            conv_stages: Some(6),
            conv_fixed_channels: Some(4),
            residual: false,
            ..spec()
        };
        assert_eq!(s.invalid_reason(), None);
        let text = render(&s).text;
        expect_test::expect_file![
            "../../../tests/golden/sm80_conv2d_fprop_tf32_128x64x16_2x2x1_s6_fixedc4_bias_relu.cu"
        ]
        .assert_eq(&text);
        for line in [
            "cutlass::conv::IteratorAlgorithm::kFixedChannels,",
            "using InstructionShape = cutlass::gemm::GemmShape<16, 8, 8>;",
            "constexpr int Alignment = 128 / cutlass::sizeof_bits<Element>::value;",
        ] {
            assert!(text.contains(line), "{line}");
        }
    }

    #[test]
    fn every_candidate_renders() {
        let p = ConvProblem {
            images: 32,
            height: 56,
            width: 56,
            in_channels: 64,
            out_channels: 64,
            filter: [3, 3],
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
            dtype: DType::F16,
            bias: true,
            residual: false,
            act: Some(ConvAct::Silu),
        };
        for s in
            super::super::spec::candidates(&p, crate::types::MathType::F16, Arch::Sm90).unwrap()
        {
            let text = render(&s).text;
            assert!(text.contains(&format!("fact_k_{}_run", s.name())));
            assert!(text.contains("using Element = cutlass::half_t;"));
        }
    }

    #[test]
    fn relu6_renders_fact_s_functor_once_before_the_epilogue_names_it() {
        // MobileNetV2's depthwise 3x3 with its BatchNorm folded in and ReLU6; and sm90's EVT.
        let text = render(&depthwise_3x3([1, 1], ConvAct::Relu6)).text;
        expect_test::expect_file![
            "../../../tests/golden/sm80_dwconv2d_fprop_bf16_8x8x64_r3x3_stride1x1_4x1x1_s3_bias_relu6_for_sm80.cu"
        ]
        .assert_eq(&text);
        let sm90 = ConvSpec {
            act: Some(ConvAct::Relu6),
            ..spec()
        };
        for (text, uses) in [
            (text, "    fact_act::ReLu6, Element, Alignment, ElementAccumulator, ElementCompute>;"),
            (
                render(&sm90).text,
                "using FusionOp = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<fact_act::ReLu6,",
            ),
        ] {
            assert_eq!(text.matches("struct ReLu6 {").count(), 1);
            let defined = text.find("struct ReLu6 {").unwrap();
            assert!(text.find(uses).is_some_and(|u| u > defined), "{uses}");
        }
        // Hardsigmoid is fact's too; CUTLASS's sigmoid and the other activations define nothing.
        let hs = render(&ConvSpec {
            act: Some(ConvAct::Hardsigmoid),
            ..spec()
        })
        .text;
        assert!(hs.contains("return mn(mx(value + T(3), T(0)), T(6)) / T(6);"));
        assert!(hs.contains("LinCombPerColBiasEltAct<fact_act::HardSigmoid,"));
        for act in [Some(ConvAct::Relu), Some(ConvAct::Sigmoid), None] {
            let text = render(&ConvSpec { act, ..spec() }).text;
            assert!(!text.contains("fact_act"), "{act:?}");
        }
    }

    /// An sm80 depthwise 3x3 kernel in bf16 with its bias and `act` (mobilenet's).
    fn depthwise_3x3(stride: [u32; 2], act: ConvAct) -> ConvSpec {
        ConvSpec {
            arch: Arch::Sm80,
            dtype: DType::Bf16,
            conv_tile: [8, 8, 64],
            conv_cluster: [1, 1, 1],
            conv_warps: Some([4, 1, 1]),
            conv_stages: Some(3),
            conv_fixed_channels: None,
            conv_gemm: None,
            conv_depthwise: Some(crate::kinds::conv::Depthwise {
                filter: [3, 3],
                stride: Some(stride),
            }),
            bias: true,
            residual: false,
            act: Some(act),
        }
    }

    #[test]
    fn sm80_dwconv_render_is_golden_and_reads_the_bias_as_a_broadcast_c() {
        let s = depthwise_3x3([2, 2], ConvAct::Hardswish);
        assert_eq!(s.invalid_reason(), None);
        let text = render(&s).text;
        expect_test::expect_file![
            "../../../tests/golden/sm80_dwconv2d_fprop_bf16_8x8x64_r3x3_stride2x2_4x1x1_s3_bias_hardswish_for_sm80.cu"
        ]
        .assert_eq(&text);
        for line in [
            "using ThreadBlockOutputShape = cutlass::conv::TensorNHWCShape<1, 8, 8, kGroupsPerCta>;",
            "using FilterShape = cutlass::MatrixShape<kFilterR, kFilterS>;",
            "using StrideShape = cutlass::MatrixShape<2, 2>;",
            "cutlass::conv::IteratorAlgorithm::kFixedStrideDilation,",
            "cutlass::epilogue::thread::HardSwish, Element, Alignment, ElementAccumulator, ElementCompute>;",
            "Layout(typename Layout::Stride(0))",
            "{ElementCompute(1), ElementCompute(1)},",
            "if (w.sizes[1] != 1 || c.k != c.c",
            "if (r.data != nullptr) return false;",
        ] {
            assert!(text.contains(line), "{line}");
        }
        // Any stride, no bias, no activation: the Optimized iterators, beta 0, Identity.
        let plain = render(&ConvSpec {
            dtype: DType::F32,
            conv_fixed_channels: None,
            conv_gemm: None,
            conv_depthwise: Some(crate::kinds::conv::Depthwise {
                filter: [7, 7],
                stride: None,
            }),
            bias: false,
            act: None,
            ..s.clone()
        })
        .text;
        for line in [
            "using Element = float;",
            "using StrideShape = cutlass::MatrixShape<-1, -1>;",
            "cutlass::conv::IteratorAlgorithm::kOptimized,",
            "cutlass::conv::StrideSupport::kStrided,",
            "constexpr int kFilterR = 7;",
            "LinearCombinationGeneric<\n    cutlass::epilogue::thread::Identity,",
            "{ElementCompute(1), ElementCompute(0)},",
            "if (b.data != nullptr) return false;",
        ] {
            assert!(plain.contains(line), "{line}");
        }
        assert!(signature(&s).contains("w[K,1,R,S] (depthwise: K = C)"));
    }
}
