//! The convolution kernel spec and its candidate space. Two families, one per arch, both
//! implicit-GEMM fprop over channels-last tensors (NHWC activations, KRSC filters) with the
//! problem's own epilogue: bias per output channel, the residual as the C operand (beta 1), the
//! activation.
//! - sm90: CUTLASS 3's conv collective builder (TMA im2col loads, warp-specialized GMMA, one
//!   consumer warpgroup: the builder's only conv schedule), a tile and a thread-block cluster.
//!   Named `sm90_conv2d_fprop_<math>_<tile>_<cluster>[_bias][_add][_<act>]`.
//! - sm80: CUTLASS 2's `ImplicitGemmConvolution` (`DefaultConv2dFprop`, multistage cp.async,
//!   mma.sync), a tile, its warps and the pipeline's stages; the epilogue through
//!   `DefaultConv2dFpropWithBroadcast`. Named `sm80_conv2d_fprop_<math>_<tile>_<warps>_s<stages>
//!   [_fixedc<C>][_bias][_add][_<act>]_for_sm80`, as every kernel built for sm80 is (a stem's
//!   fixed-channels kernel, below, built for sm90 has no `_for_sm80`).
//!
//! - 1x1 (a 1x1 filter, stride 1, no padding), on sm90: over channels-last tensors this is the GEMM
//!   `out[N·H·W, K] = x[N·H·W, C] · w[K, C]ᵀ`, both operands K-major, so CUTLASS 3's GEMM
//!   collective builder computes it with the convolution's epilogue (templates/sm90_conv_gemm.cu.hbs):
//!   its persistent cooperative and ping-pong schedules overlap a tile's epilogue with the next
//!   tile's loads, where the conv builder's one warpgroup finishes a tile before it loads the next,
//!   and these convolutions (K of 64 to 2048 channels) move more bytes than they multiply. Named
//!   `sm90_conv2d_fprop_<math>_<tile>_1x1x1_1x1gemm_<coop|pp>[_bias][_add][_<act>]`; a call of any
//!   other filter, stride or padding is refused (the op falls back). On an H100 under tf32 they
//!   beat the conv builder's best on every 1x1 convolution of resnet50's bottlenecks (56x56, 64 to
//!   256 channels with the residual: 0.090 ms against 0.123).
//!
//! The space is CUTLASS's generator's: the tiles and clusters `GenerateSM90_Conv3x` instantiates
//! for 16-bit and tf32 fprop (bf16 and fp16 share their GMMA shapes, so both take the union of
//! the two lists), with the 1x1x1 cluster it calls valid, and the tile descriptions
//! `GenerateSM80_TensorOp_16816` and `_1688` hand its conv2d operators. A small estimate (waves of
//! tiles, the K loop's fill and the accumulators a thread holds) orders them within each tile
//! height, the heights taking turns; measurement picks.
//! - depthwise (groups = C = K), on either arch as sm80 code: CUTLASS 2's direct convolution
//!   (`DefaultDepthwiseDirect2dConvFprop` with the `DirectConvolution` launch, examples/46): SIMT
//!   fp32 multiply-adds over an output tile of P×Q pixels and G channels a CTA, the filter's R×S
//!   compiled in, the stride and dilation compiled in (`FixedStrideDilation`) or read at run time
//!   (`Optimized`). Its epilogue is a linear combination with an activation and no broadcast: the
//!   bias is its C operand read with row stride 0, so it takes no residual. Named
//!   `sm80_dwconv2d_fprop_<f32|bf16|f16>_<P>x<Q>x<G>_r<R>x<S>_<stride<h>x<w>|anystride>_<warps>_s<stages>
//!   [_bias][_<act>][_for_sm80]` (`_for_sm80` where the library is built for sm80, as every kernel is).
//!   Its space is `GenerateSM60_Simt_DepthwiseConv2d`'s tiles (8x8, 10x10 and 4x4 output pixels of
//!   16, 32 or 64 channels, four warps), at the problem's filter (the generator lists 3x3 and 5x5;
//!   convnext's 7x7 instantiates the same templates).
//!
//! Operands are rows of 16 bytes of channels (TMA's and the optimized iterators' access), so C and
//! K are multiples of 8 (16-bit) or 4 (fp32) channels. A problem whose C is not runs on C padded
//! with zero channels (`ConvProblem::kernel_channels`: an image model's stem, C = 3); K cannot be
//! padded (the output's channels are the model's).
//! - stems (C padded to one 16-byte access), on either arch as sm80 code: CUTLASS 2's implicit
//!   GEMM with the fixed-channels iterators (`IteratorAlgorithm::kFixedChannels`), which load each
//!   filter tap's C channels as one access, over the sm80 tiles. The generator instantiates them
//!   for 16-bit types (`CreateConv2dFixedChannelsOperator`, 4 or 8 channels; here 8, one access);
//!   tf32 takes the same template at 4 channels. They come first in a stem's sweep. On an H100
//!   they beat the sm90 builder's kernels on the stems (resnet50's tf32 7x7: 0.446 ms against
//!   0.628) and still lose to cuDNN's convolution with its batch norm and activation (0.370 ms),
//!   so those stems stay torch's, the plan saying so.

use super::problem::{ConvAct, ConvProblem};
use crate::types::{Arch, DType, MathType};
use serde::{Deserialize, Serialize};

/// One convolution kernel. Its field names are none of another kind's spec (`conv_tile`,
/// `conv_cluster`), so an untagged table value parses as this kind only.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvSpec {
    /// The family: sm90's or sm80's (the library's nvcc target).
    pub arch: Arch,
    /// The tensors' type; f32 tensors multiply in tf32.
    pub dtype: DType,
    /// The CTA's tile of the implicit GEMM: output pixels × output channels × reduction.
    pub conv_tile: [u32; 3],
    /// sm90: the thread-block cluster; sm80: 1x1x1.
    pub conv_cluster: [u32; 3],
    /// sm80: the warps the tile is split among (M, N, K); absent on sm90.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conv_warps: Option<[u32; 3]>,
    /// sm80: the mainloop's pipeline stages; absent on sm90 (the builder fills shared memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conv_stages: Option<u32>,
    /// The depthwise family's compile-time filter and stride; absent for the implicit GEMMs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conv_depthwise: Option<Depthwise>,
    /// The stem family: CUTLASS 2's implicit GEMM with the fixed-channels iterators, which load
    /// each pixel's C channels (this many, C padded to one 16-byte access) and no more, where the
    /// optimized iterators and TMA im2col read a 16-byte row a filter tap with a handful of
    /// channels in it. Absent elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conv_fixed_channels: Option<u32>,
    /// The 1x1 family: a 1x1 convolution of stride 1 and no padding over channels-last tensors is
    /// a GEMM of the pixels' rows (`[N·H·W, C]`) by the filter (`[K, C]`), computed by CUTLASS 3's
    /// GEMM collective builder with this schedule (two consumer warpgroups, persistent) and the
    /// convolution's epilogue. Absent elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conv_gemm: Option<GemmSchedule>,
    pub bias: bool,
    pub residual: bool,
    pub act: Option<ConvAct>,
}

