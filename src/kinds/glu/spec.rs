//! What a GLU kernel is: one GEMM over the interleaved weights [2I, K] (a GEMM kind's
//! `KernelSpec`: its tile, cluster, schedule and scheduler, so the GLU reuses the GEMM kind's
//! mainloops and candidate space), and how its two halves meet: fused in the GEMM's epilogue
//! (sm90: a collective of fact's own writes act(gate)·up, half the width), or split (the GEMM
//! writes both halves to a workspace and one elementwise kernel multiplies them: the candidate
//! the fused one must beat, and the only one on sm80). The first round takes the GEMM kind's
//! best kernels for the concatenated GEMM in both forms; the later rounds are the GEMM kind's
//! (sibling cluster shapes and tiles, then launch knobs), each over the kernels of one form.

use super::problem::{Act, GluProblem};
use crate::kinds::gemm::space::{EpilogueKind, Family, KernelSchedule};
use crate::kinds::gemm::{gemm_candidates, sweep, GemmLayout, GemmProblem, KernelSpec};
use crate::kinds::Measured;
use crate::types::{Arch, MathType};
use serde::{Deserialize, Serialize};

/// How the GEMM's two halves meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// act(gate)·up in the GEMM's epilogue (templates/sm90_glu.cu.hbs).
    Fused,
    /// The GEMM writes [M, 2I], then one elementwise kernel (templates/glu_split.cu.hbs).
    Split,
}

impl Form {
    pub fn short_name(self) -> &'static str {
        match self {
            Form::Fused => "fused",
            Form::Split => "split",
        }
    }
}

/// A GLU kernel: its form, its activation and its GEMM (torch's rcr: x row-major, the weights
/// [2I, K] row-major, so B = wᵀ column-major).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GluSpec {
    pub glu: Form,
    pub act: Act,
    pub gemm: KernelSpec,
}

/// The fused kernels a first round compiles, fastest estimates first.
pub const FUSED_CANDIDATES: usize = 6;
/// The split kernels a first round compiles.
pub const SPLIT_CANDIDATES: usize = 2;

impl GluSpec {
    /// The variant's identity: `glu_<act>_<form>_` and the GEMM's variant name.
    pub fn name(&self) -> String {
        self.with_gemm_name(&self.gemm.name())
    }
    /// The compiled kernel's identity: `glu_<act>_<form>_` and the GEMM's kernel name.
    pub fn kernel_name(&self) -> String {
        self.with_gemm_name(&self.gemm.kernel_name())
    }
    fn with_gemm_name(&self, gemm: &str) -> String {
        format!(
            "glu_{}_{}_{gemm}",
            self.act.short_name(),
            self.glu.short_name()
        )
    }
    /// This kernel without launch knobs.
    pub fn kernel(&self) -> GluSpec {
        GluSpec {
            gemm: self.gemm.kernel(),
            ..self.clone()
        }
    }
}

/// The concatenated GEMM of a GLU problem: M × 2I × K, rcr, the biases concatenated too.
pub fn gemm_problem(p: &GluProblem) -> GemmProblem {
    GemmProblem {
        m: p.m,
        n: 2 * p.inter,
        k: p.k,
        layout: GemmLayout::Rcr,
        dtype: p.dtype,
        bias: p.bias,
        batch: 1,
        epilogue: None,
        padded_from: None,
    }
}

/// Whether the fused epilogue takes this GEMM kernel: the sm90 family's TMA mainloops, persistent
/// or Stream-K (whose partial tiles are reduced before the epilogue runs, once per tile); the
/// cp.async mainloops and the split families are left to the split form.
pub fn fuses(k: &KernelSpec) -> bool {
    k.family == Family::Sm90Gemm
        && matches!(
            k.schedule,
            KernelSchedule::Ws | KernelSchedule::WsCooperative | KernelSchedule::WsPingpong
        )
        && k.tile[0].is_multiple_of(64)
}

/// A first round for `p` with `math` on `arch`: the fused forms of the GEMM kind's best sm90 kernels for the
/// concatenated GEMM, then the split forms of its best kernels.
pub fn candidates(p: &GluProblem, math: MathType, arch: Arch) -> Vec<GluSpec> {
    let gemms = gemm_candidates(&gemm_problem(p), math, arch);
    // Kernels that differ only in their epilogue are one mainloop: the first of them stands.
    let mut fused: Vec<GluSpec> = Vec::new();
    for k in gemms.iter().filter(|k| fuses(k)) {
        let s = GluSpec {
            glu: Form::Fused,
            act: p.act,
            gemm: KernelSpec {
                // Registers to global memory: no shared memory staging, the mainloop's stages
                // take it.
                epilogue: EpilogueKind::NoSmem,
                ..k.kernel()
            },
        };
        if fused.len() < FUSED_CANDIDATES && !fused.contains(&s) {
            fused.push(s);
        }
    }
    let split = gemms.iter().take(SPLIT_CANDIDATES).map(|k| GluSpec {
        glu: Form::Split,
        act: p.act,
        gemm: k.kernel(),
    });
    fused.into_iter().chain(split).collect()
}

