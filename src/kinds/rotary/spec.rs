//! Rotary kernels (rotary.cu.hbs): fact's own, no CUTLASS. A kernel is compiled for one head dim
//! D, rotary dim R, form and dtype and takes any number of rows (heads of positions) of q and k,
//! each read through its strides. One thread writes `vector` elements of a head (one 16-byte
//! access where the halves and the rest allow it), `per_thread` such vectors `block` threads
//! apart: memory-bound work whose knobs only decide how many accesses are in flight, which
//! measurement settles.

use super::{Form, RotaryProblem};
use crate::types::{Arch, DType};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RotarySpec {
    pub arch: Arch,
    pub dtype: DType,
    pub form: Form,
    pub head_dim: u32,
    pub rotary_dim: u32,
    /// Elements per access (16 bytes at most).
    pub vector: u32,
    /// Threads per CTA.
    pub block: u32,
    /// Vectors each thread writes.
    pub per_thread: u32,
}

impl RotarySpec {
    /// The kernel's identity, e.g. `rope_halves_bf16_d128_r128_v8_t256_u2` (built for sm90), with
    /// `_for_sm80` when built for sm80: symbol, table value and build-cache key.
    pub fn name(&self) -> String {
        format!(
            "rope_{}_{}_d{}_r{}_v{}_t{}_u{}{}",
            self.form.name(),
            self.dtype.short_name(),
            self.head_dim,
            self.rotary_dim,
            self.vector,
            self.block,
            self.per_thread,
            self.arch.name_suffix()
        )
    }

    /// Why the template cannot instantiate this spec, if it cannot.
    pub fn invalid_reason(&self) -> Option<String> {
        let (d, r, v) = (self.head_dim, self.rotary_dim, self.vector);
        if r < 2 || !r.is_multiple_of(2) || r > d {
            return Some(format!("{}: R must be even, 2 to D", self.name()));
        }
        if !v.is_power_of_two() || v * self.dtype.bytes() as u32 > 16 {
            return Some(format!(
                "{}: a vector is a power of two elements of at most 16 bytes",
                self.name()
            ));
        }
        let part = match self.form {
            Form::Halves => r / 2,
            Form::Pairs => r,
        };
        if !part.is_multiple_of(v) || !(d - r).is_multiple_of(v) {
            return Some(format!(
                "{}: the rotated {} and the rest ({}) must be multiples of the vector {v}",
                self.name(),
                match self.form {
                    Form::Halves => "halves",
                    Form::Pairs => "part",
                },
                d - r
            ));
        }
        if self.form == Form::Pairs && v < 2 {
            return Some(format!("{}: a pair lies in one vector", self.name()));
        }
        if !self.block.is_multiple_of(32) || self.block == 0 || self.block > 1024 {
            return Some(format!(
                "{}: {} threads per CTA; whole warps, at most 1024",
                self.name(),
                self.block
            ));
        }
        if self.per_thread == 0 || self.per_thread > 8 {
            return Some(format!("{}: 1 to 8 vectors per thread", self.name()));
        }
        None
    }

    /// Whether the kernel takes the problem (strides and alignment are checked per call).
    pub fn fits(&self, p: &RotaryProblem) -> bool {
        p.dtype == self.dtype
            && p.form == self.form
            && p.head_dim == self.head_dim as i64
            && p.rotary_dim == self.rotary_dim as i64
    }
}