/// The 1x1 family's kernel schedule: CUTLASS 3's warp-specialized persistent GEMMs, whose two
/// consumer warpgroups share a tile (cooperative) or take turns on two (ping-pong, one's epilogue
/// under the other's mainloop), where the conv builder's one warpgroup does a tile at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmSchedule {
    Coop,
    Pingpong,
}

impl GemmSchedule {
    pub fn name(self) -> &'static str {
        match self {
            GemmSchedule::Coop => "coop",
            GemmSchedule::Pingpong => "pp",
        }
    }
    /// CUTLASS's kernel and epilogue schedules.
    pub fn cutlass(self) -> (&'static str, &'static str) {
        match self {
            GemmSchedule::Coop => (
                "cutlass::gemm::KernelTmaWarpSpecializedCooperative",
                "cutlass::epilogue::TmaWarpSpecializedCooperative",
            ),
            GemmSchedule::Pingpong => (
                "cutlass::gemm::KernelTmaWarpSpecializedPingpong",
                "cutlass::epilogue::TmaWarpSpecialized",
            ),
        }
    }
}

/// Whether `p` is a GEMM over channels-last rows: a 1x1 filter, stride 1, no padding, groups 1
/// (dilation does not matter to a 1x1 filter), channels in 16-byte rows.
pub fn is_pointwise(p: &ConvProblem) -> bool {
    p.filter == [1, 1] && p.stride == [1, 1] && p.padding == [0, 0] && p.groups == 1 && !p.padded()
}

/// A depthwise direct convolution's compile-time shape. Its CTA tile is the spec's `conv_tile`
/// read as [P, Q, G] (output pixels high and wide, channels), its warps `conv_warps` (along the
/// pixels), its stages `conv_stages`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Depthwise {
    /// R, S.
    pub filter: [u32; 2],
    /// The stride the kernel is compiled for, dilation 1 (`FixedStrideDilation`); None reads
    /// stride and dilation at run time (`Optimized`).
    pub stride: Option<[u32; 2]>,
}

/// The channels a depthwise CTA may take, smallest first (the generator's groups per CTA).
const DW_GROUPS: [u32; 3] = [16, 32, 64];

/// Whether `p` is a depthwise convolution: one filter per channel, groups = C = K > 1.
pub fn is_depthwise(p: &ConvProblem) -> bool {
    p.groups > 1 && p.groups == p.in_channels && p.groups == p.out_channels
}

