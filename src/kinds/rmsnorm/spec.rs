//! RMSNorm kernels (rmsnorm.cu.hbs in this folder): fact's own, no CUTLASS. A group of `threads`
//! threads owns one row and holds it in registers: each thread loads `vector` elements per load
//! (16 bytes at most), ⌈C / (threads·vector)⌉ loads in flight, the group sums the squares (warp
//! shuffles, shared memory across the group's warps) and writes the scaled row: one read of x and
//! one write of y, the floor an RMSNorm can reach. A CTA holds `rows_per_block` groups. C is
//! compiled in, so the loops unroll and the row is an array of known size; a kernel takes only its
//! C and dtype. A kernel for the residual add before the norm (`add`, the add's dtypes compiled
//! in, `_add` in the name) reads both operands instead of x and writes their sum where asked. The knobs (threads per row, rows per CTA, vector width) decide how close the grid
//! gets to the DRAM rate, which measurement settles.

use super::RmsNormProblem;
use crate::kinds::rows::RowReads;
use crate::rules::residual::AddDtypes;
use crate::types::{Arch, DType};
use serde::{Deserialize, Serialize};

/// The most elements one thread holds: past this the row spills out of registers.
pub const MAX_PER_THREAD: u32 = 64;
/// The most elements a candidate holds per thread, and so the longest row a candidate takes:
/// one CTA of 1024 threads.
pub const CANDIDATE_PER_THREAD: u32 = 32;
pub const MAX_ROW: u32 = 1024 * CANDIDATE_PER_THREAD;

/// An RMSNorm kernel. Its field names are none of the LayerNorm spec's (`threads`,
/// `rows_per_block`), so an untagged spec reads back as this kind's only.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RmsNormSpec {
    pub arch: Arch,
    pub dtype: DType,
    /// C: the normalized dim, compiled in.
    pub cols: u32,
    /// Threads that share one row: a power of two up to a warp, or whole warps.
    pub threads: u32,
    /// Elements per load (16 bytes at most).
    pub vector: u32,
    /// Rows (thread groups) per CTA.
    pub rows_per_block: u32,
    /// The residual add before the norm: its dtypes (absent from the serde form without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add: Option<AddDtypes>,
    /// The order of the row's reads (absent from the serde form for the default).
    #[serde(default, skip_serializing_if = "RowReads::is_in_turn")]
    pub reads: RowReads,
}

impl RmsNormSpec {
    /// The kernel's identity, e.g. `rms_bf16_c2048_t128_v8_r2` (built for sm90),
    /// `rms_bf16_c2048_t128_v8_r2_add` (after an add), `rms_bf16_c2048_t128_v8_r2_e` (its reads
    /// early) or `rms_bf16_c2048_t128_v8_r2_for_sm80`: symbol, table value and build-cache key.
    pub fn name(&self) -> String {
        format!(
            "rms_{}_c{}_t{}_v{}_r{}{}{}{}",
            self.dtype.short_name(),
            self.cols,
            self.threads,
            self.vector,
            self.rows_per_block,
            self.reads.name_suffix(),
            self.add
                .map_or(String::new(), |a| a.name_suffix(self.dtype)),
            self.arch.name_suffix()
        )
    }

    /// Loads per thread per row.
    pub fn loads(&self) -> u32 {
        self.cols.div_ceil(self.threads * self.vector)
    }

    /// Elements one thread holds in registers.
    pub fn per_thread(&self) -> u32 {
        self.loads() * self.vector
    }

    /// Threads per CTA.
    pub fn block(&self) -> u32 {
        self.threads * self.rows_per_block
    }

    /// Whether the last load leaves some of the group's threads past C.
    pub fn ragged(&self) -> bool {
        !self.cols.is_multiple_of(self.threads * self.vector)
    }

