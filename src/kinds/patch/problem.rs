//! The patch-embedding problem: a convolution whose filter is its stride, with no padding,
//! dilation or groups (ViT's, DeiT's, BEiT's and Swin's patch embeddings, ConvNeXt's stem). Each
//! output pixel reads its own patch of the image and no other, so the convolution is one GEMM:
//! the image cut into patches, [N·P·Q, C·R·S] row-major, times the weight [K, C·R·S] as it lies
//! (`gemm_problem`). The rule that finds it is rule.rs.
//!
//! The key is not that GEMM's: a table entry says whether the kernel beats what the traced model
//! runs, and that is torch's convolution (cuDNN, with its layout conversions), not torch running
//! the GEMM. So the rule id is the kind's own (`patch_conv[_bias]`) and the shape key the
//! convolution's (`NxHxWxCxKxRxS`, as the convolution kind writes it).

use crate::kinds::gemm::{GemmLayout, GemmProblem};
use crate::types::DType;
use serde::{Deserialize, Serialize};

/// `y[n,k,p,q] = Σ_{c,r,s} x[n,c,p·R+r,q·S+s]·w[k,c,r,s] (+ b[k])`: a convolution of stride
/// `patch`, filter `patch`, no padding, dilation 1, groups 1. Rows and columns past the last whole
/// patch are not read (torch's convolution drops them too).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PatchProblem {
    /// N: images in the batch.
    pub images: i64,
    /// H, W: the input image.
    pub height: i64,
    pub width: i64,
    /// C: input channels.
    pub in_channels: i64,
    /// K: output channels.
    pub out_channels: i64,
    /// R, S: the patch, the filter and the stride alike.
    pub patch: [i64; 2],
    pub dtype: DType,
    pub bias: bool,
}

impl PatchProblem {
    pub fn rule_id(&self) -> String {
        format!("patch_conv{}", if self.bias { "_bias" } else { "" })
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
            self.patch[0],
            self.patch[1]
        )
    }

    /// P, Q: whole patches down and across.
    pub fn output(&self) -> [i64; 2] {
        [self.height / self.patch[0], self.width / self.patch[1]]
    }

    /// The GEMM's M, N and K: N·P·Q patches, K output channels, C·R·S values a patch.
    pub fn gemm_dims(&self) -> (i64, i64, i64) {
        let [p, q] = self.output();
        (
            self.images * p * q,
            self.out_channels,
            self.in_channels * self.patch[0] * self.patch[1],
        )
    }

    pub fn flops(&self) -> f64 {
        let (m, n, k) = self.gemm_dims();
        2.0 * m as f64 * n as f64 * k as f64
    }

    /// The GEMM the kernel computes: patches [M, K] row-major times the weight [N, K] read in
    /// place (rcr), the bias per output channel.
    pub fn gemm_problem(&self) -> GemmProblem {
        let (m, n, k) = self.gemm_dims();
        GemmProblem {
            m,
            n,
            k,
            layout: GemmLayout::Rcr,
            dtype: self.dtype,
            bias: self.bias,
            batch: 1,
            epilogue: None,
            padded_from: None,
        }
    }

    /// Sizes that make a convolution: every dim positive and at least one whole patch.
    pub fn check(&self) -> Result<(), String> {
        let dims = [
            self.images,
            self.height,
            self.width,
            self.in_channels,
            self.out_channels,
            self.patch[0],
            self.patch[1],
        ];
        if dims.iter().any(|&d| d <= 0) || self.output().contains(&0) {
            return Err(format!(
                "a patch embedding's sizes are positive and its image holds a whole patch: {}",
                self.shape_key()
            ));
        }
        Ok(())
    }

    /// The problem `patch_conv[_bias]` names at `NxHxWxCxKxRxS` (`fact realize`).
    pub fn from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<PatchProblem, String> {
        let bias = match rule {
            "patch_conv" => false,
            "patch_conv_bias" => true,
            _ => {
                return Err(format!(
                    "unknown rule '{rule}': use patch_conv or patch_conv_bias"
                ))
            }
        };
        let [images, height, width, in_channels, out_channels, r, s] = dims[..] else {
            return Err(format!(
                "{rule} takes NxHxWxCxKxRxS, e.g. 32x224x224x3x768x16x16 (ViT-B/16 at batch 32)"
            ));
        };
        let p = PatchProblem {
            images,
            height,
            width,
            in_channels,
            out_channels,
            patch: [r, s],
            dtype,
            bias,
        };
        p.check()?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_ids_shapes_and_the_gemm_read_back() {
        let p = PatchProblem::from_rule(
            "patch_conv_bias",
            &[32, 224, 224, 3, 768, 16, 16],
            DType::Bf16,
        )
        .unwrap();
        assert_eq!(p.rule_id(), "patch_conv_bias");
        assert_eq!(p.shape_key(), "32x224x224x3x768x16x16");
        assert_eq!(p.output(), [14, 14]);
        let g = p.gemm_problem();
        assert_eq!((g.m, g.n, g.k, g.bias), (32 * 196, 768, 768, true));
        assert_eq!(g.layout, GemmLayout::Rcr);
        // Rows past the last whole patch are dropped, as torch's convolution drops them.
        let odd =
            PatchProblem::from_rule("patch_conv", &[1, 230, 225, 3, 96, 4, 4], DType::F32).unwrap();
        assert_eq!(odd.output(), [57, 56]);
        assert_eq!(odd.gemm_dims(), (57 * 56, 96, 48));
        assert!(
            PatchProblem::from_rule("patch_conv", &[1, 3, 3, 3, 96, 4, 4], DType::F32)
                .unwrap_err()
                .contains("whole patch")
        );
        assert!(PatchProblem::from_rule("patch_conv", &[1, 224, 224, 3, 96], DType::F32).is_err());
        assert!(
            PatchProblem::from_rule("conv2d_s4_p0_d1", &[1, 8, 8, 3, 8, 4, 4], DType::F32).is_err()
        );
        // An entry of this kind is no GEMM problem, and no GEMM problem is one of these.
        let json = serde_json::to_string(&p).unwrap();
        assert!(serde_json::from_str::<GemmProblem>(&json).is_err());
        let gemm = serde_json::to_string(&g).unwrap();
        assert!(serde_json::from_str::<PatchProblem>(&gemm).is_err());
    }
}
