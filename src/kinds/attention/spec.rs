//! Attention kernels: CUTLASS's fused multi-head attention forward (examples/41, xFormers'
//! memory-efficient kernel: sm80 mma.sync code that runs on sm90). One CTA owns
//! `queries_per_block` queries of one (batch, head) and streams the keys in blocks of
//! `keys_per_block`, keeping the running max and sum of the online softmax; `max_k` bounds the head
//! dim, and when it is at most `keys_per_block` the output stays in registers for one pass over the
//! values. fp32 tensors run on tf32 tensor cores (1xTF32 under the tf32 policy, CUTLASS's 3xTF32
//! `OpMultiplyAddFastF32` under the fp32-accurate one); bf16 and fp16 directly.
//!
//! bf16 and fp16 also run on CUTLASS's sm90 attention (examples/88_hopper_fmha): TMA loads and
//! WGMMA, a producer warp group feeding two consumer warp groups that split the query block. The
//! mask is compiled in there (causal, or only the tail of the last key block), so it is part of the
//! kernel. Both families are candidates for bf16/fp16; the tuner picks by measurement.
//!
//! Grouped-query heads (k/v with Hq/G heads) are read in place by both: sm80 steps a CTA's k/v
//! pointers to head h / G, sm90's producer loads k/v head h / G, so one kernel serves both (its
//! one-CTA-per-tile schedule excepted). Per-sequence key lengths (a key-padding mask) are an
//! argument of every sm80 kernel (examples/41's `num_keys` per CTA) and compiled into sm90's
//! (`_klen`: the key loop runs to the batch's length and its fusion masks past it).

use super::AttentionProblem;
use crate::types::{Arch, DType, MathType};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttentionSpec {
    pub arch: Arch,
    pub dtype: DType,
    pub math: MathType,
    pub queries_per_block: u32,
    pub keys_per_block: u32,
    /// The largest head dim the kernel takes (the sm90 family's head-dim tile).
    pub max_k: u32,
    /// Absent in entries written before the sm90 family existed: those are sm80 kernels.
    #[serde(default, skip_serializing_if = "AttentionFamily::is_sm80")]
    pub family: AttentionFamily,
    /// The kernel adds a bias tensor to the scaled scores (examples/41's `kSupportsBias`, sm80
    /// only): `_bias`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bias: bool,
}

/// examples/88's K/V pipeline stages (`kStagesKV`'s default).
const SM90_KV_STAGES: u32 = 5;

/// Which CUTLASS attention kernel a spec instantiates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionFamily {
    /// examples/41 (templates/sm80_fmha.cu.hbs): causal is a runtime argument.
    #[default]
    Sm80,
    /// examples/88 (templates/sm90_fmha.cu.hbs): the schedule and the mask are compiled in.
    Sm90 {
        schedule: Sm90Schedule,
        causal: bool,
        /// fact's consumer loop (templates/sm90_fmha.cu.hbs, `overlapped`): a key block's
        /// softmax runs while the previous block's P·V product is on the tensor cores.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        overlap: bool,
        /// Four Q stages (examples/88's `kStagesQ`; two by default): a persistent CTA loads the
        /// next tile's queries while it works on this one.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        prefetch_q: bool,
        /// Each sequence's keys end at a length read from the device (`_klen`): the key loop of a
        /// tile runs to its batch's length and masks past it (a key-padding mask).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        key_lengths: bool,
    },
}

impl AttentionFamily {
    pub fn is_sm80(&self) -> bool {
        *self == AttentionFamily::Sm80
    }
}

/// The sm90 kernel's schedule (examples/88's dispatch policies).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sm90Schedule {
    /// One CTA per query block; the two consumer warp groups share each key block.
    Cooperative,
    /// A persistent grid, Q loaded by its own producer warp (examples/88's tile order).
    Pingpong,
    /// examples/88's persistent grid in fact's tile order (templates/sm90_fmha.cu.hbs,
    /// `RotatedTileScheduler`): each (batch, head)'s query blocks stay adjacent, rotated by the
    /// (batch, head) index, so a CTA stepping by the grid size meets every query block in turn.
    /// With examples/88's order a grid that is a multiple of the query-block count hands each CTA
    /// one query block for the whole run: under a causal mask, one length of work (132 SMs and 4
    /// blocks: some CTAs do four times the work of others).
    Persistent,
    /// examples/88's persistent grid in fact's paired tile order (templates/sm90_fmha.cu.hbs,
    /// `PairedTileScheduler`), for a causal mask, under which query block m of M has m + 1 key
    /// blocks: a CTA takes blocks M-1-j and j of one (batch, head) in a row, so every CTA's pairs
    /// cost the same M + 1 key blocks. In the rotated order the busiest CTA does 1.13x the mean
    /// work at GPT-2 small's 16·12 heads of 8 blocks on 132 SMs; paired, 1.03x.
    Paired,
}

impl Sm90Schedule {
    pub fn short_name(self) -> &'static str {
        match self {
            Sm90Schedule::Cooperative => "coop",
            Sm90Schedule::Pingpong => "pingpong",
            Sm90Schedule::Persistent => "persist",
            Sm90Schedule::Paired => "pair",
        }
    }
    /// CUTLASS's dispatch policy.
    pub fn cutlass_policy(self) -> &'static str {
        match self {
            Sm90Schedule::Cooperative => "KernelTmaWarpSpecializedCooperative",
            Sm90Schedule::Pingpong | Sm90Schedule::Persistent | Sm90Schedule::Paired => {
                "KernelTmaWarpSpecializedPingpong"
            }
        }
    }

    /// Whether one CTA per SM walks the tiles (examples/88's `kIsPersistent`).
    pub fn persistent(self) -> bool {
        self != Sm90Schedule::Cooperative
    }

    /// The persistent grid's tile scheduler as the template names it, and its order in words.
    pub fn tile_scheduler(self) -> (&'static str, &'static str) {
        match self {
            Sm90Schedule::Cooperative | Sm90Schedule::Pingpong => {
                ("Scheduler", "examples/88's tile order")
            }
            Sm90Schedule::Persistent => ("RotatedTileScheduler", "fact's rotated tile order"),
            Sm90Schedule::Paired => ("PairedTileScheduler", "fact's paired tile order"),
        }
    }
}

