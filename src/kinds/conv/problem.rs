//! The convolution problem: what a convolution kernel computes, the pattern table's key (with
//! math and arch), its rule id and shape, and the problem a rule id names at a shape (`fact
//! realize`). The rule that finds it is rule.rs.
//!
//! A 2-D forward convolution is an implicit GEMM: M = N·P·Q output pixels, N = K output
//! channels, K = C·R·S (per group) reduction terms, where P×Q is the output image. The table key
//! is (rule id, shape, dtype, math, arch): the rule id carries stride, padding, dilation, groups
//! and the epilogue (`conv2d_s1_p1_d1_bias_relu`), the shape the sizes (`NxHxWxCxKxRxS`), so
//! bucket neighbours share every argument but the sizes. A BatchNorm the graph applies after the
//! convolution is not part of the problem: compose folds it into the weights and bias once, so
//! conv → bn → relu and conv(bias) → relu are one kernel's problem.

use crate::types::DType;
use serde::{Deserialize, Serialize};

/// The activation after the convolution's bias and residual add.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvAct {
    Relu,
    Silu,
    Hardswish,
    /// GELU with erf (`approximate='none'`).
    Gelu,
    /// GELU with the tanh approximation (`approximate='tanh'`).
    GeluTanh,
    /// ReLU6, `hardtanh(x, 0, 6)` (MobileNetV2's).
    Relu6,
    /// The logistic sigmoid (EfficientNet's and RegNetY's squeeze-excitation gates).
    Sigmoid,
    /// `hardsigmoid`, relu6(x + 3) / 6 (MobileNetV3's squeeze-excitation gate).
    Hardsigmoid,
}

impl ConvAct {
    pub const ALL: [ConvAct; 8] = [
        ConvAct::Relu,
        ConvAct::Silu,
        ConvAct::Hardswish,
        ConvAct::Gelu,
        ConvAct::GeluTanh,
        ConvAct::Relu6,
        ConvAct::Sigmoid,
        ConvAct::Hardsigmoid,
    ];
    /// Its name in rule ids and the plan.
    pub fn name(self) -> &'static str {
        match self {
            ConvAct::Relu => "relu",
            ConvAct::Silu => "silu",
            ConvAct::Hardswish => "hardswish",
            ConvAct::Gelu => "gelu",
            ConvAct::GeluTanh => "gelu_tanh",
            ConvAct::Relu6 => "relu6",
            ConvAct::Sigmoid => "sigmoid",
            ConvAct::Hardsigmoid => "hardsigmoid",
        }
    }
}

/// What a convolution kernel computes: y = act(conv(x, w) + bias[K] + residual), x [N,C,H,W],
/// w [K,C/groups,R,S], y and residual [N,K,P,Q]. The field names are none of another kind's, so
/// an untagged table entry parses as this kind only.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvProblem {
    /// N: images in the batch.
    pub images: i64,
    /// H, W: the input image.
    pub height: i64,
    pub width: i64,
    /// C: input channels.
    pub in_channels: i64,
    /// K: output channels.
    pub out_channels: i64,
    /// R, S: the filter's height and width.
    pub filter: [i64; 2],
    pub stride: [i64; 2],
    pub padding: [i64; 2],
    pub dilation: [i64; 2],
    pub groups: i64,
    pub dtype: DType,
    /// A bias per output channel: the convolution's own, the folded BatchNorm's, or both summed.
    pub bias: bool,
    /// A tensor of the output's shape added before the activation (a bottleneck's identity).
    pub residual: bool,
    pub act: Option<ConvAct>,
}

/// `2` where both dims agree, `2x1` where they do not.
fn pair(v: [i64; 2]) -> String {
    if v[0] == v[1] {
        v[0].to_string()
    } else {
        format!("{}x{}", v[0], v[1])
    }
}

fn parse_pair(s: &str) -> Option<[i64; 2]> {
    match s.split_once('x') {
        Some((a, b)) => Some([a.parse().ok()?, b.parse().ok()?]),
        None => {
            let v = s.parse().ok()?;
            Some([v, v])
        }
    }
}