impl ConvSpec {
    /// `tf32` for f32 tensors, else the dtype; the depthwise family's SIMT multiplies f32 as f32.
    pub fn math_name(&self) -> &'static str {
        match self.dtype {
            DType::F32 if self.conv_depthwise.is_none() => "tf32",
            d => d.short_name(),
        }
    }
    pub fn name(&self) -> String {
        if let Some(dw) = self.conv_depthwise {
            return self.depthwise_name(dw);
        }
        let [tm, tn, tk] = self.conv_tile;
        let [cm, cn, ck] = self.conv_cluster;
        // The stem family is CUTLASS 2's code on either arch, so it is named for sm80 on both.
        let family = match self.conv_fixed_channels {
            Some(_) => "sm80",
            None => self.arch.short_name(),
        };
        let mut s = format!("{family}_conv2d_fprop_{}_{tm}x{tn}x{tk}", self.math_name());
        match (self.conv_warps, self.conv_stages) {
            (Some([wm, wn, wk]), Some(stages)) => s += &format!("_{wm}x{wn}x{wk}_s{stages}"),
            _ => s += &format!("_{cm}x{cn}x{ck}"),
        }
        if let Some(c) = self.conv_fixed_channels {
            s += &format!("_fixedc{c}");
        }
        if let Some(g) = self.conv_gemm {
            s += "_1x1gemm_";
            s += g.name();
        }
        if self.bias {
            s += "_bias";
        }
        if self.residual {
            s += "_add";
        }
        if let Some(a) = self.act {
            s += "_";
            s += a.name();
        }
        if self.arch == Arch::Sm80 {
            s += "_for_sm80";
        }
        s
    }
    fn depthwise_name(&self, dw: Depthwise) -> String {
        let [p, q, g] = self.conv_tile;
        let [r, s] = dw.filter;
        let [wm, wn, wk] = self.conv_warps.unwrap_or([0, 0, 0]);
        let mut name = format!(
            "sm80_dwconv2d_fprop_{}_{p}x{q}x{g}_r{r}x{s}_{}_{wm}x{wn}x{wk}_s{}",
            self.math_name(),
            match dw.stride {
                Some([h, w]) => format!("stride{h}x{w}"),
                None => "anystride".into(),
            },
            self.conv_stages.unwrap_or(0)
        );
        if self.bias {
            name += "_bias";
        }
        if self.residual {
            name += "_add";
        }
        if let Some(a) = self.act {
            name += "_";
            name += a.name();
        }
        if self.arch == Arch::Sm80 {
            name += "_for_sm80";
        }
        name
    }
    /// The elements of one 16-byte access: what C and K must be multiples of.
    pub fn align(&self) -> u32 {
        16 / self.dtype.bytes() as u32
    }
    /// The tensor-core instruction's K: 8 for tf32, 16 for 16-bit types (sm80's mma.sync and
    /// sm90's GMMA alike).
    fn mma_k(&self) -> u32 {
        if self.dtype == DType::F32 {
            8
        } else {
            16
        }
    }
    /// Why CUTLASS would refuse the kernel, if it would.
    pub fn invalid_reason(&self) -> Option<String> {
        if let Some(dw) = self.conv_depthwise {
            return self.depthwise_invalid(dw);
        }
        let [tm, tn, tk] = self.conv_tile;
        if tk % self.mma_k() != 0 {
            return Some(format!(
                "tile K {tk}: a multiple of the instruction's K {}",
                self.mma_k()
            ));
        }
        if let Some(g) = self.conv_gemm {
            return self.gemm_invalid(g);
        }
        if let Some(c) = self.conv_fixed_channels {
            if c != self.align() {
                return Some(format!(
                    "fixed channels {c}: one 16-byte access a pixel, {} {} channels",
                    self.align(),
                    self.dtype.short_name()
                ));
            }
            if self.conv_warps.is_none() || self.conv_stages.is_none() {
                return Some("the fixed-channels kernels are CUTLASS 2's: warps and stages".into());
            }
        }
        let arch = match self.conv_fixed_channels {
            Some(_) => Arch::Sm80,
            None => self.arch,
        };
        match (arch, self.conv_warps, self.conv_stages) {
            (Arch::Sm90, None, None) => {
                let k_bytes = tk as usize * self.dtype.bytes();
                if !matches!(tm, 64 | 128 | 256) {
                    return Some(format!("tile M {tm}: 64, 128 or 256 output pixels"));
                }
                if !(32..=256).contains(&tn) || tn % 8 != 0 {
                    return Some(format!("tile N {tn}: 32 to 256 channels in steps of 8"));
                }
                if !matches!(k_bytes, 64 | 128) {
                    return Some(format!(
                        "tile K {tk}: 64 or 128 bytes of {}",
                        self.dtype.short_name()
                    ));
                }
                let [cm, cn, ck] = self.conv_cluster;
                if ck != 1 || !matches!((cm, cn), (1, 1) | (2, 1) | (1, 2)) {
                    return Some(format!("cluster {cm}x{cn}x{ck}: 1x1x1, 2x1x1 or 1x2x1"));
                }
                None
            }
            (Arch::Sm80, Some([wm, wn, wk]), Some(stages)) => {
                if self.conv_cluster != [1, 1, 1] {
                    return Some("sm80 kernels have no clusters".into());
                }
                if wk != 1 || wm == 0 || wn == 0 || tm % (16 * wm) != 0 || tn % (8 * wn) != 0 {
                    return Some(format!(
                        "warps {wm}x{wn}x{wk}: the tile {tm}x{tn} split into whole warp tiles"
                    ));
                }
                let smem = stages as usize * (tm + tn) as usize * tk as usize * self.dtype.bytes();
                if !(2..=10).contains(&stages) || smem > Arch::Sm80.hardware().smem_per_cta as usize
                {
                    return Some(format!(
                        "{stages} stages of {tm}x{tn}x{tk}: 2 to 10 within the A100's shared memory"
                    ));
                }
                None
            }
            (arch, ..) => Some(format!(
                "an {} kernel takes {}",
                arch.short_name(),
                match arch {
                    Arch::Sm90 => "a cluster and no warps or stages",
                    Arch::Sm80 => "warps and stages",
                }
            )),
        }
    }
    fn gemm_invalid(&self, g: GemmSchedule) -> Option<String> {
        let [tm, tn, tk] = self.conv_tile;
        if self.arch != Arch::Sm90
            || self.conv_warps.is_some()
            || self.conv_stages.is_some()
            || self.conv_fixed_channels.is_some()
            || self.conv_depthwise.is_some()
        {
            return Some("the 1x1 family is sm90's GEMM builder alone: no warps, stages, fixed channels or depthwise filter".into());
        }
        if self.conv_cluster != [1, 1, 1] {
            return Some("the 1x1 family runs clusters of 1x1x1".into());
        }
        let heights: &[u32] = match g {
            GemmSchedule::Coop => &[128, 256],
            GemmSchedule::Pingpong => &[64, 128],
        };
        if !heights.contains(&tm) {
            return Some(format!(
                "tile M {tm}: the {} schedule takes {heights:?} pixels",
                g.name()
            ));
        }
        if !matches!(tn, 64 | 128 | 192 | 256) {
            return Some(format!("tile N {tn}: 64, 128, 192 or 256 channels"));
        }
        if tk * self.dtype.bytes() as u32 != 128 {
            return Some(format!(
                "tile K {tk}: 128 bytes of {}",
                self.dtype.short_name()
            ));
        }
        if self.accumulators_per_thread() > 128 {
            return Some(format!(
                "tile {tm}x{tn}: more than 128 accumulators a thread"
            ));
        }
        None
    }
    fn depthwise_invalid(&self, dw: Depthwise) -> Option<String> {
        let [p, q, g] = self.conv_tile;
        if self.residual {
            return Some(
                "a residual: the direct convolution's epilogue reads one C operand, the bias"
                    .into(),
            );
        }
        if self.conv_cluster != [1, 1, 1] {
            return Some("the depthwise kernels have no clusters".into());
        }
        let Some([wm, 1, 1]) = self.conv_warps else {
            return Some("depthwise warps split the output pixels alone (Mx1x1)".into());
        };
        if !DW_GROUPS.contains(&g) {
            return Some(format!("{g} channels a CTA: 16, 32 or 64"));
        }
        if p == 0 || q == 0 || wm == 0 || (p * q) % wm != 0 {
            return Some(format!(
                "{p}x{q} output pixels in {wm} warps: a whole number each"
            ));
        }
        if !matches!(self.conv_stages, Some(2..=4)) {
            return Some("2 to 4 stages".into());
        }
        if dw.filter.iter().any(|&f| f == 0 || f > 7) || dw.stride.is_some_and(|s| s.contains(&0)) {
            return Some(format!("a {:?} filter: 1 to 7 a side", dw.filter));
        }
        None
    }
    /// Accumulators one thread holds: sm90's one consumer warpgroup (128 threads) holds the
    /// whole tile, as each of a ping-pong GEMM's does; a cooperative GEMM's two share it; sm80's
    /// warps share it, 32 threads each.
    fn accumulators_per_thread(&self) -> u32 {
        let [tm, tn, _] = self.conv_tile;
        let threads = match (self.conv_warps, self.conv_gemm) {
            (Some([wm, wn, wk]), _) => 32 * wm * wn * wk,
            (None, Some(GemmSchedule::Coop)) => 256,
            (None, _) => 128,
        };
        tm * tn / threads
    }
}

/// Whether a kernel of any family can run `p` at all (under some math): groups of 1 with
/// channels in 16-byte rows once C is padded (`ConvProblem::kernel_channels`), or a depthwise
/// convolution the direct kernels take (`depthwise_refusal`). The plan's layout note and the
/// sweep ask the same.
pub fn kernels_take(p: &ConvProblem) -> bool {
    if is_depthwise(p) {
        return depthwise_refusal(p).is_none();
    }
    p.groups == 1 && p.kernel_problem().alignment() as usize * p.dtype.bytes() == 16
}

/// Why no depthwise direct convolution computes `p` (a depthwise problem), if none does.
fn depthwise_refusal(p: &ConvProblem) -> Option<String> {
    if p.residual {
        return Some(
            "a residual add after a depthwise convolution: the direct convolution's epilogue reads one C operand, which carries the bias"
                .into(),
        );
    }
    if p.filter.iter().any(|&f| f > 7) {
        return Some(format!(
            "a {}x{} depthwise filter: the direct kernels are instantiated up to 7x7",
            p.filter[0], p.filter[1]
        ));
    }
    if p.out_channels % i64::from(DW_GROUPS[0]) != 0 {
        return Some(format!(
            "depthwise over C = {} channels: the direct kernels take 16, 32 or 64 channels a CTA (CUTLASS's SIMT depthwise warp has no 8-channel shape), so C must be a multiple of 16",
            p.out_channels
        ));
    }
    None
}

