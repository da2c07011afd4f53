//! The convolution kernels' side of the kernel ABI without a GPU: their can_implement (host code),
//! sm90's and sm80's alike, takes the call include/fact_kernels.h states for kind "conv" (x, w,
//! bias, residual, out channels-last, six scalars) and refuses any other count, layout, size,
//! dtype, alignment or argument, so a call the kernel does not fit falls back instead of
//! computing a wrong number.

use crate::common::{build_all, fake_tensor, op_args};
use fact::kinds::conv::{ConvAct, ConvSpec, Depthwise, GemmSchedule};
use fact::nvcc::library::FactTensor;
use fact::nvcc::Toolchain;
use fact::types::{Arch, DType};

const F32: i32 = 0;
const BF16: i32 = 1;

/// A channels-last [d0,d1,d2,d3] (torch's NCHW sizes) at a fake 16-byte aligned address.
fn nhwc(addr: usize, dtype: i32, s: [i64; 4]) -> FactTensor {
    fake_tensor(addr, dtype, &s, &[s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]])
}

/// x [2,64,8,8], w [64,64,3,3], bias [64], residual and out [2,64,8,8]: stride 1, padding 1.
fn call() -> [FactTensor; 5] {
    [
        nhwc(0x10000, BF16, [2, 64, 8, 8]),
        nhwc(0x20000, BF16, [64, 64, 3, 3]),
        fake_tensor(0x30000, BF16, &[64], &[1]),
        nhwc(0x40000, BF16, [2, 64, 8, 8]),
        nhwc(0x50000, BF16, [2, 64, 8, 8]),
    ]
}

const SAME: [f64; 6] = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0];

/// bf16 with bias, residual and ReLU: sm90's builder kernel, or sm80's implicit GEMM.
fn spec(arch: Arch) -> ConvSpec {
    let sm90 = ConvSpec {
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
    };
    match arch {
        Arch::Sm90 => sm90,
        Arch::Sm80 => ConvSpec {
            arch,
            conv_tile: [128, 128, 32],
            conv_warps: Some([2, 2, 1]),
            conv_stages: Some(4),
            ..sm90
        },
    }
}

#[test]
fn sm90_conv_kernels_take_the_abi_s_channels_last_call_and_refuse_any_other() {
    takes_the_abi_call(spec(Arch::Sm90));
}

#[test]
fn sm80_conv_kernels_take_the_abi_s_channels_last_call_and_refuse_any_other() {
    takes_the_abi_call(spec(Arch::Sm80));
}