/// Round `i` after the first, in each form: the GEMM kind's rounds (`gemm::sweep::ROUNDS`: the
/// fastest kernels' sibling cluster shapes and tiles, then their launch knobs) over the GEMMs that
/// form measured (`measured`: each kernel with its median time where it passed), kept in that
/// form where it still fuses.
pub fn round(
    i: usize,
    p: &GluProblem,
    measured: &[(GluSpec, Option<f64>)],
    refine: usize,
) -> Vec<GluSpec> {
    let gp = gemm_problem(p);
    let mut out: Vec<GluSpec> = Vec::new();
    for form in [Form::Fused, Form::Split] {
        let gemms: Vec<Measured> = measured
            .iter()
            .filter(|(s, _)| s.glu == form)
            .map(|(s, ms)| Measured {
                spec: s.gemm.clone().into(),
                ms: *ms,
            })
            .collect();
        let next = match i {
            0 => sweep::refine_siblings(&gemms, &gp, refine.min(sweep::SIBLING_ROUND_TOP)),
            1 => sweep::refine_candidates(&gemms, &gp, refine),
            _ => vec![],
        };
        for gemm in next {
            let s = GluSpec {
                glu: form,
                act: p.act,
                gemm,
            };
            if (form == Form::Split || fuses(&s.gemm)) && !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    fn llama() -> GluProblem {
        GluProblem::from_rule("glu_silu", &[4096, 5632, 2048], DType::Bf16).unwrap()
    }

    #[test]
    fn sm90_sweeps_fused_and_split_forms_of_the_gemm_kinds_kernels() {
        let c = candidates(&llama(), MathType::Bf16, Arch::Sm90);
        let fused: Vec<&GluSpec> = c.iter().filter(|s| s.glu == Form::Fused).collect();
        let split: Vec<&GluSpec> = c.iter().filter(|s| s.glu == Form::Split).collect();
        assert!(!fused.is_empty() && fused.len() <= FUSED_CANDIDATES);
        assert_eq!(split.len(), SPLIT_CANDIDATES);
        for s in &fused {
            assert!(fuses(&s.gemm) && s.gemm.epilogue == EpilogueKind::NoSmem);
            assert_eq!(
                (s.gemm.layout, s.gemm.dtype, s.gemm.bias),
                (GemmLayout::Rcr, DType::Bf16, false)
            );
            assert!(
                s.name().starts_with("glu_silu_fused_sm90_gemm_rcr_bf16"),
                "{}",
                s.name()
            );
            assert!(s.name().contains("_nosmem"));
        }
        // Names are identities: no two candidates share one.
        let mut names: Vec<String> = c.iter().map(GluSpec::kernel_name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), c.len());
    }

    #[test]
    fn sm80_takes_the_split_form_alone() {
        let c = candidates(
            &GluProblem {
                bias: true,
                ..llama()
            },
            MathType::Bf16,
            Arch::Sm80,
        );
        assert!(!c.is_empty());
        assert!(c
            .iter()
            .all(|s| s.glu == Form::Split && s.gemm.bias && s.gemm.arch == Arch::Sm80));
        assert!(
            c[0].name().starts_with("glu_silu_split_sm80_gemm_rcr_bf16"),
            "{}",
            c[0].name()
        );
    }

    #[test]
    fn f32_fuses_under_tf32_and_splits_under_f32_accurate() {
        let p = GluProblem {
            dtype: DType::F32,
            ..llama()
        };
        let tf32 = candidates(&p, MathType::Tf32, Arch::Sm90);
        assert!(tf32
            .iter()
            .any(|s| s.glu == Form::Fused && s.gemm.math == MathType::Tf32));
        let x3 = candidates(&p, MathType::Tf32x3, Arch::Sm90);
        assert!(!x3.is_empty());
        assert!(x3
            .iter()
            .all(|s| s.glu == Form::Split && s.gemm.math == MathType::Tf32x3));
    }

    #[test]
    fn later_rounds_refine_each_form_through_the_gemm_kinds_rounds() {
        let p = llama();
        let first = candidates(&p, MathType::Bf16, Arch::Sm90);
        let measured: Vec<(GluSpec, Option<f64>)> = first
            .iter()
            .enumerate()
            .map(|(i, s)| (s.clone(), Some(0.2 + 0.01 * i as f64)))
            .collect();
        let siblings = round(0, &p, &measured, 3);
        assert!(siblings.iter().any(|s| s.glu == Form::Fused));
        assert!(siblings.iter().any(|s| s.glu == Form::Split));
        for s in &siblings {
            assert!(!first.contains(s), "{} was measured", s.name());
            assert!(
                s.glu == Form::Split || (fuses(&s.gemm) && s.gemm.epilogue == EpilogueKind::NoSmem)
            );
        }
        let knobs = round(1, &p, &measured, 2);
        assert!(!knobs.is_empty());
        assert!(knobs
            .iter()
            .all(|s| !s.gemm.knobs.is_default() && s.name() != s.kernel_name()));
        assert!(knobs.iter().any(|s| s.glu == Form::Fused));
        assert!(round(2, &p, &measured, 2).is_empty());
        // A form nothing of which passed is not refined.
        let failed: Vec<(GluSpec, Option<f64>)> = measured
            .iter()
            .map(|(s, ms)| (s.clone(), if s.glu == Form::Fused { None } else { *ms }))
            .collect();
        assert!(round(1, &p, &failed, 2)
            .iter()
            .all(|s| s.glu == Form::Split));
    }

    #[test]
    fn specs_read_back_as_themselves() {
        let s = candidates(&llama(), MathType::Bf16, Arch::Sm90).remove(0);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<GluSpec>(&json).unwrap(), s);
        assert!(
            serde_json::from_str::<KernelSpec>(&json).is_err(),
            "no GEMM spec"
        );
    }
}