/// Why no kernel of `arch` computes `p` under `math`, if none does.
pub fn refusal(p: &ConvProblem, math: MathType) -> Option<String> {
    if is_depthwise(p) {
        if math == MathType::Tf32x3 && p.act == Some(ConvAct::GeluTanh) {
            return Some(
                "f32-accurate: the depthwise kernel's tanh GELU is the hardware's tanh approximation"
                    .into(),
            );
        }
        return depthwise_refusal(p);
    }
    if p.groups != 1 {
        return Some(format!(
            "groups = {} of C = {}: a grouped convolution (1 < groups < C); the kernels compute groups of 1 and depthwise ones (groups = C = K)",
            p.groups, p.in_channels
        ));
    }
    if math == MathType::Tf32x3 {
        return Some(
            "f32-accurate: CUTLASS's conv builders multiply tf32 once (no 3xTF32 convolution); torch runs it in fp32"
                .into(),
        );
    }
    let align = 16 / p.dtype.bytes() as i64;
    if !kernels_take(p) {
        return Some(format!(
            "K = {} output channels must be a multiple of {align} (16-byte rows of channels, the kernels' stores; input channels are padded with zeros, output channels cannot be)",
            p.out_channels
        ));
    }
    None
}

/// sm90's tiles (M, N, K in elements) and clusters from `GenerateSM90_Conv3x`: for 16-bit types
/// the bf16 and fp16 lists (mma K 8 and 16, so tile K 32 and 64), for tf32 its own (mma K 8:
/// tile K 32), each with the unit tests' 64x64 tile.
fn sm90_tiles(dtype: DType) -> Vec<([u32; 3], [u32; 3])> {
    let two = [2, 1, 1];
    let one = [1, 1, 1];
    let mut out = vec![];
    if dtype == DType::F32 {
        for mn in [[128, 192], [128, 256], [256, 128], [256, 96]] {
            out.push(([mn[0], mn[1], 32], two));
        }
        out.push(([64, 64, 32], two));
        out.push(([64, 64, 32], [1, 2, 1]));
        return out;
    }
    for k in [32, 64] {
        for mn in [[128, 192], [128, 256], [256, 96], [256, 128]] {
            out.push(([mn[0], mn[1], k], two));
        }
        for mn in [
            [64, 64],
            [64, 128],
            [64, 256],
            [128, 128],
            [128, 256],
            [256, 64],
            [256, 128],
        ] {
            out.push(([mn[0], mn[1], k], one));
        }
    }
    out.push(([64, 64, 64], two));
    out.push(([64, 64, 64], [1, 2, 1]));
    out
}

/// sm80's tile descriptions (tile, warps, stages) from `GenerateSM80_TensorOp_16816` (16-bit)
/// and `GenerateSM80_TensorOp_1688` (tf32), which its conv2d operators take.
fn sm80_tiles(dtype: DType) -> Vec<([u32; 3], [u32; 3], u32)> {
    let rows: &[([u32; 3], [u32; 2], u32)] = if dtype == DType::F32 {
        &[
            ([256, 128, 16], [4, 2], 3),
            ([128, 256, 16], [2, 4], 3),
            ([256, 64, 16], [4, 1], 4),
            ([64, 256, 16], [1, 4], 4),
            ([128, 128, 16], [2, 2], 5),
            ([128, 128, 16], [2, 2], 4),
            ([128, 128, 16], [2, 2], 3),
            ([128, 64, 16], [2, 2], 6),
            ([64, 128, 16], [2, 2], 6),
            ([64, 64, 16], [2, 2], 10),
            ([256, 128, 32], [4, 2], 3),
            ([128, 256, 32], [2, 4], 3),
            ([256, 64, 32], [4, 1], 4),
            ([64, 256, 32], [1, 4], 4),
            ([128, 128, 32], [2, 2], 4),
            ([128, 128, 32], [2, 2], 3),
            ([128, 64, 32], [2, 2], 3),
            ([64, 128, 32], [2, 2], 3),
            ([64, 64, 32], [2, 2], 5),
        ]
    } else {
        &[
            ([256, 128, 32], [4, 2], 3),
            ([128, 256, 32], [2, 4], 3),
            ([256, 64, 32], [4, 1], 3),
            ([256, 64, 32], [4, 1], 4),
            ([64, 256, 32], [1, 4], 4),
            ([128, 128, 32], [2, 2], 3),
            ([128, 128, 32], [2, 2], 4),
            ([128, 128, 32], [2, 2], 5),
            ([128, 64, 32], [2, 2], 6),
            ([64, 128, 32], [2, 2], 6),
            ([64, 64, 32], [2, 2], 10),
            ([256, 128, 64], [4, 2], 3),
            ([128, 256, 64], [2, 4], 3),
            ([256, 64, 64], [4, 1], 4),
            ([64, 256, 64], [1, 4], 4),
            ([128, 128, 64], [2, 2], 4),
            ([256, 64, 64], [4, 1], 3),
            ([64, 256, 64], [1, 4], 3),
            ([128, 128, 64], [2, 2], 3),
            ([128, 64, 64], [2, 2], 3),
            ([64, 128, 64], [2, 2], 3),
            ([64, 64, 64], [2, 2], 5),
        ]
    };
    rows.iter()
        .map(|&(tile, [wm, wn], stages)| (tile, [wm, wn, 1], stages))
        .collect()
}

/// `GenerateSM60_Simt_DepthwiseConv2d`'s tiles: output pixels P×Q and channels G a CTA, and its
/// stages; four warps along the pixels each.
const DW_TILES: [([u32; 2], u32, u32); 7] = [
    ([8, 8], 32, 3),
    ([8, 8], 64, 3),
    ([8, 8], 16, 3),
    ([10, 10], 64, 2),
    ([4, 4], 32, 4),
    ([4, 4], 64, 4),
    ([4, 4], 16, 4),
];