fn takes_the_abi_call(spec: ConvSpec) {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let dir = tempfile::tempdir().unwrap();
    let built = build_all(&tc, &[spec], dir.path(), "libconvabi.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(lib.kind(0).as_deref(), Some("conv"));
    let can = |t: &[FactTensor], s: &[f64]| lib.can_implement(0, &op_args(t, s));

    assert!(can(&call(), &SAME));
    let [x, w, bias, res, out] = call();
    // Stride 2 and no padding: a 3x3 output of the 8x8 image.
    let small = nhwc(0x50000, BF16, [2, 64, 3, 3]);
    let small_res = nhwc(0x40000, BF16, [2, 64, 3, 3]);
    assert!(can(
        &[x, w, bias, small_res, small],
        &[2.0, 2.0, 0.0, 0.0, 1.0, 1.0]
    ));

    // A 1x1 filter as torch leaves it when asked for channels-last: its size-1 dims keep their
    // NCHW strides ([64, 1, 1, 1], not [64, 1, 64, 64]); no element moves, so the kernel takes it.
    // Likewise an image of 1x1 pixels (a squeeze-and-excitation block's pooled input).
    let w_1x1 = fake_tensor(0x20000, BF16, &[64, 64, 1, 1], &[64, 1, 1, 1]);
    let one_px = |addr| fake_tensor(addr, BF16, &[2, 64, 1, 1], &[64, 1, 1, 1]);
    assert!(can(
        &[
            one_px(0x10000),
            w_1x1,
            bias,
            one_px(0x40000),
            one_px(0x50000)
        ],
        &[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    ));
    let w_1x1_packed = nhwc(0x20000, BF16, [64, 64, 1, 1]);
    let out_8x8 = |addr| nhwc(addr, BF16, [2, 64, 8, 8]);
    assert!(can(
        &[x, w_1x1, bias, out_8x8(0x40000), out_8x8(0x50000)],
        &[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    ));
    assert!(can(
        &[x, w_1x1_packed, bias, out_8x8(0x40000), out_8x8(0x50000)],
        &[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    ));

    let none = fake_tensor(0, BF16, &[], &[]);
    let nchw = fake_tensor(0x10000, BF16, &[2, 64, 8, 8], &[4096, 64, 8, 1]);
    let mut misaligned = x;
    misaligned.data = 0x10002 as *mut std::ffi::c_void;
    let mut f32_x = x;
    f32_x.dtype = F32;
    let odd_c = nhwc(0x10000, BF16, [2, 60, 8, 8]);
    let odd_w = nhwc(0x20000, BF16, [64, 60, 3, 3]);
    let refused: Vec<(&str, Vec<FactTensor>, [f64; 6])> = vec![
        ("x in NCHW", vec![nchw, w, bias, res, out], SAME),
        (
            "x 2 bytes off 16",
            vec![misaligned, w, bias, res, out],
            SAME,
        ),
        (
            "x f32 in a bf16 kernel",
            vec![f32_x, w, bias, res, out],
            SAME,
        ),
        (
            "no bias for a kernel that adds one",
            vec![x, w, none, res, out],
            SAME,
        ),
        (
            "no residual for a kernel that adds one",
            vec![x, w, bias, none, out],
            SAME,
        ),
        (
            "60 channels: rows not 16 bytes",
            vec![odd_c, odd_w, bias, res, out],
            SAME,
        ),
        (
            "an output of the wrong size for the arguments",
            vec![x, w, bias, res, out],
            [2.0, 2.0, 1.0, 1.0, 1.0, 1.0],
        ),
        (
            "a negative padding",
            vec![x, w, bias, res, out],
            [1.0, 1.0, -1.0, 1.0, 1.0, 1.0],
        ),
        (
            "a fractional stride",
            vec![x, w, bias, res, out],
            [1.5, 1.0, 1.0, 1.0, 1.0, 1.0],
        ),
        ("four tensors", vec![x, w, bias, out], SAME),
    ];
    for (why, t, s) in refused {
        assert!(!can(&t, &s), "{why}");
    }
    assert!(!can(&call(), &SAME[..5]), "five scalars");
}

/// The depthwise kernel the compile test builds too (bf16, 3x3 compiled for stride 1, 64 channels
/// a CTA, bias and ReLU), built for sm90 as an H100 runs it.
pub fn depthwise_spec() -> ConvSpec {
    ConvSpec {
        arch: Arch::Sm90,
        dtype: DType::Bf16,
        conv_tile: [8, 8, 64],
        conv_cluster: [1, 1, 1],
        conv_warps: Some([4, 1, 1]),
        conv_stages: Some(3),
        conv_fixed_channels: None,
        conv_gemm: None,
        conv_depthwise: Some(Depthwise {
            filter: [3, 3],
            stride: Some([1, 1]),
        }),
        bias: true,
        residual: false,
        act: Some(ConvAct::Relu),
    }
}

/// The depthwise kernel's can_implement takes x [N,C,H,W], w [C,1,R,S] (torch's channels-last
/// depthwise weight), bias, no residual, out [N,C,P,Q] at the filter and stride it is compiled
/// for, and refuses any other filter, stride, grouping, channel count or operand; its workspace
/// is the reordered filter.
#[test]
fn depthwise_kernels_take_the_abi_s_depthwise_call_and_refuse_any_other() {
    let spec = depthwise_spec();
    assert_eq!(spec.invalid_reason(), None);
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let dir = tempfile::tempdir().unwrap();
    let built = build_all(&tc, &[spec], dir.path(), "libdwabi.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(lib.kind(0).as_deref(), Some("conv"));
    let can = |t: &[FactTensor], s: &[f64]| lib.can_implement(0, &op_args(t, s));
    let dw_w = |k: i64, r: i64| fake_tensor(0x20000, BF16, &[k, 1, r, r], &[r * r, 1, r, 1]);
    let x = nhwc(0x10000, BF16, [2, 64, 8, 8]);
    let bias = fake_tensor(0x30000, BF16, &[64], &[1]);
    let none = fake_tensor(0, BF16, &[], &[]);
    let out = nhwc(0x50000, BF16, [2, 64, 8, 8]);
    let call = [x, dw_w(64, 3), bias, none, out];
    assert!(can(&call, &SAME));
    assert_eq!(lib.workspace_size(0, &op_args(&call, &SAME)), 64 * 9 * 2);

    let out4 = nhwc(0x50000, BF16, [2, 64, 4, 4]);
    let x48 = nhwc(0x10000, BF16, [2, 48, 8, 8]);
    let out48 = nhwc(0x50000, BF16, [2, 48, 8, 8]);
    let bias48 = fake_tensor(0x30000, BF16, &[48], &[1]);
    let out128 = nhwc(0x50000, BF16, [2, 128, 8, 8]);
    let bias128 = fake_tensor(0x30000, BF16, &[128], &[1]);
    let refused: Vec<(&str, Vec<FactTensor>, [f64; 6])> = vec![
        (
            "stride 2 in a kernel compiled for stride 1",
            vec![x, dw_w(64, 3), bias, none, out4],
            [2.0, 2.0, 1.0, 1.0, 1.0, 1.0],
        ),
        (
            "a 5x5 filter in a 3x3 kernel",
            vec![x, dw_w(64, 5), bias, none, out],
            [1.0, 1.0, 2.0, 2.0, 1.0, 1.0],
        ),
        (
            "a dense weight (groups 1)",
            vec![x, nhwc(0x20000, BF16, [64, 64, 3, 3]), bias, none, out],
            SAME,
        ),
        (
            "48 channels: no whole CTA of 64",
            vec![x48, dw_w(48, 3), bias48, none, out48],
            SAME,
        ),
        (
            "K = 128 filters of 64 channels (a channel multiplier)",
            vec![x, dw_w(128, 3), bias128, none, out128],
            SAME,
        ),
        (
            "a residual",
            vec![
                x,
                dw_w(64, 3),
                bias,
                nhwc(0x40000, BF16, [2, 64, 8, 8]),
                out,
            ],
            SAME,
        ),
        ("no bias", vec![x, dw_w(64, 3), none, none, out], SAME),
    ];
    for (why, t, s) in refused {
        assert!(!can(&t, &s), "{why}");
    }
}

/// The 1x1 family's GEMM takes the channels-last call of a 1x1 filter at stride 1 without padding
/// (the pixels are its rows), its weight packed or as torch leaves a 1x1 filter, and refuses a
/// 3x3 filter, a stride or a padding (none of them is that GEMM) as well as what every conv kernel
/// refuses, so those calls fall back.
#[test]
fn pointwise_gemm_kernels_take_a_1x1_call_and_refuse_any_other_filter_stride_or_padding() {
    let spec = ConvSpec {
        conv_gemm: Some(GemmSchedule::Coop),
        ..spec(Arch::Sm90)
    };
    assert_eq!(spec.invalid_reason(), None);
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let dir = tempfile::tempdir().unwrap();
    let built = build_all(&tc, &[spec], dir.path(), "libpwabi.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(lib.kind(0).as_deref(), Some("conv"));
    let can = |t: &[FactTensor], s: &[f64]| lib.can_implement(0, &op_args(t, s));
    let [x, w3, bias, res, out] = call();
    let w = nhwc(0x20000, BF16, [64, 64, 1, 1]);
    let w_as_torch_leaves_it = fake_tensor(0x20000, BF16, &[64, 64, 1, 1], &[64, 1, 1, 1]);
    let one = [1.0, 1.0, 0.0, 0.0, 1.0, 1.0];
    assert!(can(&[x, w, bias, res, out], &one));
    assert!(can(&[x, w_as_torch_leaves_it, bias, res, out], &one));
    // Dilation does not move a 1x1 filter's tap.
    assert!(can(
        &[x, w, bias, res, out],
        &[1.0, 1.0, 0.0, 0.0, 2.0, 2.0]
    ));
    let out4 = nhwc(0x50000, BF16, [2, 64, 4, 4]);
    let res4 = nhwc(0x40000, BF16, [2, 64, 4, 4]);
    let out10 = nhwc(0x50000, BF16, [2, 64, 10, 10]);
    let res10 = nhwc(0x40000, BF16, [2, 64, 10, 10]);
    let nchw = fake_tensor(0x10000, BF16, &[2, 64, 8, 8], &[4096, 64, 8, 1]);
    let refused: Vec<(&str, Vec<FactTensor>, [f64; 6])> = vec![
        ("a 3x3 filter", vec![x, w3, bias, res, out], SAME),
        (
            "stride 2",
            vec![x, w, bias, res4, out4],
            [2.0, 2.0, 0.0, 0.0, 1.0, 1.0],
        ),
        (
            "padding 1",
            vec![x, w, bias, res10, out10],
            [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        ),
        ("x in NCHW", vec![nchw, w, bias, res, out], one),
        (
            "no residual for a kernel that adds one",
            vec![x, w, bias, fake_tensor(0, BF16, &[], &[]), out],
            one,
        ),
    ];
    for (why, t, s) in refused {
        assert!(!can(&t, &s), "{why}");
    }
}
