//! GRN kernels (grn.cu.hbs in this folder): fact's own, no CUTLASS. Three launches: the sums of
//! squares over slices of the positions (a CTA's 32 lanes across 32 vectors of `vector` channels,
//! `sum_rows` positions at a time, one slice's partial sums to fp32 workspace), each image's finish
//! (the norms, their mean over the channels, nf), then y (one thread a vector of channels at one
//! position). x is read twice and y written once: the floor, since every position's square enters
//! the first output. C and the shapes are run-time; the knobs decide how close the passes get to
//! the DRAM rate, which measurement settles.

use super::GrnProblem;
use crate::types::{Arch, DType};
use serde::{Deserialize, Serialize};

/// A GRN kernel. Its fields are none of another kind's spec's together (`sum_rows`), so an
/// untagged spec reads back as this kind's only.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrnSpec {
    pub arch: Arch,
    pub dtype: DType,
    /// Channels per load (16 bytes at most).
    pub vector: u32,
    /// Positions a CTA of the sum pass reads at a time (its threads' y).
    pub sum_rows: u32,
}

impl GrnSpec {
    /// The kernel's identity, e.g. `grn_bf16_v8_s8` (built for sm90) or `grn_bf16_v8_s8_for_sm80`:
    /// symbol, table value and build-cache key.
    pub fn name(&self) -> String {
        format!(
            "grn_{}_v{}_s{}{}",
            self.dtype.short_name(),
            self.vector,
            self.sum_rows,
            self.arch.name_suffix()
        )
    }

    /// Why the template cannot instantiate this spec, if it cannot.
    pub fn invalid_reason(&self) -> Option<String> {
        let name = self.name();
        let bytes = self.vector * self.dtype.bytes() as u32;
        if !self.vector.is_power_of_two() || bytes > 16 {
            return Some(format!(
                "{name}: a vector is a power of two elements of at most 16 bytes"
            ));
        }
        if !self.sum_rows.is_power_of_two() || self.sum_rows > 32 {
            return Some(format!(
                "{name}: the sum pass reads a power of two positions at a time, at most 32"
            ));
        }
        None
    }
}

/// The kernels for `p` on `arch`: 16- and 8-byte vectors that C divides, by 4, 8 and 16 positions
/// at a time, widest first.
pub fn candidates(p: &GrnProblem, arch: Arch) -> Vec<GrnSpec> {
    let e = p.dtype.bytes() as u32;
    [16 / e, 8 / e]
        .into_iter()
        .filter(|&v| v >= 1 && p.channels % v as i64 == 0)
        .flat_map(|vector| {
            [8, 16, 4].map(|sum_rows| GrnSpec {
                arch,
                dtype: p.dtype,
                vector,
                sum_rows,
            })
        })
        .filter(|s| s.invalid_reason().is_none())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_take_the_vectors_c_divides() {
        let p = GrnProblem {
            batch: 32,
            pixels: 3136,
            channels: 384,
            dtype: DType::Bf16,
        };
        let names: Vec<String> = candidates(&p, Arch::Sm90)
            .iter()
            .map(GrnSpec::name)
            .collect();
        assert_eq!(
            names,
            [
                "grn_bf16_v8_s8",
                "grn_bf16_v8_s16",
                "grn_bf16_v8_s4",
                "grn_bf16_v4_s8",
                "grn_bf16_v4_s16",
                "grn_bf16_v4_s4"
            ]
        );
        // C = 100 in fp32: 4 divides it, as 2 does; C = 99 takes neither vector.
        let f32 = |channels| GrnProblem {
            channels,
            dtype: DType::F32,
            ..p.clone()
        };
        assert_eq!(candidates(&f32(100), Arch::Sm80).len(), 6);
        assert!(candidates(&f32(100), Arch::Sm80)[0]
            .name()
            .ends_with("_v4_s8_for_sm80"));
        assert!(candidates(&f32(99), Arch::Sm90).is_empty());
        let bad = GrnSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            vector: 16,
            sum_rows: 8,
        };
        assert!(bad.invalid_reason().unwrap().contains("16 bytes"));
        assert!(GrnSpec {
            vector: 8,
            sum_rows: 12,
            ..bad
        }
        .invalid_reason()
        .unwrap()
        .contains("power of two positions"));
    }
}