/// The depthwise kernels for `p` on `arch`: every generator tile whose channels divide K, each
/// compiled for the problem's stride where it is 1 or 2 with dilation 1 (the generator's fixed
/// variants) and reading it at run time.
fn depthwise_specs(p: &ConvProblem, arch: Arch) -> Vec<ConvSpec> {
    let [r, s] = p.filter.map(|d| d as u32);
    let fixed = (p.dilation == [1, 1] && p.stride.iter().all(|d| matches!(d, 1 | 2)))
        .then(|| p.stride.map(|d| d as u32));
    let mut out = vec![];
    let strides = if fixed.is_some() {
        vec![fixed, None]
    } else {
        vec![None]
    };
    for stride in strides {
        for ([tp, tq], g, stages) in DW_TILES {
            if p.out_channels % i64::from(g) != 0 {
                continue;
            }
            out.push(ConvSpec {
                arch,
                dtype: p.dtype,
                conv_tile: [tp, tq, g],
                conv_cluster: [1, 1, 1],
                conv_warps: Some([4, 1, 1]),
                conv_stages: Some(stages),
                conv_fixed_channels: None,
                conv_gemm: None,
                conv_depthwise: Some(Depthwise {
                    filter: [r, s],
                    stride,
                }),
                bias: p.bias,
                residual: p.residual,
                act: p.act,
            });
        }
    }
    out
}

/// A depthwise kernel's time on `p`, for ordering: CTAs in waves of four an SM (128 threads
/// each), each CTA's multiply-adds (P·Q·R·S a channel) plus the input window it loads (the halo
/// of its output tile) and its output, per channel.
fn depthwise_estimate(p: &ConvProblem, s: &ConvSpec, dw: Depthwise) -> f64 {
    let [tp, tq, g] = s.conv_tile.map(f64::from);
    let [out_h, out_w] = p.output().map(|d| d as f64);
    let [r, f] = dw.filter.map(f64::from);
    let ctas = p.images as f64
        * (out_h / tp).ceil()
        * (out_w / tq).ceil()
        * (p.out_channels as f64 / g).ceil();
    let sms = f64::from(s.arch.hardware().sms);
    let waves = (ctas / (4.0 * sms)).ceil();
    let window = ((tp - 1.0) * p.stride[0] as f64 + (r - 1.0) * p.dilation[0] as f64 + 1.0)
        * ((tq - 1.0) * p.stride[1] as f64 + (f - 1.0) * p.dilation[1] as f64 + 1.0);
    waves * g * (tp * tq * r * f + 4.0 * (window + tp * tq))
}

/// The kernel's time on `p` relative to its family's rate, for ordering: waves of output tiles
/// over the SMs, each tile's K loop lengthened by its fill and epilogue (about four stages of
/// its K and the output tile's bytes over the operand rows', as the plan's cost model charges
/// GEMMs), and half the rate again where a thread would hold more than 128 accumulators
/// (registers spill).
pub fn estimate(p: &ConvProblem, s: &ConvSpec) -> f64 {
    if let Some(dw) = s.conv_depthwise {
        return depthwise_estimate(p, s, dw);
    }
    let (m, n, k) = p.gemm();
    let [tm, tn, tk] = s.conv_tile.map(|d| d as f64);
    let tiles = (m as f64 / tm).ceil() * (n as f64 / tn).ceil();
    let sms = f64::from(s.arch.hardware().sms);
    let waves = (tiles / sms).ceil();
    let fill = 4.0 * tk + tm * tn / (tm + tn);
    let k_steps = (k as f64 / tk).ceil() * tk;
    let per_tile = tm * tn * (k_steps + fill);
    let pressure = if s.accumulators_per_thread() > 128 {
        2.0
    } else {
        1.0
    };
    waves * per_tile * pressure
}

/// The kernels a first sweep of `p` tries on `arch`, tile heights in turns, each best estimate
/// first (`by_height`); Err where no kernel computes it (the plan's and the sweep's reason).
pub fn candidates(p: &ConvProblem, math: MathType, arch: Arch) -> Result<Vec<ConvSpec>, String> {
    if let Some(why) = refusal(p, math) {
        return Err(why);
    }
    if is_depthwise(p) {
        let mut out = depthwise_specs(p, arch);
        out.retain(|s| s.invalid_reason().is_none());
        out.sort_by(|a, b| estimate(p, a).total_cmp(&estimate(p, b)));
        return Ok(by_height(out));
    }
    let spec = |tile, cluster, warps, stages, fixed| ConvSpec {
        arch,
        dtype: p.dtype,
        conv_tile: tile,
        conv_cluster: cluster,
        conv_warps: warps,
        conv_stages: stages,
        conv_fixed_channels: fixed,
        conv_gemm: None,
        conv_depthwise: None,
        bias: p.bias,
        residual: p.residual,
        act: p.act,
    };
    let sm80 = |fixed| {
        sm80_tiles(p.dtype)
            .into_iter()
            .map(move |(tile, warps, stages)| {
                spec(tile, [1, 1, 1], Some(warps), Some(stages), fixed)
            })
    };
    let mut out: Vec<ConvSpec> = match arch {
        Arch::Sm90 => sm90_tiles(p.dtype)
            .into_iter()
            .map(|(tile, cluster)| spec(tile, cluster, None, None, None))
            .collect(),
        Arch::Sm80 => sm80(None).collect(),
    };
    // A stem (C padded to one 16-byte access) also gets the fixed-channels kernels, first: the
    // estimate cannot see how little of each row the other families' loads use there.
    let mut stems: Vec<ConvSpec> = if p.padded() {
        let c = p.kernel_channels() as u32;
        sm80(Some(c)).collect()
    } else {
        vec![]
    };
    // A 1x1 convolution (stride 1, no padding) also gets the GEMM builder's kernels, first: its
    // persistent schedules overlap one tile's epilogue with the next tile's loads, which the conv
    // builder's one warpgroup does not, and these convolutions move more bytes than they multiply.
    let mut pointwise: Vec<ConvSpec> = if arch == Arch::Sm90 && is_pointwise(p) {
        gemm_tiles(p.dtype)
            .into_iter()
            .map(|(tile, schedule)| ConvSpec {
                conv_gemm: Some(schedule),
                ..spec(tile, [1, 1, 1], None, None, None)
            })
            .collect()
    } else {
        vec![]
    };
    let runs = p.kernel_problem();
    for specs in [&mut stems, &mut pointwise, &mut out] {
        specs.retain(|s| s.invalid_reason().is_none());
        specs.sort_by(|a, b| estimate(&runs, a).total_cmp(&estimate(&runs, b)));
    }
    let mut ordered = by_height(stems);
    ordered.extend(by_height(pointwise));
    ordered.extend(by_height(out));
    Ok(ordered)
}