    /// Why the template cannot instantiate this spec, if it cannot.
    pub fn invalid_reason(&self) -> Option<String> {
        let (t, v) = (self.threads, self.vector);
        let bytes = v * self.dtype.bytes() as u32;
        let name = self.name();
        if self.cols == 0 || self.rows_per_block == 0 {
            return Some(format!("{name}: C and rows per CTA must be positive"));
        }
        if !v.is_power_of_two() || bytes > 16 {
            return Some(format!(
                "{name}: a vector is a power of two elements of at most 16 bytes"
            ));
        }
        if !self.cols.is_multiple_of(v) {
            return Some(format!(
                "{name}: C = {} is not a multiple of the vector width {v}",
                self.cols
            ));
        }
        if t == 0 || (t < 32 && !t.is_power_of_two()) || (t > 32 && !t.is_multiple_of(32)) {
            return Some(format!(
                "{name}: threads per row are a power of two up to 32, or whole warps"
            ));
        }
        if self.block() > 1024 || !self.block().is_multiple_of(32) {
            return Some(format!(
                "{name}: {} threads per CTA; whole warps, at most 1024",
                self.block()
            ));
        }
        if self.per_thread() > MAX_PER_THREAD {
            return Some(format!(
                "{name}: {} elements per thread, at most {MAX_PER_THREAD} stay in registers",
                self.per_thread()
            ));
        }
        None
    }

    /// Whether the kernel takes the problem (its C, dtype and add; strides and alignment are
    /// checked per call).
    pub fn fits(&self, p: &RmsNormProblem) -> bool {
        p.dtype == self.dtype && p.cols == self.cols as i64 && p.add.map(|a| a.dtypes()) == self.add
    }
}

