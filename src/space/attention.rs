//! Attention kernels: CUTLASS's fused multi-head attention forward (examples/41, xFormers'
//! memory-efficient kernel: sm80 mma.sync code that runs on sm90). One CTA owns
//! `queries_per_block` queries of one (batch, head) and streams the keys in blocks of
//! `keys_per_block`, keeping the running max and sum of the online softmax; `max_k` bounds the head
//! dim, and when it is at most `keys_per_block` the output stays in registers for one pass over the
//! values. fp32 tensors run on tf32 tensor cores (1xTF32 under the tf32 policy, CUTLASS's 3xTF32
//! `OpMultiplyAddFastF32` under the fp32-accurate one); bf16 and fp16 directly.

use crate::rules::AttentionProblem;
use crate::types::{Arch, DType, MathType};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttentionSpec {
    pub arch: Arch,
    pub dtype: DType,
    pub math: MathType,
    pub queries_per_block: u32,
    pub keys_per_block: u32,
    /// The largest head dim the kernel takes.
    pub max_k: u32,
}

impl AttentionSpec {
    /// The kernel's identity, e.g. `sm80_fmha_tf32_f32_q64_k64_d64`: symbol, table value and
    /// build-cache key.
    pub fn name(&self) -> String {
        format!(
            "sm80_fmha_{}_{}_q{}_k{}_d{}",
            self.math.short_name(),
            self.dtype.short_name(),
            self.queries_per_block,
            self.keys_per_block,
            self.max_k
        )
    }

    /// Warps per CTA: one per 32×32 block of the score tile.
    pub fn warps(&self) -> u32 {
        self.queries_per_block * self.keys_per_block / 1024
    }

    /// Whether the output stays in registers (one pass over the values, no accumulator buffer).
    pub fn single_value_pass(&self) -> bool {
        self.max_k <= self.keys_per_block
    }

    /// Why CUTLASS would reject this instantiation, if it would.
    pub fn invalid_reason(&self) -> Option<String> {
        let (q, k) = (self.queries_per_block, self.keys_per_block);
        if q % 32 != 0 || k % 32 != 0 || q == 0 || k == 0 {
            return Some(format!("{}: query and key blocks must be multiples of 32", self.name()));
        }
        if self.warps() > 16 {
            return Some(format!("{}: {} warps per CTA, at most 16", self.name(), self.warps()));
        }
        if !self.max_k.is_multiple_of(32) || self.max_k == 0 {
            return Some(format!("{}: the head-dim bound must be a multiple of 32", self.name()));
        }
        let fits_math = matches!(
            (self.dtype, self.math),
            (DType::F32, MathType::Tf32 | MathType::Tf32x3) | (DType::Bf16, MathType::Bf16) | (DType::F16, MathType::F16)
        );
        if !fits_math {
            return Some(format!("{}: no attention kernel computes {} tensors with {} math", self.name(), self.dtype, self.math.short_name()));
        }
        None
    }

    /// Whether the kernel takes the problem (its head dim fits; strides and alignment are checked
    /// per call).
    pub fn fits(&self, p: &AttentionProblem) -> bool {
        p.dtype == self.dtype && p.head_dim as u32 <= self.max_k && p.head_dim % (16 / self.dtype.bytes() as i64) == 0
    }
}

/// The candidates for a problem: the block shapes xFormers and torch ship for the head-dim
/// bound that fits (64, 128 or 256), and their neighbours, ordered with the shipped ones first;
/// for a head dim between those bounds (GPT's 96) also the tight bound (the next multiple of 32),
/// whose smaller shared-memory stages may fit more CTAs on an SM.
pub fn candidates(p: &AttentionProblem, math: MathType, arch: Arch) -> Vec<AttentionSpec> {
    let max_k = [64u32, 128, 256].into_iter().find(|&b| p.head_dim as u32 <= b);
    let Some(max_k) = max_k else { return vec![] };
    let blocks: &[(u32, u32)] = match max_k {
        64 => &[(64, 64), (32, 64), (128, 64), (64, 128), (32, 128)],
        128 => &[(32, 128), (64, 128), (64, 64), (32, 64), (128, 128)],
        _ => &[(32, 128), (64, 128), (64, 64)],
    };
    let tight = (p.head_dim as u32).div_ceil(32) * 32;
    let tight_blocks: &[(u32, u32)] = if tight < max_k && tight > 64 { &[(32, 128), (64, 128)] } else { &[] };
    blocks
        .iter()
        .map(|&(q, k)| (q, k, max_k))
        .chain(tight_blocks.iter().map(|&(q, k)| (q, k, tight)))
        .map(|(q, k, max_k)| AttentionSpec { arch, dtype: p.dtype, math, queries_per_block: q, keys_per_block: k, max_k })
        .filter(|s| s.invalid_reason().is_none() && s.fits(p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(d: i64, dtype: DType) -> AttentionProblem {
        AttentionProblem { origin: crate::rules::attention::AttentionOrigin::Explicit, batch: 128, heads: 8, seq_q: 512, seq_k: 512, head_dim: d, dtype, causal: true }
    }

    #[test]
    fn candidates_take_the_smallest_head_dim_bound_and_valid_blocks() {
        let c = candidates(&problem(96, DType::F32), MathType::Tf32, Arch::Sm90);
        assert_eq!(c[0].name(), "sm80_fmha_tf32_f32_q32_k128_d128");
        assert!(c.iter().all(|s| s.invalid_reason().is_none()));
        assert_eq!(c.iter().filter(|s| s.max_k == 96).map(AttentionSpec::name).collect::<Vec<_>>(), ["sm80_fmha_tf32_f32_q32_k128_d96", "sm80_fmha_tf32_f32_q64_k128_d96"]);
        let c = candidates(&problem(64, DType::Bf16), MathType::Bf16, Arch::Sm90);
        assert_eq!(c[0].name(), "sm80_fmha_bf16_bf16_q64_k64_d64");
        assert!(c.iter().all(|s| s.single_value_pass()));
        assert!(candidates(&problem(512, DType::F32), MathType::Tf32, Arch::Sm90).is_empty(), "head dims past 256 have no kernel");
        // A head dim the 16-byte loads cannot take is no fit.
        assert!(candidates(&problem(36, DType::Bf16), MathType::Bf16, Arch::Sm90).is_empty());
    }

    #[test]
    fn invalid_instantiations_say_why() {
        let s = AttentionSpec { arch: Arch::Sm90, dtype: DType::F32, math: MathType::Bf16, queries_per_block: 64, keys_per_block: 64, max_k: 64 };
        assert!(s.invalid_reason().unwrap().contains("no attention kernel computes f32"));
        let s = AttentionSpec { math: MathType::Tf32, queries_per_block: 256, keys_per_block: 128, ..s };
        assert!(s.invalid_reason().unwrap().contains("32 warps"));
        let s = AttentionSpec { queries_per_block: 48, ..s };
        assert!(s.invalid_reason().unwrap().contains("multiples of 32"));
    }
}