/// The (query block, key block) pairs for a head-dim tile, bf16/fp16 with fp32 accumulators.
/// examples/88's forward pass runs 128x64 (d 32, 64 and, without fp8, 256) and 128x128 (d 128).
/// Left out: its non-warp-specialized `KernelTma` (64x128, d 32/64), whose mainloop is another
/// collective; 128x256 at d 128 and 128x128 at d 256 (its fp8 ones), whose five pipeline stages of
/// K and V (320 KiB) do not fit in shared memory. At d 256 the 128x64 block's five stages fit one
/// CTA only without a persistent CTA's output buffers; the persistent grids take fewer
/// (`kv_stages`). Added: the 128 tile's blocks with a 96 head-dim tile (GPT's head dim), which the
/// example does not run (the 128 tile spends a quarter of its products on padding there), and
/// 128x128 at d 32 and 64: twice the keys per softmax step, 1.1x faster than 128x64 at d 64
/// (benches/results/attention90/schedules, where 128x256 and three consumer warp groups over 192
/// queries measured slower and are not swept).
fn sm90_blocks(max_k: u32) -> &'static [(u32, u32)] {
    match max_k {
        32 | 64 => &[(128, 128), (128, 64)],
        96 | 128 => &[(128, 128)],
        256 => &[(128, 64)],
        _ => &[],
    }
}

/// The variants each block is swept with, in sweep order: (schedule, overlap, prefetch_q).
/// Measured on the H100 (benches/results/attention90/schedules): the persistent grid in fact's
/// tile order ran bf16 attention 1.15–1.30x faster than one CTA per query block; examples/88's
/// own persistent order matched it without a mask and lost 1.4x with the causal one, and turns at
/// the softmax (`kIsMainloopLocked`, and FlashAttention-3's turns at the products in the
/// overlapped loop) were 1–4% slower, so neither is swept (table entries of the former still
/// build). Under a causal mask the paired order runs GPT-2 small 1.08x faster than the rotated
/// one, which it replaces there. The overlapped loop and the next tile's queries gained 0.5–5%
/// each, not on every shape, so they are swept rather than fixed.
fn sm90_variants(causal: bool) -> [(Sm90Schedule, bool, bool); 5] {
    let order = if causal {
        Sm90Schedule::Paired
    } else {
        Sm90Schedule::Persistent
    };
    [
        (order, true, true),
        (order, true, false),
        (order, false, true),
        (order, false, false),
        (Sm90Schedule::Cooperative, false, false),
    ]
}

impl AttentionSpec {
    /// The kernel's identity, e.g. `sm80_fmha_tf32_f32_q64_k64_d64` or
    /// `sm90_fmha_bf16_bf16_q128_k64_d64_coop_causal` (built for sm90; `_klen` after the mask for
    /// the key-length kernels), and
    /// `sm80_fmha_tf32_f32_q64_k64_d64_for_sm80` (built for sm80), `sm80_fmha_bf16_bf16_q64_k64_d64_bias`
    /// (adding a bias tensor): symbol, table value and build-cache key.
    pub fn name(&self) -> String {
        let base = format!(
            "{}_{}_q{}_k{}_d{}",
            self.math.short_name(),
            self.dtype.short_name(),
            self.queries_per_block,
            self.keys_per_block,
            self.max_k
        );
        let kernel = match self.family {
            AttentionFamily::Sm80 => format!("sm80_fmha_{base}"),
            AttentionFamily::Sm90 {
                schedule,
                causal,
                overlap,
                prefetch_q,
                key_lengths,
            } => {
                let stages = self
                    .fewer_kv_stages()
                    .map_or(String::new(), |n| format!("_kv{n}"));
                format!(
                    "sm90_fmha_{base}{stages}_{}{}{}_{}{}",
                    schedule.short_name(),
                    if overlap { "_ovl" } else { "" },
                    if prefetch_q { "_pq" } else { "" },
                    if causal { "causal" } else { "full" },
                    if key_lengths { "_klen" } else { "" }
                )
            }
        };
        let bias = if self.bias { "_bias" } else { "" };
        format!("{kernel}{bias}{}", self.arch.name_suffix())
    }

    /// Warps per CTA: one per 32×32 block of the score tile.
    pub fn warps(&self) -> u32 {
        self.queries_per_block * self.keys_per_block / 1024
    }

    /// The sm90 kernel's shared memory, roughly (the collective's buffers, not its barriers):
    /// Q stages of 64 queries per consumer warp group, `kv_stages` K/V stages, and a persistent
    /// CTA's output buffers beside them.
    fn sm90_smem_bytes(&self, schedule: Sm90Schedule, prefetch_q: bool, kv_stages: u32) -> u32 {
        let e = self.dtype.bytes() as u32;
        let q_stages = if prefetch_q { 4 } else { 2 };
        let q = q_stages * 64 * self.max_k * e;
        let kv = kv_stages * self.keys_per_block * self.max_k * e;
        let out = if schedule.persistent() {
            self.queries_per_block * self.max_k * e
        } else {
            0
        };
        q + kv + out
    }