/// The candidates for a problem: the widest vector (16 bytes at most) that divides C and the one
/// half as wide; group sizes from one thread up to whole warps, each holding at most
/// CANDIDATE_PER_THREAD elements per thread and none idle (a group's first load covers C at
/// most once), with the multiples of a warp that cover C exactly added; for each, CTAs of 128
/// and 256 threads (one group when it is larger). Ordered with groups whose last load fills
/// the group first, then by how close a thread's share is to 16 elements, then wider vectors. A
/// problem with an add gets the same knobs on kernels that compute it. Each shape comes in every
/// order of reads, side by side, so a capped sweep keeps whole shapes.
pub fn candidates(p: &RmsNormProblem, arch: Arch) -> Vec<RmsNormSpec> {
    let Ok(cols) = u32::try_from(p.cols) else {
        return vec![];
    };
    let widest = 16 / p.dtype.bytes() as u32;
    let Some(vector) = (0..=widest.trailing_zeros())
        .rev()
        .map(|s| 1u32 << s)
        .find(|v| cols.is_multiple_of(*v))
    else {
        return vec![];
    };
    let mut out: Vec<RmsNormSpec> = Vec::new();
    for vector in [vector, (vector / 2).max(1)] {
        let vectors = cols / vector;
        let mut groups: Vec<u32> = (0..=10).map(|s| 1u32 << s).collect();
        groups.extend(
            (1..=32)
                .map(|w| 32 * w)
                .filter(|t| vectors.is_multiple_of(*t)),
        );
        groups.sort();
        groups.dedup();
        for t in groups.into_iter().filter(|&t| t <= vectors) {
            for block in [128, 256] {
                for reads in RowReads::ALL {
                    let s = RmsNormSpec {
                        arch,
                        dtype: p.dtype,
                        cols,
                        threads: t,
                        vector,
                        rows_per_block: (block / t).max(1),
                        add: p.add.map(|a| a.dtypes()),
                        reads,
                    };
                    if s.per_thread() <= CANDIDATE_PER_THREAD
                        && s.invalid_reason().is_none()
                        && !out.contains(&s)
                    {
                        out.push(s);
                    }
                }
            }
        }
    }
    let rank = |s: &RmsNormSpec| {
        (
            s.ragged(),
            ((s.per_thread() as f64 / 16.0).log2().abs() * 100.0) as u32,
            std::cmp::Reverse(s.vector),
            s.rows_per_block,
        )
    };
    out.sort_by_key(rank);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::rmsnorm::Scale;

    fn problem(cols: i64, dtype: DType) -> RmsNormProblem {
        RmsNormProblem::new(4096, cols, dtype, Scale::Weight, true)
    }

    fn names(c: &[RmsNormSpec]) -> Vec<String> {
        c.iter().map(RmsNormSpec::name).collect()
    }

    #[test]
    fn llama_rows_get_16_byte_loads_first_and_every_candidate_is_valid() {
        let all = candidates(&problem(2048, DType::Bf16), Arch::Sm90);
        assert_eq!(
            names(&all[..2]),
            ["rms_bf16_c2048_t128_v8_r1", "rms_bf16_c2048_t128_v8_r1_es"],
            "each shape in every order of reads, side by side"
        );
        let c: Vec<RmsNormSpec> = all.into_iter().filter(|s| s.reads.is_in_turn()).collect();
        assert_eq!(
            names(&c[..4]),
            [
                "rms_bf16_c2048_t128_v8_r1",
                "rms_bf16_c2048_t128_v8_r2",
                "rms_bf16_c2048_t128_v4_r1",
                "rms_bf16_c2048_t128_v4_r2",
            ]
        );
        assert!(c.iter().all(|s| s.invalid_reason().is_none()
            && s.fits(&problem(2048, DType::Bf16))
            && s.per_thread() <= CANDIDATE_PER_THREAD
            && !s.ragged()));
        assert!(c.iter().any(|s| s.vector == 4), "the narrower vector too");
        // Qwen2-0.5B's 896: the 8-byte vector covers it without a ragged tail.
        let q = candidates(&problem(896, DType::Bf16), Arch::Sm90);
        assert!(!q[0].ragged(), "{:?}", names(&q));
        assert!(
            q.iter().any(|s| s.ragged()),
            "ragged ones kept, ranked last"
        );
    }

    #[test]
    fn an_sm80_build_names_its_kernels_for_sm80() {
        let sm90 = names(&candidates(&problem(2048, DType::F16), Arch::Sm90));
        let sm80 = names(&candidates(&problem(2048, DType::F16), Arch::Sm80));
        let expected: Vec<String> = sm90.iter().map(|n| format!("{n}_for_sm80")).collect();
        assert_eq!(sm80, expected);
    }

    #[test]
    fn odd_and_oversized_rows() {
        assert!(candidates(&problem(77, DType::F32), Arch::Sm90)
            .iter()
            .all(|s| s.vector == 1));
        assert!(!candidates(&problem(MAX_ROW as i64, DType::F32), Arch::Sm90).is_empty());
        assert!(candidates(&problem(MAX_ROW as i64 + 4, DType::F32), Arch::Sm90).is_empty());
    }

    #[test]
    fn invalid_instantiations_say_why() {
        let s = RmsNormSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            cols: 2048,
            threads: 128,
            vector: 8,
            rows_per_block: 2,
            add: None,
            reads: RowReads::InTurn,
        };
        assert_eq!(s.invalid_reason(), None);
        let bad = |s: RmsNormSpec| s.invalid_reason().unwrap();
        assert!(bad(RmsNormSpec {
            vector: 16,
            ..s.clone()
        })
        .contains("at most 16 bytes"));
        assert!(bad(RmsNormSpec {
            cols: 2044,
            ..s.clone()
        })
        .contains("multiple of the vector"));
        assert!(bad(RmsNormSpec {
            threads: 48,
            ..s.clone()
        })
        .contains("whole warps"));
        assert!(bad(RmsNormSpec {
            rows_per_block: 16,
            ..s.clone()
        })
        .contains("2048 threads"));
        assert!(bad(RmsNormSpec {
            threads: 2,
            rows_per_block: 16,
            ..s.clone()
        })
        .contains("1024 elements per thread"));
    }

    #[test]
    fn specs_read_back_as_rmsnorm_specs_not_layernorm_ones() {
        let s = candidates(&problem(2048, DType::Bf16), Arch::Sm90).remove(0);
        let spec: crate::kinds::Spec =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(spec, crate::kinds::Spec::from(s.clone()));
        assert_eq!(spec.kind().name(), "rmsnorm");
        let p: crate::kinds::Problem =
            serde_json::from_str(&serde_json::to_string(&problem(2048, DType::Bf16)).unwrap())
                .unwrap();
        assert_eq!(p.kind().name(), "rmsnorm");
    }
}