/// The 1x1 family's tiles (output pixels × output channels × 128 bytes of K) and schedules: the
/// tiles CUTLASS's generator instantiates for sm90 GEMMs with both operands K-major
/// (`GenerateSM90_TensorOp_16b_WGMMA_gemm`, `_tf32_WGMMA_gemm`), cooperative for 128 and 256
/// rows, ping-pong for 64 and 128.
fn gemm_tiles(dtype: DType) -> Vec<([u32; 3], GemmSchedule)> {
    let tk = 128 / dtype.bytes() as u32;
    let mut out = vec![];
    for [tm, tn] in [[128, 128], [128, 256], [256, 128], [128, 64]] {
        out.push(([tm, tn, tk], GemmSchedule::Coop));
    }
    for [tm, tn] in [[64, 128], [64, 256], [64, 64], [128, 128]] {
        out.push(([tm, tn, tk], GemmSchedule::Pingpong));
    }
    out
}

/// `specs` (best estimate first) taken in turns from each tile height (64, 128, 256 output
/// pixels), the heights in the order of their best: the estimate cannot weigh a tall tile's reuse
/// of the filter against a short one's waves well, so a first round cut to a few kernels still
/// measures every height.
fn by_height(specs: Vec<ConvSpec>) -> Vec<ConvSpec> {
    let mut groups: Vec<Vec<ConvSpec>> = vec![];
    for s in specs {
        match groups
            .iter_mut()
            .find(|g| g[0].conv_tile[0] == s.conv_tile[0])
        {
            Some(g) => g.push(s),
            None => groups.push(vec![s]),
        }
    }
    let mut out = vec![];
    let longest = groups.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..longest {
        out.extend(groups.iter().filter_map(|g| g.get(i).cloned()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem() -> ConvProblem {
        ConvProblem {
            images: 32,
            height: 56,
            width: 56,
            in_channels: 64,
            out_channels: 256,
            filter: [1, 1],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            dtype: DType::Bf16,
            bias: true,
            residual: true,
            act: Some(ConvAct::Relu),
        }
    }

    fn sm90(tile: [u32; 3], cluster: [u32; 3]) -> ConvSpec {
        ConvSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            conv_tile: tile,
            conv_cluster: cluster,
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
    fn names_say_the_family_math_tile_and_epilogue() {
        assert_eq!(
            sm90([128, 128, 64], [1, 1, 1]).name(),
            "sm90_conv2d_fprop_bf16_128x128x64_1x1x1_bias_add_relu"
        );
        let f32 = ConvSpec {
            dtype: DType::F32,
            conv_tile: [128, 128, 32],
            act: None,
            residual: false,
            ..sm90([128, 128, 64], [1, 1, 1])
        };
        assert_eq!(f32.name(), "sm90_conv2d_fprop_tf32_128x128x32_1x1x1_bias");
        assert_eq!(f32.align(), 4);
        let sm80 = candidates(&problem(), MathType::Bf16, Arch::Sm80).unwrap();
        assert!(sm80
            .iter()
            .all(|s| s.name().starts_with("sm80_conv2d_fprop_bf16_")
                && s.name().ends_with("_bias_add_relu_for_sm80")));
        let one = sm80
            .iter()
            .find(|s| s.conv_tile == [128, 128, 32] && s.conv_stages == Some(4))
            .unwrap();
        assert_eq!(
            one.name(),
            "sm80_conv2d_fprop_bf16_128x128x32_2x2x1_s4_bias_add_relu_for_sm80"
        );
        for arch in Arch::ALL {
            let specs = candidates(&problem(), MathType::Bf16, arch).unwrap();
            let names: std::collections::BTreeSet<String> =
                specs.iter().map(ConvSpec::name).collect();
            assert_eq!(names.len(), specs.len(), "names are identities");
            assert!(specs.iter().all(|s| s.invalid_reason().is_none()));
        }
    }

    #[test]
    fn the_space_is_the_generators_and_the_estimate_orders_it() {
        // The conv builder's kernels (this 1x1 problem also gets the GEMM builder's, first: the
        // test after this one).
        let conv_builder = |mut specs: Vec<ConvSpec>| {
            specs.retain(|s| s.conv_gemm.is_none());
            specs
        };
        let specs = conv_builder(candidates(&problem(), MathType::Bf16, Arch::Sm90).unwrap());
        // bf16 and fp16 lists: 11 tiles at each of two K depths, and the unit tests' 64x64x64
        // in two clusters.
        assert_eq!(specs.len(), 24);
        assert!(specs
            .iter()
            .any(|s| s.conv_tile == [256, 96, 64] && s.conv_cluster == [2, 1, 1]));
        let tf32 = conv_builder(
            candidates(
                &ConvProblem {
                    dtype: DType::F32,
                    ..problem()
                },
                MathType::Tf32,
                Arch::Sm90,
            )
            .unwrap(),
        );
        assert_eq!(tf32.len(), 6);
        assert!(tf32.iter().all(|s| s.conv_tile[2] == 32));
        // 32·56·56 = 100352 output pixels by 256 channels: a 128x256 tile holds 256 accumulators
        // a thread and spills, so a 128x128 one ranks above it.
        let rank = |tile: [u32; 3]| specs.iter().position(|s| s.conv_tile == tile).unwrap();
        assert!(rank([128, 128, 64]) < rank([128, 256, 64]));
        // The first three are one of each tile height, each its height's best estimate.
        let mut heights: Vec<u32> = specs[..3].iter().map(|s| s.conv_tile[0]).collect();
        heights.sort();
        assert_eq!(heights, [64, 128, 256]);
        for s in &specs[..3] {
            let best = specs
                .iter()
                .filter(|o| o.conv_tile[0] == s.conv_tile[0])
                .map(|o| estimate(&problem(), o))
                .fold(f64::INFINITY, f64::min);
            assert_eq!(estimate(&problem(), s), best);
        }
    }

    #[test]
    fn a_1x1_convolution_tries_the_gemm_builders_kernels_first_and_no_other_convolution_does() {
        let p = problem();
        let specs = candidates(&p, MathType::Bf16, Arch::Sm90).unwrap();
        let gemm: Vec<&ConvSpec> = specs.iter().filter(|s| s.conv_gemm.is_some()).collect();
        // Four cooperative and four ping-pong tiles, all ahead of the conv builder's kernels.
        assert_eq!(gemm.len(), 8);
        assert!(specs[..8].iter().all(|s| s.conv_gemm.is_some()));
        assert!(gemm
            .iter()
            .all(|s| s.conv_tile[2] == 64 && s.conv_cluster == [1, 1, 1] && s.bias && s.residual));
        // Each schedule's heights: cooperative 128 and 256 pixels, ping-pong 64 and 128.
        for s in &gemm {
            let ok: &[u32] = match s.conv_gemm.unwrap() {
                GemmSchedule::Coop => &[128, 256],
                GemmSchedule::Pingpong => &[64, 128],
            };
            assert!(ok.contains(&s.conv_tile[0]), "{}", s.name());
        }
        assert_eq!(
            gemm[0].name().split("_1x1gemm_").count(),
            2,
            "named for the family: {}",
            gemm[0].name()
        );
        let tf32 = candidates(
            &ConvProblem {
                dtype: DType::F32,
                ..p.clone()
            },
            MathType::Tf32,
            Arch::Sm90,
        )
        .unwrap();
        assert!(tf32
            .iter()
            .filter(|s| s.conv_gemm.is_some())
            .all(|s| s.conv_tile[2] == 32));
        // Not a GEMM of the pixels' rows: a 3x3 filter, a stride, a padding; nor on sm80, nor
        // a stem's padded channels.
        let none_of_them = |q: ConvProblem, arch| {
            candidates(&q, MathType::Bf16, arch)
                .unwrap()
                .iter()
                .all(|s| s.conv_gemm.is_none())
        };
        for q in [
            ConvProblem {
                filter: [3, 3],
                padding: [1, 1],
                ..p.clone()
            },
            ConvProblem {
                stride: [2, 2],
                ..p.clone()
            },
            ConvProblem {
                padding: [1, 1],
                ..p.clone()
            },
            ConvProblem {
                in_channels: 3,
                ..p.clone()
            },
        ] {
            assert!(!is_pointwise(&q));
            assert!(none_of_them(q, Arch::Sm90));
        }
        assert!(is_pointwise(&p) && none_of_them(p.clone(), Arch::Sm80));
    }

    #[test]
    fn the_1x1_familys_refusals_say_why() {
        let ok = ConvSpec {
            conv_gemm: Some(GemmSchedule::Coop),
            ..sm90([128, 128, 64], [1, 1, 1])
        };
        assert_eq!(ok.invalid_reason(), None);
        assert_eq!(
            ok.name(),
            "sm90_conv2d_fprop_bf16_128x128x64_1x1x1_1x1gemm_coop_bias_add_relu"
        );
        let why = |s: ConvSpec| s.invalid_reason().unwrap();
        assert!(why(ConvSpec {
            conv_tile: [64, 128, 64],
            ..ok.clone()
        })
        .contains("the coop schedule takes [128, 256] pixels"));
        assert!(why(ConvSpec {
            conv_gemm: Some(GemmSchedule::Pingpong),
            conv_tile: [256, 128, 64],
            ..ok.clone()
        })
        .contains("the pp schedule takes [64, 128] pixels"));
        assert!(why(ConvSpec {
            conv_cluster: [2, 1, 1],
            ..ok.clone()
        })
        .contains("clusters of 1x1x1"));
        assert!(why(ConvSpec {
            conv_tile: [128, 128, 32],
            ..ok.clone()
        })
        .contains("128 bytes"));
        assert!(why(ConvSpec {
            conv_gemm: Some(GemmSchedule::Pingpong),
            conv_tile: [128, 256, 64],
            ..ok.clone()
        })
        .contains("more than 128 accumulators"));
        assert!(why(ConvSpec {
            arch: Arch::Sm80,
            ..ok.clone()
        })
        .contains("sm90's GEMM builder alone"));
        // Its field is absent from every other spec's JSON, so table values written before it
        // parse as they did.
        let plain = serde_json::to_value(sm90([128, 128, 64], [1, 1, 1])).unwrap();
        assert!(plain.get("conv_gemm").is_none());
        let back: ConvSpec = serde_json::from_value(serde_json::to_value(&ok).unwrap()).unwrap();
        assert_eq!(back, ok);
    }

    #[test]
    fn a_stem_runs_padded_and_three_output_channels_say_why_not() {
        // C = 3: the fixed-channels kernels of the padded C first, then the kernels C = 8 takes,
        // ordered by the padded problem's estimate.
        let stem = ConvProblem {
            in_channels: 3,
            height: 224,
            width: 224,
            filter: [7, 7],
            stride: [2, 2],
            padding: [3, 3],
            residual: false,
            ..problem()
        };
        assert!(kernels_take(&stem) && refusal(&stem, MathType::Bf16).is_none());
        let padded = ConvProblem {
            in_channels: 8,
            ..stem.clone()
        };
        for arch in Arch::ALL {
            let all = candidates(&stem, MathType::Bf16, arch).unwrap();
            let aligned = candidates(&padded, MathType::Bf16, arch).unwrap();
            assert!(aligned.iter().all(|s| s.conv_fixed_channels.is_none()));
            let fixed = all.len() - aligned.len();
            assert_eq!(fixed, sm80_tiles(DType::Bf16).len(), "{arch:?}");
            assert_eq!(all[fixed..], aligned[..]);
            for s in &all[..fixed] {
                assert_eq!(
                    (s.conv_fixed_channels, s.arch, s.invalid_reason()),
                    (Some(8), arch, None)
                );
                assert!(
                    s.name().starts_with("sm80_conv2d_fprop_bf16_"),
                    "{}",
                    s.name()
                );
                assert!(s.name().contains("_fixedc8_bias"), "{}", s.name());
                assert_eq!(s.name().ends_with("_for_sm80"), arch == Arch::Sm80);
            }
            // Tile heights in turns, as for the other families.
            assert_ne!(all[0].conv_tile[0], all[1].conv_tile[0]);
        }
        // tf32: one pixel's 4 channels an access (tile K, a multiple of 8, holds whole pixels).
        let f32_stem = ConvProblem {
            dtype: DType::F32,
            ..stem.clone()
        };
        let f32s = candidates(&f32_stem, MathType::Tf32, Arch::Sm90).unwrap();
        assert_eq!(f32s[0].conv_fixed_channels, Some(4));
        assert_eq!(
            f32s.iter()
                .filter(|s| s.conv_fixed_channels.is_some())
                .count(),
            sm80_tiles(DType::F32).len()
        );
        // What the fixed-channels kernels refuse: another channel count, no warps and stages.
        let good = f32s[0].clone();
        for (bad, why) in [
            (
                ConvSpec {
                    conv_fixed_channels: Some(2),
                    ..good.clone()
                },
                "fixed channels 2: one 16-byte access a pixel, 4 f32 channels",
            ),
            (
                ConvSpec {
                    conv_warps: None,
                    conv_stages: None,
                    ..good.clone()
                },
                "the fixed-channels kernels are CUTLASS 2's: warps and stages",
            ),
        ] {
            assert_eq!(bad.invalid_reason().as_deref(), Some(why));
        }
        // K = 3 (an image-to-image model's last convolution): the output cannot be padded.
        let rgb_out = ConvProblem {
            out_channels: 3,
            ..problem()
        };
        assert!(!kernels_take(&rgb_out));
        let why = candidates(&rgb_out, MathType::Bf16, Arch::Sm90).unwrap_err();
        assert!(
            why.contains("K = 3 output channels must be a multiple of 8"),
            "{why}"
        );
    }

    #[test]
    fn problems_no_kernel_takes_say_why() {
        assert!(kernels_take(&problem()));
        let f32 = ConvProblem {
            dtype: DType::F32,
            ..problem()
        };
        assert!(candidates(&f32, MathType::Tf32x3, Arch::Sm90)
            .unwrap_err()
            .contains("3xTF32"));
        assert!(sm90([512, 128, 64], [1, 1, 1])
            .invalid_reason()
            .unwrap()
            .contains("tile M"));
        assert!(sm90([128, 128, 64], [2, 2, 1])
            .invalid_reason()
            .unwrap()
            .contains("cluster"));
        let bad80 = ConvSpec {
            arch: Arch::Sm80,
            conv_warps: Some([2, 2, 1]),
            conv_stages: Some(12),
            ..sm90([128, 128, 64], [1, 1, 1])
        };
        assert!(bad80.invalid_reason().unwrap().contains("stages"));
        assert!(ConvSpec {
            arch: Arch::Sm80,
            ..sm90([128, 128, 64], [1, 1, 1])
        }
        .invalid_reason()
        .unwrap()
        .contains("warps and stages"));
    }

    /// mobilenet_v3's 3x3 stride-1 depthwise convolution on 112x112 (features.1: 16 channels)
    /// at batch 32, with its folded BatchNorm and ReLU.
    fn depthwise(dtype: DType) -> ConvProblem {
        ConvProblem {
            images: 32,
            height: 112,
            width: 112,
            in_channels: 16,
            out_channels: 16,
            filter: [3, 3],
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 16,
            dtype,
            bias: true,
            residual: false,
            act: Some(ConvAct::Relu),
        }
    }

    #[test]
    fn depthwise_problems_take_the_generators_direct_kernels_at_their_filter() {
        let p = depthwise(DType::Bf16);
        assert!(is_depthwise(&p) && kernels_take(&p) && refusal(&p, MathType::Bf16).is_none());
        let specs = candidates(&p, MathType::Bf16, Arch::Sm80).unwrap();
        // 16 channels: only the tiles of 16 channels a CTA (8x8 and 4x4 pixels), each compiled
        // for stride 1 and reading the stride at run time.
        assert_eq!(specs.len(), 4, "{specs:#?}");
        assert!(specs.iter().all(|s| s.conv_tile[2] == 16
            && s.conv_depthwise.map(|d| d.filter) == Some([3, 3])
            && s.invalid_reason().is_none()));
        let names: std::collections::BTreeSet<String> = specs.iter().map(ConvSpec::name).collect();
        assert_eq!(names.len(), 4, "names are identities");
        assert!(
            names.contains(
                "sm80_dwconv2d_fprop_bf16_8x8x16_r3x3_stride1x1_4x1x1_s3_bias_relu_for_sm80"
            ),
            "{names:?}"
        );
        assert!(names.contains(
            "sm80_dwconv2d_fprop_bf16_4x4x16_r3x3_anystride_4x1x1_s4_bias_relu_for_sm80"
        ));
        // On an sm90 GPU the same sm80 code, built for sm90: the names lose `_for_sm80` alone.
        let on90: Vec<String> = candidates(&p, MathType::Bf16, Arch::Sm90)
            .unwrap()
            .iter()
            .map(ConvSpec::name)
            .collect();
        assert_eq!(
            on90,
            specs
                .iter()
                .map(|s| s.name().replace("_for_sm80", ""))
                .collect::<Vec<_>>()
        );
        // f32 multiplies in fp32 (SIMT), under either policy: the name says f32, not tf32.
        let f32 = depthwise(DType::F32);
        for math in [MathType::Tf32, MathType::Tf32x3] {
            let s = candidates(&f32, math, Arch::Sm90).unwrap();
            assert!(
                s[0].name().starts_with("sm80_dwconv2d_fprop_f32_"),
                "{}",
                s[0].name()
            );
        }
        // convnext's 7x7 on 96 channels: tiles of 16 and 32 channels (not 64: 96 is no multiple).
        let convnext = ConvProblem {
            in_channels: 96,
            out_channels: 96,
            groups: 96,
            height: 56,
            width: 56,
            filter: [7, 7],
            padding: [3, 3],
            act: None,
            ..p.clone()
        };
        let c = candidates(&convnext, MathType::Bf16, Arch::Sm90).unwrap();
        assert_eq!(c.len(), 8);
        assert!(c.iter().all(|s| s.conv_tile[2] != 64));
        // A stride of 3 has no fixed variant: run-time stride alone.
        let s3 = ConvProblem {
            stride: [3, 3],
            ..p.clone()
        };
        assert!(candidates(&s3, MathType::Bf16, Arch::Sm80)
            .unwrap()
            .iter()
            .all(|s| s.conv_depthwise.unwrap().stride.is_none()));
    }

    #[test]
    fn depthwise_problems_no_direct_kernel_takes_say_why() {
        let p = depthwise(DType::Bf16);
        let with_residual = ConvProblem {
            residual: true,
            ..p.clone()
        };
        assert!(refusal(&with_residual, MathType::Bf16)
            .unwrap()
            .contains("residual add after a depthwise"));
        let big = ConvProblem {
            filter: [9, 9],
            padding: [4, 4],
            ..p.clone()
        };
        assert!(refusal(&big, MathType::Bf16).unwrap().contains("up to 7x7"));
        let gelu_tanh = ConvProblem {
            act: Some(ConvAct::GeluTanh),
            dtype: DType::F32,
            ..p.clone()
        };
        assert!(refusal(&gelu_tanh, MathType::Tf32).is_none());
        assert!(refusal(&gelu_tanh, MathType::Tf32x3)
            .unwrap()
            .contains("tanh approximation"));
        let grouped = ConvProblem {
            groups: 4,
            ..p.clone()
        };
        assert!(!is_depthwise(&grouped));
        assert!(refusal(&grouped, MathType::Bf16)
            .unwrap()
            .contains("a grouped convolution"));
        let spec = candidates(&p, MathType::Bf16, Arch::Sm80)
            .unwrap()
            .remove(0);
        for (bad, why) in [
            (
                ConvSpec {
                    residual: true,
                    ..spec.clone()
                },
                "residual",
            ),
            (
                ConvSpec {
                    conv_tile: [8, 8, 128],
                    ..spec.clone()
                },
                "channels a CTA",
            ),
            (
                ConvSpec {
                    conv_tile: [5, 5, 16],
                    ..spec.clone()
                },
                "warps",
            ),
            (
                ConvSpec {
                    conv_stages: Some(6),
                    ..spec.clone()
                },
                "stages",
            ),
        ] {
            assert!(bad.invalid_reason().unwrap().contains(why), "{why}");
        }
    }
}
