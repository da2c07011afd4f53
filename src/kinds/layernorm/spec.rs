//! LayerNorm kernels (templates/layernorm.cu.hbs): fact's own, no CUTLASS. A group of `threads`
//! threads owns one row at a time and holds it in registers: each thread loads `vector` elements
//! per 16-byte (or narrower) load, ⌈C / (threads·vector)⌉ loads in flight, then the group reduces
//! the mean and, over the same registers, the variance (warp shuffles, shared memory across the
//! group's warps), and writes the normalized row. A CTA holds `rows` such groups. C is compiled in,
//! so the loops unroll and the row's registers are an array of known size; a kernel takes only
//! its C. One memory pass each way is the floor a LayerNorm can reach; the knobs decide how close
//! the grid gets to it (loads in flight per thread, CTAs per SM, the tail of a row that does not
//! fill the group), which measurement settles.

use super::LayerNormProblem;
use crate::kinds::rows::RowReads;
use crate::rules::residual::AddDtypes;
use crate::types::{Arch, DType};
use serde::{Deserialize, Serialize};

/// The most elements one thread holds: past this the row spills out of registers.
pub const MAX_PER_THREAD: u32 = 64;
/// The most elements a candidate holds per thread (loads in flight without crowding the SM's
/// registers), and so the longest row a candidate takes: one CTA of 1024 threads.
pub const CANDIDATE_PER_THREAD: u32 = 32;
pub const MAX_ROW: u32 = 1024 * CANDIDATE_PER_THREAD;

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LayerNormSpec {
    pub arch: Arch,
    pub dtype: DType,
    /// C: the normalized dim, compiled in.
    pub cols: u32,
    /// Threads that share one row: a power of two up to a warp, or whole warps.
    pub threads_per_row: u32,
    /// Elements per load (16 bytes at most).
    pub vector: u32,
    /// Rows (thread groups) per CTA.
    pub rows_per_cta: u32,
    /// The residual add before the norm: its dtypes (absent from the serde form without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add: Option<AddDtypes>,
    /// The order of the row's reads (absent from the serde form for the default).
    #[serde(default, skip_serializing_if = "RowReads::is_in_turn")]
    pub reads: RowReads,
}

impl LayerNormSpec {
    /// The kernel's identity, e.g. `ln_f32_c768_t32_v4_r4` (built for sm90),
    /// `ln_f32_c768_t32_v4_r4_add` (after an add), `ln_f32_c768_t32_v4_r4_e` (its reads early) or
    /// `ln_f32_c768_t32_v4_r4_for_sm80`: symbol, table value and build-cache key.
    pub fn name(&self) -> String {
        format!(
            "ln_{}_c{}_t{}_v{}_r{}{}{}{}",
            self.dtype.short_name(),
            self.cols,
            self.threads_per_row,
            self.vector,
            self.rows_per_cta,
            self.reads.name_suffix(),
            self.add
                .map_or(String::new(), |a| a.name_suffix(self.dtype)),
            self.arch.name_suffix()
        )
    }

    /// Loads per thread per row.
    pub fn loads(&self) -> u32 {
        self.cols.div_ceil(self.threads_per_row * self.vector)
    }

    /// Elements one thread holds in registers.
    pub fn per_thread(&self) -> u32 {
        self.loads() * self.vector
    }

    /// Threads per CTA.
    pub fn block(&self) -> u32 {
        self.threads_per_row * self.rows_per_cta
    }

    /// Why the template cannot instantiate this spec, if it cannot.
    pub fn invalid_reason(&self) -> Option<String> {
        let (t, v, bytes) = (
            self.threads_per_row,
            self.vector,
            self.vector * self.dtype.bytes() as u32,
        );
        if self.cols == 0 || self.rows_per_cta == 0 {
            return Some(format!(
                "{}: C and rows per CTA must be positive",
                self.name()
            ));
        }
        if !v.is_power_of_two() || bytes > 16 {
            return Some(format!(
                "{}: a vector is a power of two elements of at most 16 bytes",
                self.name()
            ));
        }
        if !self.cols.is_multiple_of(v) {
            return Some(format!(
                "{}: C = {} is not a multiple of the vector width {v}",
                self.name(),
                self.cols
            ));
        }
        if t == 0 || (t < 32 && !t.is_power_of_two()) || (t > 32 && !t.is_multiple_of(32)) {
            return Some(format!(
                "{}: threads per row are a power of two up to 32, or whole warps",
                self.name()
            ));
        }
        if self.block() > 1024 || !self.block().is_multiple_of(32) {
            return Some(format!(
                "{}: {} threads per CTA; whole warps, at most 1024",
                self.name(),
                self.block()
            ));
        }
        if self.per_thread() > MAX_PER_THREAD {
            return Some(format!(
                "{}: {} elements per thread, at most {MAX_PER_THREAD} stay in registers",
                self.name(),
                self.per_thread()
            ));
        }
        None
    }