impl ConvProblem {
    /// P, Q: the output image, as torch computes it.
    pub fn output(&self) -> [i64; 2] {
        let out = |i: usize, size: i64| {
            (size + 2 * self.padding[i] - self.dilation[i] * (self.filter[i] - 1) - 1)
                / self.stride[i]
                + 1
        };
        [out(0, self.height), out(1, self.width)]
    }
    /// The implicit GEMM (M, N, K) of one group: M = N·P·Q, N = K/groups, K = C/groups·R·S.
    pub fn gemm(&self) -> (i64, i64, i64) {
        let [p, q] = self.output();
        (
            self.images * p * q,
            self.out_channels / self.groups,
            self.in_channels / self.groups * self.filter[0] * self.filter[1],
        )
    }
    /// `conv2d_s<stride>_p<padding>_d<dilation>[_g<groups>][_bias][_add][_<act>]`, each pair one
    /// number where its dims agree (`s2`, `p3`) and `HxW` where not (`p1x0`).
    pub fn rule_id(&self) -> String {
        let mut id = format!(
            "conv2d_s{}_p{}_d{}",
            pair(self.stride),
            pair(self.padding),
            pair(self.dilation)
        );
        if self.groups != 1 {
            id += &format!("_g{}", self.groups);
        }
        if self.bias {
            id += "_bias";
        }
        if self.residual {
            id += "_add";
        }
        if let Some(a) = self.act {
            id += "_";
            id += a.name();
        }
        id
    }
    /// `NxHxWxCxKxRxS`.
    pub fn shape_key(&self) -> String {
        format!(
            "{}x{}x{}x{}x{}x{}x{}",
            self.images,
            self.height,
            self.width,
            self.in_channels,
            self.out_channels,
            self.filter[0],
            self.filter[1]
        )
    }
    /// The implicit GEMM's multiply-adds (two FLOPs each, all groups), and one operation per
    /// output element for each of bias, residual and activation.
    pub fn flops(&self) -> f64 {
        let (m, n, k) = self.gemm();
        let outputs = (m * n * self.groups) as f64;
        let epilogue = self.bias as i64 + self.residual as i64 + self.act.is_some() as i64;
        2.0 * outputs * k as f64 + outputs * epilogue as f64
    }
    /// The widest vector, in elements and at most 16 bytes, that both C/groups and K/groups
    /// divide: the channels-last loads and stores a kernel may use on every pixel of the model's
    /// tensors. A problem whose C the kernel pads (`kernel_channels`) keeps its own class, so a
    /// table entry of an aligned shape never serves it as a bucket neighbour.
    pub fn alignment(&self) -> u32 {
        let mut align = 16 / self.dtype.bytes() as u32;
        let (c, k) = (
            self.in_channels / self.groups,
            self.out_channels / self.groups,
        );
        while align > 1 && (c % align as i64 != 0 || k % align as i64 != 0) {
            align /= 2;
        }
        align
    }
    /// The input channels the kernel runs: C where its rows of channels are 16 bytes
    /// (`alignment`), else C rounded up to them (a stem's C = 3 to 8 in 16-bit types, 4 in
    /// fp32). Compose pads the weight with zero channels once and the op writes x into a
    /// zero-filled channels-last buffer of that many channels where it converts it, so the
    /// padded convolution is the model's exactly. Grouped convolutions are not padded.
    pub fn kernel_channels(&self) -> i64 {
        let row = 16 / self.dtype.bytes() as i64;
        if self.groups != 1 || self.in_channels % row == 0 {
            return self.in_channels;
        }
        (self.in_channels + row - 1) / row * row
    }
    /// Whether the kernel runs more input channels than the model has (`kernel_channels`).
    pub fn padded(&self) -> bool {
        self.kernel_channels() != self.in_channels
    }
    /// The problem the kernel runs: the model's with its input channels padded
    /// (`kernel_channels`). The table keys the model's problem (its bench's baseline is the
    /// model's convolution), the kernel's work is this one's.
    pub fn kernel_problem(&self) -> ConvProblem {
        ConvProblem {
            in_channels: self.kernel_channels(),
            ..self.clone()
        }
    }
    /// The problem a rule id names at a shape `NxHxWxCxKxRxS`.
    pub fn from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<ConvProblem, String> {
        let bad = || {
            format!(
                "unknown rule '{rule}': use conv2d_s<stride>_p<padding>_d<dilation>[_g<groups>][_bias][_add][_<act>], each of stride, padding and dilation one number or HxW, act one of relu, silu, hardswish, gelu, gelu_tanh (conv2d_s1_p1_d1_bias_relu)"
            )
        };
        let rest = rule.strip_prefix("conv2d_").ok_or_else(bad)?;
        let mut parts = rest.split('_').peekable();
        let mut field = |prefix: char| {
            parts
                .next()
                .and_then(|p| p.strip_prefix(prefix))
                .and_then(parse_pair)
        };
        let (stride, padding, dilation) = match (field('s'), field('p'), field('d')) {
            (Some(s), Some(p), Some(d)) => (s, p, d),
            _ => return Err(bad()),
        };
        let mut groups = 1;
        if let Some(g) = parts.peek().and_then(|p| p.strip_prefix('g')) {
            groups = g.parse().map_err(|_| bad())?;
            parts.next();
        }
        let mut bias = false;
        let mut residual = false;
        if parts.peek() == Some(&"bias") {
            bias = true;
            parts.next();
        }
        if parts.peek() == Some(&"add") {
            residual = true;
            parts.next();
        }
        let act_name = parts.collect::<Vec<_>>().join("_");
        let act = match act_name.as_str() {
            "" => None,
            a => Some(
                ConvAct::ALL
                    .into_iter()
                    .find(|x| x.name() == a)
                    .ok_or_else(bad)?,
            ),
        };
        let &[images, height, width, in_channels, out_channels, r, s] = dims else {
            return Err(format!(
                "{rule} takes a shape of 7 positive dims (NxHxWxCxKxRxS: images, input height and width, input channels, output channels, filter height and width), got {dims:?}"
            ));
        };
        let p = ConvProblem {
            images,
            height,
            width,
            in_channels,
            out_channels,
            filter: [r, s],
            stride,
            padding,
            dilation,
            groups,
            dtype,
            bias,
            residual,
            act,
        };
        p.check().map(|()| p)
    }
    /// Why the problem is no convolution torch would run, if it is not.
    pub fn check(&self) -> Result<(), String> {
        let positive = [self.images, self.height, self.width, self.in_channels]
            .into_iter()
            .chain([self.out_channels, self.groups])
            .chain(self.filter)
            .chain(self.stride)
            .chain(self.dilation)
            .all(|d| d > 0);
        if !positive || self.padding.iter().any(|&p| p < 0) {
            return Err(format!(
                "a convolution's sizes, strides, dilations and groups are positive and its padding is not negative: {self:?}"
            ));
        }
        if self.in_channels % self.groups != 0 || self.out_channels % self.groups != 0 {
            return Err(format!(
                "groups = {} divides neither C = {} nor K = {}",
                self.groups, self.in_channels, self.out_channels
            ));
        }
        let [p, q] = self.output();
        if p < 1 || q < 1 {
            return Err(format!(
                "the filter ({}x{} dilated by {}x{}) does not fit the padded {}x{} image",
                self.filter[0],
                self.filter[1],
                self.dilation[0],
                self.dilation[1],
                self.height,
                self.width
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// resnet50's layer1 3x3 convolution with its BatchNorm and ReLU, at batch 32.
    fn r50_3x3() -> ConvProblem {
        ConvProblem {
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
            dtype: DType::Bf16,
            bias: true,
            residual: false,
            act: Some(ConvAct::Relu),
        }
    }

    #[test]
    fn rule_ids_and_shapes_round_trip() {
        let base = r50_3x3();
        let variants = [
            base.clone(),
            ConvProblem {
                stride: [2, 1],
                padding: [3, 0],
                dilation: [2, 2],
                residual: true,
                act: Some(ConvAct::GeluTanh),
                ..base.clone()
            },
            ConvProblem {
                groups: 4,
                bias: false,
                act: None,
                ..base.clone()
            },
        ];
        for p in variants {
            let dims: Vec<i64> = p
                .shape_key()
                .split('x')
                .map(|d| d.parse().unwrap())
                .collect();
            assert_eq!(
                ConvProblem::from_rule(&p.rule_id(), &dims, DType::Bf16).unwrap(),
                p,
                "{}",
                p.rule_id()
            );
        }
        assert_eq!(base.rule_id(), "conv2d_s1_p1_d1_bias_relu");
        assert_eq!(base.shape_key(), "32x56x56x64x64x3x3");
        assert!(ConvProblem::from_rule("conv2d_s1_p1", &[1; 7], DType::F32)
            .unwrap_err()
            .contains("use conv2d_s"));
        assert!(
            ConvProblem::from_rule("conv2d_s1_p1_d1_tanh", &[1; 7], DType::F32)
                .unwrap_err()
                .contains("act one of")
        );
        assert!(
            ConvProblem::from_rule("conv2d_s1_p0_d1", &[1, 2, 3], DType::F32)
                .unwrap_err()
                .contains("NxHxWxCxKxRxS")
        );
        assert!(
            ConvProblem::from_rule("conv2d_s1_p0_d1", &[1, 2, 2, 4, 4, 3, 3], DType::F32)
                .unwrap_err()
                .contains("does not fit")
        );
    }

    #[test]
    fn a_convolution_is_an_implicit_gemm_over_output_pixels() {
        let p = r50_3x3();
        assert_eq!(p.output(), [56, 56]);
        assert_eq!(p.gemm(), (32 * 56 * 56, 64, 64 * 9));
        let m = (32 * 56 * 56 * 64) as f64;
        assert_eq!(p.flops(), 2.0 * m * 576.0 + 2.0 * m);
        // resnet50's stem: 7x7 stride 2 padding 3 on 224x224 gives 112x112.
        let stem = ConvProblem {
            height: 224,
            width: 224,
            in_channels: 3,
            filter: [7, 7],
            stride: [2, 2],
            padding: [3, 3],
            ..p.clone()
        };
        assert_eq!(stem.output(), [112, 112]);
        assert_eq!(stem.alignment(), 1, "three input channels");
        assert_eq!(p.alignment(), 8);
        assert!(!p.padded() && p.kernel_problem() == p);
        // The kernel runs the stem on 16-byte rows: 8 bf16 channels, 4 fp32 ones, the
        // implicit GEMM's K of the padded channels; the model's problem keeps its FLOPs.
        assert_eq!((stem.kernel_channels(), stem.padded()), (8, true));
        assert_eq!(stem.kernel_problem().gemm(), (32 * 112 * 112, 64, 8 * 49));
        assert_eq!(stem.gemm().2, 3 * 49);
        assert!(stem.kernel_problem().flops() > 2.6 * stem.flops());
        let f32_stem = ConvProblem {
            dtype: DType::F32,
            ..stem.clone()
        };
        assert_eq!(f32_stem.kernel_channels(), 4);
        assert_eq!(
            ConvProblem {
                in_channels: 12,
                ..stem.clone()
            }
            .kernel_channels(),
            16
        );
        let dilated = ConvProblem {
            dilation: [2, 2],
            padding: [2, 2],
            stride: [2, 2],
            ..p.clone()
        };
        assert_eq!(dilated.output(), [28, 28]);
        let grouped = ConvProblem {
            groups: 32,
            in_channels: 128,
            out_channels: 128,
            ..p
        };
        assert_eq!(grouped.gemm(), (32 * 56 * 56, 4, 4 * 9));
        assert_eq!(grouped.alignment(), 4, "four channels a group");
        let odd_groups = ConvProblem {
            groups: 3,
            in_channels: 9,
            out_channels: 24,
            ..grouped
        };
        assert_eq!(
            odd_groups.kernel_channels(),
            9,
            "grouped convolutions are not padded"
        );
    }
}
