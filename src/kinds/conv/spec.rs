//! The convolution kernel spec: an sm90 implicit-GEMM fprop through CUTLASS's conv collective
//! builder (TMA, warp-specialized GMMA; NHWC activations, KRSC filters), its epilogue the problem's
//! own: bias per output channel, the residual as the C operand (beta 1), the activation. Its name
//! is its identity: `sm90_conv2d_fprop_<math>_<tile>_<cluster>[_bias][_add][_<act>]`. Operands
//! are 16-byte aligned rows of channels (TMA's requirement), so C and K are multiples of 16 bytes.

use super::problem::{ConvAct, ConvProblem};
use crate::types::{Arch, DType};
use serde::{Deserialize, Serialize};

/// One convolution kernel. Its field names are none of another kind's spec (`conv_tile`,
/// `conv_cluster`), so an untagged table value parses as this kind only.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvSpec {
    pub arch: Arch,
    /// The tensors' type; f32 tensors multiply in tf32.
    pub dtype: DType,
    /// The CTA's tile of the implicit GEMM: output pixels × output channels × reduction.
    pub conv_tile: [u32; 3],
    pub conv_cluster: [u32; 3],
    pub bias: bool,
    pub residual: bool,
    pub act: Option<ConvAct>,
}

impl ConvSpec {
    /// `tf32` for f32 tensors, else the dtype.
    pub fn math_name(&self) -> &'static str {
        match self.dtype {
            DType::F32 => "tf32",
            d => d.short_name(),
        }
    }
    pub fn name(&self) -> String {
        let [tm, tn, tk] = self.conv_tile;
        let [cm, cn, ck] = self.conv_cluster;
        let mut s = format!(
            "sm90_conv2d_fprop_{}_{tm}x{tn}x{tk}_{cm}x{cn}x{ck}",
            self.math_name()
        );
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
        s
    }
    /// The elements of one 16-byte access: what C and K must be multiples of.
    pub fn align(&self) -> u32 {
        16 / self.dtype.bytes() as u32
    }
    /// Why CUTLASS's builder would refuse the kernel, if it would: a tile of 64 or 128 output
    /// pixels (one or two consumer warpgroups), 64 to 256 channels in steps of 16 (the GMMA's N),
    /// a reduction step of 128 bytes (four GMMAs' K, as CUTLASS's generator instantiates), clusters
    /// of 1 or 2 along one dim.
    pub fn invalid_reason(&self) -> Option<String> {
        let [tm, tn, tk] = self.conv_tile;
        let k_bytes = tk as usize * self.dtype.bytes();
        if !matches!(tm, 64 | 128) {
            return Some(format!("tile M {tm}: 64 or 128 output pixels"));
        }
        if !(64..=256).contains(&tn) || tn % 16 != 0 {
            return Some(format!("tile N {tn}: 64 to 256 channels in steps of 16"));
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
}

/// The tiles a first sweep tries for `p` on sm90, or why there are none.
pub fn candidates(p: &ConvProblem, arch: Arch) -> Result<Vec<ConvSpec>, String> {
    if arch != Arch::Sm90 {
        return Err(format!(
            "no {} convolution kernel: the first ones are sm90's",
            arch.short_name()
        ));
    }
    if p.groups != 1 {
        return Err(format!(
            "groups = {}: the kernels compute groups of 1",
            p.groups
        ));
    }
    let spec = |tile, cluster| ConvSpec {
        arch,
        dtype: p.dtype,
        conv_tile: tile,
        conv_cluster: cluster,
        bias: p.bias,
        residual: p.residual,
        act: p.act,
    };
    let align = spec([128, 128, 64], [1, 1, 1]).align() as i64;
    if p.in_channels % align != 0 || p.out_channels % align != 0 {
        return Err(format!(
            "C = {} and K = {} must be multiples of {align} (16-byte rows of channels, TMA's alignment)",
            p.in_channels, p.out_channels
        ));
    }
    // 128 bytes of reduction a stage: 64 bf16/fp16 elements or 32 tf32 ones.
    let deep = 128 / p.dtype.bytes() as u32;
    let mut out = vec![];
    for tile in [
        [128, 128, deep],
        [128, 256, deep],
        [128, 64, deep],
        [64, 128, deep],
    ] {
        for cluster in [[1, 1, 1], [2, 1, 1]] {
            let s = spec(tile, cluster);
            if s.invalid_reason().is_none() && (tile[1] as i64) <= p.out_channels.max(64) {
                out.push(s);
            }
        }
    }
    Ok(out)
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

    #[test]
    fn names_say_the_math_tile_cluster_and_epilogue() {
        let specs = candidates(&problem(), Arch::Sm90).unwrap();
        assert_eq!(
            specs[0].name(),
            "sm90_conv2d_fprop_bf16_128x128x64_1x1x1_bias_add_relu"
        );
        assert!(specs.iter().all(|s| s.invalid_reason().is_none()));
        let names: std::collections::BTreeSet<String> = specs.iter().map(ConvSpec::name).collect();
        assert_eq!(names.len(), specs.len(), "names are identities");
        let f32 = ConvSpec {
            dtype: DType::F32,
            conv_tile: [128, 128, 32],
            act: None,
            residual: false,
            ..specs[0].clone()
        };
        assert_eq!(f32.name(), "sm90_conv2d_fprop_tf32_128x128x32_1x1x1_bias");
        assert_eq!(f32.align(), 4);
    }

    #[test]
    fn problems_no_kernel_takes_say_why() {
        let stem = ConvProblem {
            in_channels: 3,
            ..problem()
        };
        assert!(candidates(&stem, Arch::Sm90)
            .unwrap_err()
            .contains("multiples of 8"));
        assert!(candidates(&problem(), Arch::Sm80)
            .unwrap_err()
            .contains("sm90"));
        let bad = ConvSpec {
            conv_tile: [256, 128, 64],
            ..candidates(&problem(), Arch::Sm90).unwrap()[0].clone()
        };
        assert!(bad.invalid_reason().unwrap().contains("tile M"));
    }
}