    /// The sm90 kernel's K/V pipeline stages: examples/88's five, or at the 256 head-dim tile,
    /// where those overflow an sm90 CTA's shared memory on a persistent grid (its output buffers
    /// sit beside the mainloop's), the most that fit, at least two; `_kvN` in the name when not
    /// five. The smaller tiles keep five, the measured kernels: fewer would add variants (their
    /// four Q stages) that were never weighed. None for the sm80 family, or where none fit.
    pub fn kv_stages(&self) -> Option<u32> {
        let AttentionFamily::Sm90 {
            schedule,
            prefetch_q,
            ..
        } = self.family
        else {
            return None;
        };
        let limit = Arch::Sm90.hardware().smem_per_cta;
        (self.fewest_kv_stages()..=SM90_KV_STAGES)
            .rev()
            .find(|&n| self.sm90_smem_bytes(schedule, prefetch_q, n) <= limit)
    }

    /// The fewest K/V stages `kv_stages` considers: two at the 256 tile, five below it.
    fn fewest_kv_stages(&self) -> u32 {
        if self.max_k > 128 {
            2
        } else {
            SM90_KV_STAGES
        }
    }

    /// `kv_stages` where fewer than examples/88's five: the name's `_kvN` and the render's
    /// `kStagesKV`.
    pub fn fewer_kv_stages(&self) -> Option<u32> {
        self.kv_stages().filter(|&n| n != SM90_KV_STAGES)
    }

    /// Whether the output stays in registers (one pass over the values, no accumulator buffer).
    pub fn single_value_pass(&self) -> bool {
        self.max_k <= self.keys_per_block
    }

    /// Why CUTLASS would reject this instantiation, if it would.
    pub fn invalid_reason(&self) -> Option<String> {
        match self.family {
            AttentionFamily::Sm80 => self.sm80_invalid_reason(),
            AttentionFamily::Sm90 {
                schedule,
                overlap,
                prefetch_q,
                ..
            } => {
                if self.bias {
                    return Some(format!(
                        "{}: the sm90 attention kernel adds no bias tensor; sm80_fmha does",
                        self.name()
                    ));
                }
                if self.arch != Arch::Sm90 {
                    return Some(format!("{}: the sm90 attention kernel needs sm90 (TMA, WGMMA); an {} build has sm80_fmha only", self.name(), self.arch));
                }
                if !matches!(
                    (self.dtype, self.math),
                    (DType::Bf16, MathType::Bf16) | (DType::F16, MathType::F16)
                ) {
                    // The P·V product would need P in tf32 operand order and V K-major.
                    return Some(format!("{}: the sm90 attention kernel computes bf16 or fp16 tensors only; fp32 runs on sm80_fmha", self.name()));
                }
                if (overlap || prefetch_q) && !schedule.persistent() {
                    return Some(format!("{}: the overlapped loop and the queries' prefetch are built for the persistent grid only", self.name()));
                }
                if self.kv_stages().is_none() {
                    let fewest = self.fewest_kv_stages();
                    let smem = self.sm90_smem_bytes(schedule, prefetch_q, fewest);
                    let limit = Arch::Sm90.hardware().smem_per_cta;
                    return Some(format!(
                        "{}: {} KiB of shared memory with {fewest} K/V stages, more than an sm90 CTA's {} KiB",
                        self.name(),
                        smem / 1024,
                        limit / 1024
                    ));
                }
                let blocks = (self.queries_per_block, self.keys_per_block);
                if !sm90_blocks(self.max_k).contains(&blocks) {
                    return Some(format!(
                        "{}: not an instantiation of examples/88 (head-dim tile 32, 64, 96, 128 or 256 with the blocks of sm90_blocks)",
                        self.name()
                    ));
                }
                None
            }
        }
    }

    fn sm80_invalid_reason(&self) -> Option<String> {
        let (q, k) = (self.queries_per_block, self.keys_per_block);
        if q % 32 != 0 || k % 32 != 0 || q == 0 || k == 0 {
            return Some(format!(
                "{}: query and key blocks must be multiples of 32",
                self.name()
            ));
        }
        if self.warps() > 16 {
            return Some(format!(
                "{}: {} warps per CTA, at most 16",
                self.name(),
                self.warps()
            ));
        }
        if !self.max_k.is_multiple_of(32) || self.max_k == 0 {
            return Some(format!(
                "{}: the head-dim bound must be a multiple of 32",
                self.name()
            ));
        }
        let fits_math = matches!(
            (self.dtype, self.math),
            (DType::F32, MathType::Tf32 | MathType::Tf32x3)
                | (DType::Bf16, MathType::Bf16)
                | (DType::F16, MathType::F16)
        );
        if !fits_math {
            return Some(format!(
                "{}: no attention kernel computes {} tensors with {} math",
                self.name(),
                self.dtype,
                self.math.short_name()
            ));
        }
        None
    }