    /// Whether the kernel takes the problem (its C, dtype and add; strides and alignment are
    /// checked per call).
    pub fn fits(&self, p: &LayerNormProblem) -> bool {
        p.dtype == self.dtype && p.cols == self.cols as i64 && p.add.map(|a| a.dtypes()) == self.add
    }
}

/// The candidates for a problem: the widest vector (16 bytes at most) that divides C; group sizes
/// from one thread per row up to whole warps, each holding at most CANDIDATE_PER_THREAD elements
/// per thread and none idle (a group covers C at least once), with the multiples of a warp that
/// cover C exactly added; for each, CTAs of 128 and 256 threads (one group when it is larger).
/// Ordered with the groups whose last load fills the group first, then by how close a thread's
/// share is to 16 elements (enough loads in flight without crowding the SM's registers). Each
/// shape comes in every order of reads, side by side, so a capped sweep keeps whole shapes.
pub fn candidates(p: &LayerNormProblem, arch: Arch) -> Vec<LayerNormSpec> {
    let Ok(cols) = u32::try_from(p.cols) else {
        return vec![];
    };
    let widest = 16 / p.dtype.bytes() as u32;
    let vector = (0..=widest.trailing_zeros())
        .rev()
        .map(|s| 1 << s)
        .find(|v| cols.is_multiple_of(*v))
        .unwrap_or(1);
    let vectors = cols / vector;
    let mut groups: Vec<u32> = (0..=10).map(|s| 1u32 << s).collect();
    groups.extend(
        (1..=32)
            .map(|w| 32 * w)
            .filter(|t| vectors.is_multiple_of(*t)),
    );
    groups.sort();
    groups.dedup();
    let mut out: Vec<LayerNormSpec> = Vec::new();
    for t in groups.into_iter().filter(|&t| t <= vectors) {
        for block in [128, 256] {
            let rows_per_cta = (block / t).max(1);
            for reads in RowReads::ALL {
                let s = LayerNormSpec {
                    arch,
                    dtype: p.dtype,
                    cols,
                    threads_per_row: t,
                    vector,
                    rows_per_cta,
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
    let rank = |s: &LayerNormSpec| {
        let ragged = !cols.is_multiple_of(s.threads_per_row * s.vector);
        (
            ragged,
            ((s.per_thread() as f64 / 16.0).log2().abs() * 100.0) as u32,
            s.rows_per_cta,
        )
    };
    out.sort_by_key(rank);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(cols: i64, dtype: DType) -> LayerNormProblem {
        LayerNormProblem {
            rows: 65536,
            cols,
            dtype,
            weight: true,
            bias: true,
            add: None,
        }
    }

    fn names(c: &[LayerNormSpec]) -> Vec<String> {
        c.iter().map(LayerNormSpec::name).collect()
    }

    #[test]
    fn an_sm80_build_names_its_kernels_for_sm80() {
        let sm90 = names(&candidates(&problem(768, DType::F32), Arch::Sm90));
        let sm80 = names(&candidates(&problem(768, DType::F32), Arch::Sm80));
        assert!(!sm80.is_empty());
        let expected: Vec<String> = sm90.iter().map(|n| format!("{n}_for_sm80")).collect();
        assert_eq!(sm80, expected);
    }

    #[test]
    fn gpt_block_candidates_hold_the_row_in_registers_with_16_byte_loads() {
        let all = candidates(&problem(768, DType::F32), Arch::Sm90);
        // Each shape in every order of reads, side by side.
        for (i, s) in all.iter().enumerate() {
            assert_eq!(s.reads, RowReads::ALL[i % 2], "{}", s.name());
            let first = LayerNormSpec {
                reads: RowReads::InTurn,
                ..s.clone()
            };
            assert_eq!(all[i - i % 2], first);
        }
        let c: Vec<LayerNormSpec> = all.into_iter().filter(|s| s.reads.is_in_turn()).collect();
        assert_eq!(
            names(&c),
            [
                "ln_f32_c768_t64_v4_r2",
                "ln_f32_c768_t64_v4_r4",
                "ln_f32_c768_t32_v4_r4",
                "ln_f32_c768_t32_v4_r8",
                "ln_f32_c768_t96_v4_r1",
                "ln_f32_c768_t96_v4_r2",
                "ln_f32_c768_t192_v4_r1",
                "ln_f32_c768_t128_v4_r1",
                "ln_f32_c768_t128_v4_r2",
            ]
        );
        assert!(c
            .iter()
            .all(|s| s.invalid_reason().is_none() && s.fits(&problem(768, DType::F32))));
        let bf16 = candidates(&problem(768, DType::Bf16), Arch::Sm90);
        assert!(
            bf16.iter().all(|s| s.vector == 8 && s.per_thread() <= 32),
            "{:?}",
            names(&bf16)
        );
        assert!(
            !bf16[0].fits(&problem(768, DType::F32)) && !bf16[0].fits(&problem(1024, DType::Bf16)),
            "a kernel takes its own C and dtype"
        );
    }

    #[test]
    fn ragged_tiny_and_wide_rows_get_kernels_that_fit() {
        // C = 770: 8-byte loads for f32, 4-byte ones for bf16.
        assert!(candidates(&problem(770, DType::F32), Arch::Sm90)
            .iter()
            .all(|s| s.vector == 2));
        assert!(candidates(&problem(770, DType::Bf16), Arch::Sm90)
            .iter()
            .all(|s| s.vector == 2));
        assert!(candidates(&problem(769, DType::F32), Arch::Sm90)
            .iter()
            .all(|s| s.vector == 1));
        // C = 32: eight threads per row, sixteen rows per CTA of 128.
        let tiny = candidates(&problem(32, DType::F32), Arch::Sm90);
        assert!(
            tiny.iter().all(|s| s.threads_per_row <= 8),
            "{:?}",
            names(&tiny)
        );
        assert!(names(&tiny).contains(&"ln_f32_c32_t8_v4_r16".to_string()));
        // C = 8192: whole CTAs per row.
        let wide = candidates(&problem(8192, DType::F32), Arch::Sm90);
        assert!(
            !wide.is_empty()
                && wide
                    .iter()
                    .all(|s| s.threads_per_row >= 256 && s.per_thread() <= 32),
            "{:?}",
            names(&wide)
        );
        assert!(!candidates(&problem(MAX_ROW as i64, DType::F32), Arch::Sm90).is_empty());
        assert!(
            candidates(&problem(MAX_ROW as i64 + 4, DType::F32), Arch::Sm90).is_empty(),
            "past 32 elements per thread of 1024 threads"
        );
    }

    #[test]
    fn invalid_instantiations_say_why() {
        let s = LayerNormSpec {
            arch: Arch::Sm90,
            dtype: DType::F32,
            cols: 768,
            threads_per_row: 32,
            vector: 4,
            rows_per_cta: 4,
            add: None,
            reads: RowReads::InTurn,
        };
        assert_eq!(s.invalid_reason(), None);
        assert!(LayerNormSpec {
            vector: 8,
            ..s.clone()
        }
        .invalid_reason()
        .unwrap()
        .contains("at most 16 bytes"));
        assert!(LayerNormSpec {
            cols: 770,
            ..s.clone()
        }
        .invalid_reason()
        .unwrap()
        .contains("not a multiple of the vector width 4"));
        assert!(LayerNormSpec {
            threads_per_row: 48,
            ..s.clone()
        }
        .invalid_reason()
        .unwrap()
        .contains("whole warps"));
        assert!(LayerNormSpec {
            threads_per_row: 8,
            rows_per_cta: 2,
            ..s.clone()
        }
        .invalid_reason()
        .unwrap()
        .contains("16 threads per CTA"));
        assert!(LayerNormSpec {
            threads_per_row: 1,
            rows_per_cta: 32,
            ..s.clone()
        }
        .invalid_reason()
        .unwrap()
        .contains("768 elements per thread"));
    }

    #[test]
    fn specs_round_trip_through_the_untagged_spec() {
        let s = candidates(&problem(768, DType::Bf16), Arch::Sm90).remove(0);
        let spec: crate::kinds::Spec =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(spec, crate::kinds::Spec::from(s.clone()));
        assert_eq!(spec.name(), s.name());
    }
}