/// The candidates for a problem: the widest vector the halves (or pairs) and the rest allow and
/// half of it, CTAs of 128 and 256 threads, 1, 2 or 4 vectors per thread; widest first, then 2
/// vectors per thread (two accesses in flight without thinning the grid), then larger CTAs.
pub fn candidates(p: &RotaryProblem, arch: Arch) -> Vec<RotarySpec> {
    let (Ok(head_dim), Ok(rotary_dim)) = (u32::try_from(p.head_dim), u32::try_from(p.rotary_dim))
    else {
        return vec![];
    };
    let widest = p.alignment();
    let mut out = Vec::new();
    for vector in [widest, widest / 2] {
        for per_thread in [2, 1, 4] {
            for block in [256, 128] {
                let s = RotarySpec {
                    arch,
                    dtype: p.dtype,
                    form: p.form,
                    head_dim,
                    rotary_dim,
                    vector,
                    block,
                    per_thread,
                };
                if vector > 0 && s.invalid_reason().is_none() && !out.contains(&s) {
                    out.push(s);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(rule: &str, dims: &[i64], dtype: DType) -> RotaryProblem {
        RotaryProblem::from_rule(rule, dims, dtype).unwrap()
    }

    fn names(c: &[RotarySpec]) -> Vec<String> {
        c.iter().map(RotarySpec::name).collect()
    }

    #[test]
    fn llama_candidates_use_16_byte_accesses_first() {
        let p = problem("rotary_halves_qk", &[4, 16, 4, 1024, 128, 128], DType::Bf16);
        let c = candidates(&p, Arch::Sm90);
        assert_eq!(c.len(), 12);
        assert_eq!(c[0].name(), "rope_halves_bf16_d128_r128_v8_t256_u2");
        assert!(c.iter().all(|s| s.fits(&p) && s.invalid_reason().is_none()));
        assert!(
            c.iter().all(|s| s.vector == 8 || s.vector == 4),
            "{:?}",
            names(&c)
        );
        let sm80 = names(&candidates(&p, Arch::Sm80));
        assert_eq!(sm80[0], "rope_halves_bf16_d128_r128_v8_t256_u2_for_sm80");
    }

    #[test]
    fn partial_and_pairs_take_the_vectors_their_parts_allow() {
        // Pythia: heads of 64, the first 16 rotated: halves of 8 bf16, one 16-byte vector.
        let p = problem("rotary_halves_qk", &[8, 12, 12, 512, 64, 16], DType::Bf16);
        assert!(candidates(&p, Arch::Sm90)
            .iter()
            .all(|s| s.vector == 8 || s.vector == 4));
        // R = 8 in f32: halves of 4, a 16-byte vector; in pairs the 8 allow 4 too.
        let p = problem("rotary_halves", &[1, 4, 0, 8, 16, 8], DType::F32);
        assert_eq!(candidates(&p, Arch::Sm90)[0].vector, 4);
        // R = 6: halves of 3 allow single elements only; pairs of 6 two.
        let p = problem("rotary_halves", &[1, 4, 0, 8, 16, 6], DType::F32);
        assert!(candidates(&p, Arch::Sm90).iter().all(|s| s.vector == 1));
        let p = problem("rotary_pairs", &[1, 4, 0, 8, 16, 6], DType::F32);
        assert!(
            candidates(&p, Arch::Sm90).iter().all(|s| s.vector == 2),
            "one vector holds a pair"
        );
    }

    #[test]
    fn invalid_instantiations_say_why() {
        let s = candidates(
            &problem("rotary_halves", &[1, 4, 0, 8, 64, 16], DType::Bf16),
            Arch::Sm90,
        )
        .remove(0);
        assert_eq!(s.invalid_reason(), None);
        assert!(RotarySpec {
            vector: 16,
            ..s.clone()
        }
        .invalid_reason()
        .unwrap()
        .contains("at most 16 bytes"));
        assert!(RotarySpec {
            rotary_dim: 12,
            ..s.clone()
        }
        .invalid_reason()
        .unwrap()
        .contains("multiples of the vector 8"));
        assert!(RotarySpec {
            block: 100,
            ..s.clone()
        }
        .invalid_reason()
        .unwrap()
        .contains("whole warps"));
        assert!(RotarySpec {
            rotary_dim: 66,
            ..s.clone()
        }
        .invalid_reason()
        .unwrap()
        .contains("R must be even"));
    }

    #[test]
    fn problems_and_specs_round_trip_through_the_untagged_types() {
        let p = problem("rotary_pairs_qk", &[2, 16, 16, 128, 256, 64], DType::F16);
        let s = candidates(&p, Arch::Sm90).remove(0);
        let spec: crate::kinds::Spec =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(spec, crate::kinds::Spec::from(s.clone()));
        assert_eq!(spec.name(), s.name());
        let back: crate::kinds::Problem =
            serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, crate::kinds::Problem::from(p.clone()));
        assert_eq!(back.rule_id(), "rotary_pairs_qk");
    }
}