    /// Whether the kernel takes the problem (its head dim fits, and for sm90 its mask, key
    /// lengths, grouped heads and query count; strides and alignment are checked per call).
    /// Grouped-query heads are an argument of every kernel but sm90's one-CTA-per-tile schedule,
    /// which loads q and k/v from one coordinate; key lengths one of every sm80 kernel and compiled
    /// into sm90's (`_klen`).
    pub fn fits(&self, p: &AttentionProblem) -> bool {
        let align = 16 / self.dtype.bytes() as i64;
        let grouped_ok = p.kv_heads.is_none_or(|kv| kv > 0 && p.heads % kv == 0);
        let head = p.dtype == self.dtype
            && p.head_dim as u32 <= self.max_k
            && p.head_dim % align == 0
            && grouped_ok
            && self.bias == p.bias.is_some();
        match self.family {
            AttentionFamily::Sm80 => head,
            // Any Tq (templates/sm90_fmha.cu.hbs drops examples/88's Tq % 8 check: TMA bounds
            // the last query block); its causal mask sees padded keys when Tq > Tk (the template
            // checks that per call too).
            AttentionFamily::Sm90 {
                causal,
                key_lengths,
                schedule,
                ..
            } => {
                head && causal == p.causal
                    && key_lengths == p.padded
                    && (p.kv_heads.is_none() || schedule.persistent())
                    && !(causal && p.seq_q > p.seq_k)
            }
        }
    }
}

/// The candidates for a problem: on sm90 for bf16/fp16 the sm90 kernels first (examples/88's
/// instantiations for the smallest head-dim tile that fits, and for head dims up to 32 those of
/// the 64 tile too; for head dims between 64 and 96 then the 96 tile's), then the sm80 ones (an
/// sm80 build has those alone); each kept where it is valid and takes the problem. A problem
/// with a bias tensor has the sm80 kernels alone, built to add it.
pub fn candidates(p: &AttentionProblem, math: MathType, arch: Arch) -> Vec<AttentionSpec> {
    let sm90 = if arch == Arch::Sm90 && p.bias.is_none() {
        sm90_shapes(p)
    } else {
        vec![]
    };
    sm90.into_iter()
        .chain(sm80_shapes(p))
        .map(
            |(queries_per_block, keys_per_block, max_k, family)| AttentionSpec {
                arch,
                dtype: p.dtype,
                math,
                queries_per_block,
                keys_per_block,
                max_k,
                family,
                bias: p.bias.is_some(),
            },
        )
        .filter(|s| s.invalid_reason().is_none() && s.fits(p))
        .collect()
}

/// A candidate's block shape: (queries per block, keys per block, head-dim bound, family).
type Shape = (u32, u32, u32, AttentionFamily);

fn sm90_shapes(p: &AttentionProblem) -> Vec<Shape> {
    let Some(tile) = [32u32, 64, 128, 256]
        .into_iter()
        .find(|&t| p.head_dim as u32 <= t)
    else {
        return vec![];
    };
    // The tight 96 tile first: it measured faster than the 128 tile at d 96
    // (benches/results/attention90).
    let tiles: &[u32] = match tile {
        32 => &[32, 64],
        128 if p.head_dim <= 96 => &[96, 128],
        _ => &[tile],
    };
    let mut shapes = vec![];
    for &max_k in tiles {
        for &(q, k) in sm90_blocks(max_k) {
            for (schedule, overlap, prefetch_q) in sm90_variants(p.causal) {
                let family = AttentionFamily::Sm90 {
                    schedule,
                    causal: p.causal,
                    overlap,
                    prefetch_q,
                    key_lengths: p.padded,
                };
                shapes.push((q, k, max_k, family));
            }
        }
    }
    shapes
}

/// The sm80 block shapes: those xFormers and torch ship for the head-dim bound that fits (64, 128
/// or 256), and their neighbours, ordered with the shipped ones first; for a head dim between
/// those bounds (GPT's 96) also the tight bound (the next multiple of 32), whose smaller
/// shared-memory stages may fit more CTAs on an SM.
fn sm80_shapes(p: &AttentionProblem) -> Vec<Shape> {
    let max_k = [64u32, 128, 256]
        .into_iter()
        .find(|&b| p.head_dim as u32 <= b);
    let Some(max_k) = max_k else { return vec![] };
    let blocks: &[(u32, u32)] = match max_k {
        64 => &[(64, 64), (32, 64), (128, 64), (64, 128), (32, 128)],
        128 => &[(32, 128), (64, 128), (64, 64), (32, 64), (128, 128)],
        _ => &[(32, 128), (64, 128), (64, 64)],
    };
    let tight = (p.head_dim as u32).div_ceil(32) * 32;
    let tight_blocks: &[(u32, u32)] = if tight < max_k && tight > 64 {
        &[(32, 128), (64, 128)]
    } else {
        &[]
    };
    blocks
        .iter()
        .map(|&(q, k)| (q, k, max_k, AttentionFamily::Sm80))
        .chain(
            tight_blocks
                .iter()
                .map(|&(q, k)| (q, k, tight, AttentionFamily::Sm80)),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(d: i64, dtype: DType) -> AttentionProblem {
        AttentionProblem {
            origin: crate::kinds::attention::AttentionOrigin::Explicit,
            batch: 128,
            heads: 8,
            seq_q: 512,
            seq_k: 512,
            head_dim: d,
            dtype,
            causal: true,
            kv_heads: None,
            padded: false,
            masked: false,
            bias: None,
            mask_strided: false,
        }
    }

    fn names(c: &[AttentionSpec], family: &str) -> Vec<String> {
        c.iter()
            .map(AttentionSpec::name)
            .filter(|n| n.starts_with(family))
            .collect()
    }

    #[test]
    fn head_dim_256_has_examples_88s_block_with_the_stages_that_fit() {
        // Gemma's heads: 256 wide, one K/V head for eight query heads, causal.
        let p = AttentionProblem {
            kv_heads: Some(1),
            ..problem(256, DType::Bf16)
        };
        let c = candidates(&p, MathType::Bf16, Arch::Sm90);
        let sm90 = names(&c, "sm90");
        assert_eq!(
            sm90,
            [
                "sm90_fmha_bf16_bf16_q128_k64_d256_kv3_pair_ovl_causal",
                "sm90_fmha_bf16_bf16_q128_k64_d256_kv3_pair_causal",
            ],
            "grouped heads take the persistent grids alone; four Q stages leave no room for two K/V stages"
        );
        assert!(
            !names(&c, "sm80").is_empty(),
            "the sm80 kernels stay candidates"
        );
        for s in c.iter().filter(|s| !s.family.is_sm80()) {
            let AttentionFamily::Sm90 {
                schedule,
                prefetch_q,
                ..
            } = s.family
            else {
                unreachable!()
            };
            let smem = s.sm90_smem_bytes(schedule, prefetch_q, s.kv_stages().unwrap());
            assert!(smem <= Arch::Sm90.hardware().smem_per_cta, "{}", s.name());
        }
        // Without grouped heads one CTA per tile fits examples/88's five stages.
        let full = candidates(&problem(256, DType::Bf16), MathType::Bf16, Arch::Sm90);
        assert!(names(&full, "sm90")
            .contains(&"sm90_fmha_bf16_bf16_q128_k64_d256_coop_causal".to_string()));
        // A head dim between 128 and 256 runs on the 256 tile; past 256 nothing does.
        assert!(names(
            &candidates(&problem(192, DType::Bf16), MathType::Bf16, Arch::Sm90),
            "sm90"
        )
        .iter()
        .all(|n| n.contains("_d256")));
        // The tiles at or below 128 keep examples/88's five stages and their names.
        for d in [32, 64, 96, 128] {
            let c = candidates(&problem(d, DType::Bf16), MathType::Bf16, Arch::Sm90);
            assert!(c
                .iter()
                .filter(|s| !s.family.is_sm80())
                .all(|s| s.kv_stages() == Some(5) && !s.name().contains("_kv")));
        }
    }

    #[test]
    fn a_bias_problem_has_the_sm80_bias_kernels_alone() {
        let p = AttentionProblem {
            origin: crate::kinds::attention::AttentionOrigin::Sdpa,
            causal: false,
            bias: Some(crate::kinds::attention::AttentionBias::Shared),
            ..problem(64, DType::Bf16)
        };
        let c = candidates(&p, MathType::Bf16, Arch::Sm90);
        assert!(!c.is_empty());
        assert!(c
            .iter()
            .all(|a| a.family == AttentionFamily::Sm80 && a.bias && a.name().ends_with("_bias")));
        // A bias kernel takes no problem without a bias, and a plain one no bias problem.
        let plain = AttentionProblem {
            bias: None,
            mask_strided: false,
            ..p.clone()
        };
        assert!(!c[0].fits(&plain));
        let unbiased = candidates(&plain, MathType::Bf16, Arch::Sm90);
        assert!(unbiased.iter().all(|a| !a.bias && !a.fits(&p)));
        // An sm90 kernel with a bias is no instantiation.
        let sm90 = unbiased.iter().find(|a| !a.family.is_sm80()).unwrap();
        assert!(AttentionSpec {
            bias: true,
            ..sm90.clone()
        }
        .invalid_reason()
        .unwrap()
        .contains("adds no bias"));
        // Old entries (no bias field) read as plain kernels.
        let old: AttentionSpec = serde_json::from_str(
            r#"{"arch":"sm90","dtype":"bf16","math":"bf16","queries_per_block":64,"keys_per_block":64,"max_k":64}"#,
        )
        .unwrap();
        assert!(!old.bias && !serde_json::to_string(&old).unwrap().contains("bias"));
    }

    #[test]
    fn an_sm80_build_has_the_sm80_kernels_alone_under_their_own_names() {
        for (dtype, math) in [(DType::Bf16, MathType::Bf16), (DType::F32, MathType::Tf32)] {
            let c = candidates(&problem(64, dtype), math, Arch::Sm80);
            assert!(
                !c.is_empty()
                    && c.iter()
                        .all(|a| a.family == AttentionFamily::Sm80
                            && a.name().ends_with("_for_sm80")),
                "{math:?}"
            );
            let on_sm90: Vec<String> = candidates(&problem(64, dtype), math, Arch::Sm90)
                .iter()
                .filter(|a| a.family == AttentionFamily::Sm80)
                .map(AttentionSpec::name)
                .collect();
            assert_eq!(
                c.iter()
                    .map(|a| a.name().replace("_for_sm80", ""))
                    .collect::<Vec<_>>(),
                on_sm90
            );
        }
        let sm90 = candidates(&problem(64, DType::Bf16), MathType::Bf16, Arch::Sm90).remove(0);
        assert!(AttentionSpec {
            arch: Arch::Sm80,
            ..sm90
        }
        .invalid_reason()
        .unwrap()
        .contains("needs sm90"));
    }

    #[test]
    fn bf16_and_f16_get_both_families_sm90_first() {
        for (d, tiles) in [
            (64, &["q128_k128_d64", "q128_k64_d64"][..]),
            (96, &["q128_k128_d96", "q128_k128_d128"][..]),
            (128, &["q128_k128_d128"][..]),
        ] {
            for causal in [true, false] {
                let p = AttentionProblem {
                    causal,
                    kv_heads: None,
                    padded: false,
                    masked: false,
                    bias: None,
                    mask_strided: false,
                    ..problem(d, DType::Bf16)
                };
                let c = candidates(&p, MathType::Bf16, Arch::Sm90);
                let mask = if causal { "causal" } else { "full" };
                // The paired tile order under a causal mask, the rotated one without.
                let order = if causal { "pair" } else { "persist" };
                let want: Vec<String> = tiles
                    .iter()
                    .flat_map(|t| {
                        // Four Q stages do not fit beside the 128 head-dim tile's K/V stages.
                        let pq = !t.ends_with("d128");
                        [
                            pq.then(|| format!("sm90_fmha_bf16_bf16_{t}_{order}_ovl_pq_{mask}")),
                            Some(format!("sm90_fmha_bf16_bf16_{t}_{order}_ovl_{mask}")),
                            pq.then(|| format!("sm90_fmha_bf16_bf16_{t}_{order}_pq_{mask}")),
                            Some(format!("sm90_fmha_bf16_bf16_{t}_{order}_{mask}")),
                            Some(format!("sm90_fmha_bf16_bf16_{t}_coop_{mask}")),
                        ]
                    })
                    .flatten()
                    .collect();
                assert_eq!(names(&c, "sm90"), want, "d {d} causal {causal}");
                assert!(
                    c[0].name().starts_with("sm90_"),
                    "sm90 kernels come first (a truncated sweep keeps them)"
                );
                assert!(!names(&c, "sm80").is_empty());
                assert!(c.iter().all(|s| s.invalid_reason().is_none() && s.fits(&p)));
            }
        }
        let c = candidates(&problem(64, DType::F16), MathType::F16, Arch::Sm90);
        assert_eq!(
            c[0].name(),
            "sm90_fmha_f16_f16_q128_k128_d64_pair_ovl_pq_causal"
        );
        // Head dims up to 32 also try the 64 tile.
        assert_eq!(
            names(
                &candidates(&problem(32, DType::Bf16), MathType::Bf16, Arch::Sm90),
                "sm90"
            )
            .len(),
            20
        );
    }

    #[test]
    fn sm90_is_not_a_candidate_where_it_cannot_run() {
        assert!(names(
            &candidates(&problem(64, DType::F32), MathType::Tf32, Arch::Sm90),
            "sm90"
        )
        .is_empty());
        assert!(names(
            &candidates(&problem(64, DType::F32), MathType::Tf32x3, Arch::Sm90),
            "sm90"
        )
        .is_empty());
        // Past the 256 tile, neither.
        let c = candidates(&problem(320, DType::Bf16), MathType::Bf16, Arch::Sm90);
        assert!(c.is_empty());
        // A query count that is not a multiple of 8, and T = 1: both families, as at 512.
        let at_512 = candidates(&problem(64, DType::Bf16), MathType::Bf16, Arch::Sm90).len();
        for t in [77, 1] {
            let p = AttentionProblem {
                seq_q: t,
                seq_k: t,
                ..problem(64, DType::Bf16)
            };
            let c = candidates(&p, MathType::Bf16, Arch::Sm90);
            assert!(
                !names(&c, "sm90").is_empty() && !names(&c, "sm80").is_empty() && c.len() == at_512,
                "T {t}"
            );
        }
        // Causal with more queries than keys would let late queries see padded keys.
        let p = AttentionProblem {
            seq_q: 512,
            seq_k: 256,
            ..problem(64, DType::Bf16)
        };
        assert!(names(&candidates(&p, MathType::Bf16, Arch::Sm90), "sm90").is_empty());
        let p = AttentionProblem { causal: false, ..p };
        assert_eq!(
            names(&candidates(&p, MathType::Bf16, Arch::Sm90), "sm90").len(),
            10
        );
        // A kernel built for one mask does not fit the other.
        let causal = &candidates(&problem(64, DType::Bf16), MathType::Bf16, Arch::Sm90)[0];
        assert!(!causal.fits(&AttentionProblem {
            causal: false,
            kv_heads: None,
            padded: false,
            masked: false,
            bias: None,
            mask_strided: false,
            ..problem(64, DType::Bf16)
        }));
    }

    #[test]
    fn old_entries_parse_as_sm80_and_sm90_specs_round_trip() {
        let old = r#"{"arch":"sm90","dtype":"f32","math":"tf32","queries_per_block":32,"keys_per_block":128,"max_k":96}"#;
        let a: AttentionSpec = serde_json::from_str(old).unwrap();
        assert_eq!(a.family, AttentionFamily::Sm80);
        assert_eq!(a.name(), "sm80_fmha_tf32_f32_q32_k128_d96");
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            old,
            "sm80 specs serialize as before"
        );
        let s = candidates(&problem(96, DType::Bf16), MathType::Bf16, Arch::Sm90).remove(0);
        let back: AttentionSpec =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        let spec: crate::kinds::Spec =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(
            spec.name(),
            "sm90_fmha_bf16_bf16_q128_k128_d96_pair_ovl_pq_causal"
        );
        // Entries of the rotated order under a causal mask (the paired one replaced it there)
        // still parse and build.
        let old = r#"{"arch":"sm90","dtype":"bf16","math":"bf16","queries_per_block":128,"keys_per_block":128,"max_k":96,"family":{"sm90":{"schedule":"persistent","causal":true,"overlap":true,"prefetch_q":true}}}"#;
        let a: AttentionSpec = serde_json::from_str(old).unwrap();
        assert_eq!(
            a.name(),
            "sm90_fmha_bf16_bf16_q128_k128_d96_persist_ovl_pq_causal"
        );
        assert!(a.invalid_reason().is_none());
        // Entries of examples/88's persistent order (no longer swept) still parse and build.
        let old = r#"{"arch":"sm90","dtype":"bf16","math":"bf16","queries_per_block":128,"keys_per_block":64,"max_k":64,"family":{"sm90":{"schedule":"pingpong","causal":true}}}"#;
        let a: AttentionSpec = serde_json::from_str(old).unwrap();
        assert_eq!(a.name(), "sm90_fmha_bf16_bf16_q128_k64_d64_pingpong_causal");
        assert!(a.invalid_reason().is_none());
    }

    #[test]
    fn candidates_take_the_smallest_head_dim_bound_and_valid_blocks() {
        let c = candidates(&problem(96, DType::F32), MathType::Tf32, Arch::Sm90);
        assert_eq!(c[0].name(), "sm80_fmha_tf32_f32_q32_k128_d128");
        assert!(c.iter().all(|s| s.invalid_reason().is_none()));
        assert_eq!(
            c.iter()
                .filter(|s| s.max_k == 96)
                .map(AttentionSpec::name)
                .collect::<Vec<_>>(),
            [
                "sm80_fmha_tf32_f32_q32_k128_d96",
                "sm80_fmha_tf32_f32_q64_k128_d96"
            ]
        );
        let c: Vec<AttentionSpec> =
            candidates(&problem(64, DType::Bf16), MathType::Bf16, Arch::Sm90)
                .into_iter()
                .filter(|s| s.family == AttentionFamily::Sm80)
                .collect();
        assert_eq!(c[0].name(), "sm80_fmha_bf16_bf16_q64_k64_d64");
        assert!(c.iter().all(|s| s.single_value_pass()));
        assert!(
            candidates(&problem(512, DType::F32), MathType::Tf32, Arch::Sm90).is_empty(),
            "head dims past 256 have no kernel"
        );
        // A head dim the 16-byte loads cannot take is no fit.
        assert!(candidates(&problem(36, DType::Bf16), MathType::Bf16, Arch::Sm90).is_empty());
    }

    #[test]
    fn invalid_instantiations_say_why() {
        let s = AttentionSpec {
            arch: Arch::Sm90,
            dtype: DType::F32,
            math: MathType::Bf16,
            queries_per_block: 64,
            keys_per_block: 64,
            max_k: 64,
            family: AttentionFamily::Sm80,
            bias: false,
        };
        assert!(s
            .invalid_reason()
            .unwrap()
            .contains("no attention kernel computes f32"));
        let s = AttentionSpec {
            math: MathType::Tf32,
            queries_per_block: 256,
            keys_per_block: 128,
            ..s
        };
        assert!(s.invalid_reason().unwrap().contains("32 warps"));
        let s = AttentionSpec {
            queries_per_block: 48,
            ..s
        };
        assert!(s.invalid_reason().unwrap().contains("multiples of 32"));
        let sm90 = AttentionFamily::Sm90 {
            schedule: Sm90Schedule::Cooperative,
            causal: true,
            overlap: false,
            prefetch_q: false,
            key_lengths: false,
        };
        let s = AttentionSpec {
            math: MathType::Tf32,
            queries_per_block: 128,
            keys_per_block: 64,
            family: sm90,
            ..s
        };
        assert!(s
            .invalid_reason()
            .unwrap()
            .contains("bf16 or fp16 tensors only; fp32 runs on sm80_fmha"));
        let s = AttentionSpec {
            dtype: DType::Bf16,
            math: MathType::Bf16,
            keys_per_block: 32,
            ..s
        };
        assert!(s
            .invalid_reason()
            .unwrap()
            .contains("not an instantiation of examples/88"));
        let s = AttentionSpec {
            keys_per_block: 128,
            max_k: 128,
            family: AttentionFamily::Sm90 {
                schedule: Sm90Schedule::Persistent,
                causal: true,
                overlap: false,
                prefetch_q: true,
                key_lengths: false,
            },
            ..s
        };
        assert!(s.invalid_reason().unwrap().contains(
            "256 KiB of shared memory with 5 K/V stages, more than an sm90 CTA's 227 KiB"
        ));
        let s = AttentionSpec {
            max_k: 96,
            family: AttentionFamily::Sm90 {
                schedule: Sm90Schedule::Cooperative,
                causal: true,
                overlap: true,
                prefetch_q: false,
                key_lengths: false,
            },
            ..s
        };
        assert!(s.invalid_reason().unwrap().contains("persistent grid only"));
    }

    /// A grouped-query problem (Llama's 16 query heads over 4 k/v heads).
    fn grouped(d: i64, dtype: DType, causal: bool) -> AttentionProblem {
        AttentionProblem {
            origin: crate::kinds::attention::AttentionOrigin::Sdpa,
            batch: 4,
            heads: 16,
            seq_q: 1024,
            seq_k: 1024,
            kv_heads: Some(4),
            causal,
            ..problem(d, dtype)
        }
    }

    #[test]
    fn grouped_heads_run_on_both_families_but_sm90s_one_cta_per_tile_schedule() {
        let p = grouped(128, DType::Bf16, true);
        let c = candidates(&p, MathType::Bf16, Arch::Sm90);
        // Grouped heads are an argument of the kernels: the same names as the ungrouped sweep's,
        // less the cooperative schedule (it loads q and k/v from one coordinate).
        let ungrouped: Vec<String> = candidates(
            &AttentionProblem {
                kv_heads: None,
                ..p.clone()
            },
            MathType::Bf16,
            Arch::Sm90,
        )
        .iter()
        .map(AttentionSpec::name)
        .filter(|n| !n.contains("_coop_"))
        .collect();
        assert_eq!(
            c.iter().map(AttentionSpec::name).collect::<Vec<_>>(),
            ungrouped
        );
        assert_eq!(
            names(&c, "sm90"),
            [
                "sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal",
                "sm90_fmha_bf16_bf16_q128_k128_d128_pair_causal"
            ]
        );
        assert!(!names(&c, "sm80").is_empty());
        let coop = AttentionSpec {
            family: AttentionFamily::Sm90 {
                schedule: Sm90Schedule::Cooperative,
                causal: true,
                overlap: false,
                prefetch_q: false,
                key_lengths: false,
            },
            ..c[0].clone()
        };
        assert!(coop.fits(&AttentionProblem {
            kv_heads: None,
            ..p.clone()
        }));
        assert!(!coop.fits(&p));
        // fp32 (tf32 and f32-accurate) grouped problems run on the sm80 family.
        for math in [MathType::Tf32, MathType::Tf32x3] {
            let c = candidates(&grouped(128, DType::F32, true), math, Arch::Sm90);
            assert!(
                !c.is_empty() && c.iter().all(|a| a.family.is_sm80()),
                "{math:?}"
            );
        }
        // Heads that k/v's do not divide fit no kernel.
        let odd = AttentionProblem {
            kv_heads: Some(3),
            ..p
        };
        assert!(candidates(&odd, MathType::Bf16, Arch::Sm90).is_empty());
    }

    #[test]
    fn padded_problems_take_sm90s_key_length_kernels_and_every_sm80_kernel() {
        for causal in [false, true] {
            let p = AttentionProblem {
                origin: crate::kinds::attention::AttentionOrigin::Sdpa,
                batch: 32,
                heads: 12,
                seq_q: 512,
                seq_k: 512,
                causal,
                padded: true,
                masked: false,
                bias: None,
                mask_strided: false,
                ..problem(64, DType::Bf16)
            };
            let c = candidates(&p, MathType::Bf16, Arch::Sm90);
            let sm90 = names(&c, "sm90");
            let mask = if causal { "causal_klen" } else { "full_klen" };
            assert_eq!(sm90.len(), 10, "{sm90:?}");
            assert!(sm90.iter().all(|n| n.ends_with(mask)), "{sm90:?}");
            let order = if causal { "pair" } else { "persist" };
            assert_eq!(
                sm90[0],
                format!("sm90_fmha_bf16_bf16_q128_k128_d64_{order}_ovl_pq_{mask}")
            );
            // sm80 kernels take lengths as an argument: the unpadded sweep's kernels.
            let unpadded = candidates(
                &AttentionProblem {
                    padded: false,
                    masked: false,
                    bias: None,
                    mask_strided: false,
                    ..p.clone()
                },
                MathType::Bf16,
                Arch::Sm90,
            );
            assert_eq!(names(&c, "sm80"), names(&unpadded, "sm80"));
            // A kernel without lengths does not fit a padded problem, nor the reverse.
            let plain = &unpadded[0];
            assert!(plain.name().starts_with("sm90_") && !plain.fits(&p));
            assert!(!c[0].fits(&AttentionProblem {
                padded: false,
                masked: false,
                bias: None,
                mask_strided: false,
                ..p.clone()
            }));
            // Grouped and padded at once: the persistent key-length kernels.
            let both = AttentionProblem {
                heads: 16,
                kv_heads: Some(4),
                ..p.clone()
            };
            let c = candidates(&both, MathType::Bf16, Arch::Sm90);
            assert!(names(&c, "sm90")
                .iter()
                .all(|n| n.ends_with(mask) && !n.contains("_coop_")));
            assert_eq!(names(&c, "sm90").len(), 8);
        }
        // The serialized spec names the lengths only where it takes them (older entries parse).
        let s = candidates(
            &AttentionProblem {
                padded: true,
                masked: false,
                bias: None,
                mask_strided: false,
                ..problem(64, DType::Bf16)
            },
            MathType::Bf16,
            Arch::Sm90,
        )
        .remove(0);
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"key_lengths\":true"), "{json}");
        assert_eq!(serde_json::from_str::<AttentionSpec>(&json).unwrap(), s);
    }

    #[test]
    fn head_dims_of_real_models_get_kernels_of_both_families() {
        // bf16 on sm90: 64 and 128 in their own tiles, 80 and 96 in the 96 tile first, then 128's
        // (the 128 tile's can_implement asks only d <= tile and d % 8 == 0).
        for (d, tiles) in [
            (64, &["d64"][..]),
            (80, &["d96", "d128"][..]),
            (96, &["d96", "d128"][..]),
            (128, &["d128"][..]),
        ] {
            for p in [
                problem(d, DType::Bf16),
                grouped(d, DType::Bf16, true),
                AttentionProblem {
                    padded: true,
                    masked: false,
                    bias: None,
                    mask_strided: false,
                    causal: false,
                    ..problem(d, DType::Bf16)
                },
            ] {
                let c = candidates(&p, MathType::Bf16, Arch::Sm90);
                let sm90 = names(&c, "sm90");
                assert!(!sm90.is_empty(), "d {d}");
                for n in &sm90 {
                    assert!(tiles.iter().any(|t| n.contains(&format!("_{t}_"))), "{n}");
                }
                assert!(!names(&c, "sm80").is_empty(), "d {d}");
                assert!(c.iter().all(|s| s.invalid_reason().is_none() && s.fits(&p)));
            }
            // fp32 under both policies: the sm80 family, its bound 64 or 128 and for 80 and 96
            // the tight 96 too.
            for math in [MathType::Tf32, MathType::Tf32x3] {
                let c = candidates(&grouped(d, DType::F32, true), math, Arch::Sm90);
                assert!(!c.is_empty() && c.iter().all(|s| s.family.is_sm80()));
                assert_eq!(
                    c.iter().any(|s| s.max_k == 96),
                    d == 80 || d == 96,
                    "d {d} {math:?}"
                );
            }
        }
    }
}
