//! Kernel specifications and the candidate space for a pattern. A `KernelSpec` is everything that
//! makes a kernel different; its name is computed from it alone and is the generated symbol, the
//! pattern-table value and the build-cache key (spec.rs). What CUTLASS would reject and what fits
//! a problem is checked in checks.rs. The candidates (`derive`, here) are the instantiations
//! CUTLASS's own generator declares valid (the knowledge base distilled from cutlass_library,
//! knowledge.rs), pruned by those checks and learned validity rules (`crate::space::validity`) and
//! ordered by an analytic estimate (estimate.rs).

mod checks;
pub mod estimate;
pub mod knowledge;
mod spec;

pub use checks::{alignment_note, epilogue_note, fusion_refusal};
pub use knowledge::Knowledge;
pub use spec::*;

use super::GemmProblem;
use crate::space::{validity, SpaceOptions};
use crate::types::{Arch, MathType};
use serde::{Deserialize, Serialize};

/// A candidate the space left out before nvcc, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Pruned {
    pub kernel: String,
    pub reason: String,
    pub estimate_ms: Option<f64>,
}

/// The candidates of a sweep, best estimate first, and everything pruned on the way.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Space {
    pub candidates: Vec<KernelSpec>,
    pub estimates_ms: Vec<f64>,
    pub pruned: Vec<Pruned>,
    /// Where the space came from: the knowledge base's CUTLASS version and source.
    pub source: String,
}

/// The sweep for a GEMM problem: CUTLASS's own valid instantiations for (arch, math, dtype,
/// layout) from the knowledge base, less what cannot run the problem, what a learned validity
/// rule rejects and what the analytic estimate calls hopeless; ordered by estimate.
pub fn derive(
    kb: &Knowledge,
    p: &GemmProblem,
    math: MathType,
    arch: Arch,
    rules: &[validity::Rule],
    scope: &validity::Scope,
    opts: &SpaceOptions,
) -> Space {
    let mut space = Space {
        source: kb.describe(),
        ..Space::default()
    };
    let mut scored: Vec<(f64, KernelSpec)> = Vec::new();
    for k in kb.kernels(p, math, arch) {
        if let Some(r) = k.invalid_reason() {
            space.pruned.push(Pruned {
                kernel: k.name(),
                reason: r,
                estimate_ms: None,
            });
            continue;
        }
        if !k.fits(p) {
            space.pruned.push(Pruned {
                kernel: k.name(),
                reason: "alignment does not fit the problem".into(),
                estimate_ms: None,
            });
            continue;
        }
        let k = estimate::with_best_splits(&k, p);
        if let Some(rule) = crate::kinds::gemm::rejecting(rules, scope, &k) {
            space.pruned.push(Pruned {
                kernel: k.name(),
                reason: rule.describe(),
                estimate_ms: None,
            });
            continue;
        }
        scored.push((estimate::estimate_ms(&k, p), k));
    }
    scored.sort_by(|a, b| {
        a.0.partial_cmp(&b.0)
            .unwrap()
            .then_with(|| a.1.name().cmp(&b.1.name()))
    });
    let best = scored.first().map(|s| s.0).unwrap_or(0.0);
    let (hopeful, hopeless): (Vec<_>, Vec<_>) = scored
        .into_iter()
        .partition(|(ms, _)| *ms <= best * opts.hopeless);
    for (ms, k) in hopeless {
        space.pruned.push(Pruned {
            kernel: k.name(),
            reason: format!(
                "estimate {ms:.4} ms is over {:.1}x the best {best:.4} ms",
                opts.hopeless
            ),
            estimate_ms: Some(ms),
        });
    }
    let mut keep = vec![false; hopeful.len()];
    let mut kept_of: std::collections::HashMap<(Family, KernelSchedule), usize> =
        std::collections::HashMap::new();
    for (i, (_, k)) in hopeful.iter().enumerate() {
        let n = kept_of.entry((k.family, k.schedule)).or_default();
        if *n < opts.per_group {
            *n += 1;
            keep[i] = true;
        }
    }
    let mut room = opts
        .budget
        .saturating_sub(keep.iter().filter(|k| **k).count());
    for k in keep.iter_mut() {
        if !*k && room > 0 {
            *k = true;
            room -= 1;
        }
    }
    for ((ms, k), kept) in hopeful.into_iter().zip(keep) {
        if kept {
            space.candidates.push(k);
            space.estimates_ms.push(ms);
        } else {
            space.pruned.push(Pruned {
                kernel: k.name(),
                reason: format!("beyond the budget of {}", opts.budget),
                estimate_ms: Some(ms),
            });
        }
    }
    space
}

/// The default sweep for a GEMM problem from the shipped knowledge base with no learned rules.
pub fn gemm_candidates(p: &GemmProblem, math: MathType, arch: Arch) -> Vec<KernelSpec> {
    let scope = validity::Scope::of(&p.rule_id(), p.dtype, &p.shape_key(), math, arch, "");
    derive(
        Knowledge::shipped(),
        p,
        math,
        arch,
        &[],
        &scope,
        &SpaceOptions::default(),
    )
    .candidates
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::gemm::{Epilogue, GemmLayout};
    use crate::types::DType;

    pub(super) fn problem(m: i64, n: i64, k: i64, dtype: DType) -> GemmProblem {
        GemmProblem {
            m,
            n,
            k,
            layout: GemmLayout::Rrr,
            dtype,
            bias: false,
            batch: 1,
            epilogue: None,
            padded_from: None,
        }
    }

    #[test]
    fn name_is_computed_from_the_spec() {
        let k = &Knowledge::shipped()
            .kernels(
                &problem(4096, 4096, 4096, DType::F32),
                MathType::Tf32,
                Arch::Sm90,
            )
            .into_iter()
            .find(|k| {
                k.tile == [128, 128, 32]
                    && k.scheduler == TileScheduler::Persistent
                    && k.epilogue == EpilogueKind::Tma
                    && k.schedule == KernelSchedule::WsCooperative
                    && k.cluster == [1, 2, 1]
            })
            .unwrap();
        assert_eq!(
            k.name(),
            "sm90_gemm_rrr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4"
        );
        let back: KernelSpec = serde_json::from_str(&k.to_json()).unwrap();
        assert_eq!(back.name(), k.name());
    }

    #[test]
    fn sweep_has_at_least_four_valid_distinct_variants() {
        for dtype in [DType::F32, DType::Bf16] {
            let math = MathType::for_tensor(dtype, crate::types::Precision::Tf32).unwrap();
            let c = gemm_candidates(&problem(4096, 4096, 4096, dtype), math, Arch::Sm90);
            assert!(c.len() >= 4, "{dtype}: {}", c.len());
            let names: std::collections::HashSet<_> = c.iter().map(KernelSpec::name).collect();
            assert_eq!(names.len(), c.len());
            assert!(c.iter().any(|k| k.schedule == KernelSchedule::WsPingpong));
            assert!(c.iter().any(|k| k.scheduler == TileScheduler::StreamK));
        }
    }

    #[test]
    fn validity_rules_reject_what_cutlass_rejects() {
        let all = Knowledge::shipped().kernels(
            &problem(512, 512, 512, DType::F32),
            MathType::Tf32,
            Arch::Sm90,
        );
        let mut k = all
            .iter()
            .find(|k| k.family == Family::Sm90Gemm)
            .unwrap()
            .clone();
        k.schedule = KernelSchedule::WsCooperative;
        k.tile = [64, 128, 32];
        assert!(k.invalid_reason().unwrap().contains("cooperative"));
        k.tile = [128, 128, 64];
        assert!(k.invalid_reason().unwrap().contains("128 bytes"));
        let mut s = all
            .iter()
            .find(|k| k.family == Family::Sm80Gemm)
            .unwrap()
            .clone();
        assert_eq!(s.invalid_reason(), None);
        s.stages = 11;
        assert!(s.invalid_reason().unwrap().contains("stages"));
        s.stages = 3;
        s.knobs.swizzle = 4;
        assert!(
            s.invalid_reason().unwrap().contains("compile time"),
            "sm80 swizzle is not a launch knob"
        );
        let mut dp = all
            .iter()
            .find(|k| k.family == Family::Sm90Gemm && k.scheduler == TileScheduler::Persistent)
            .unwrap()
            .clone();
        dp.knobs.splits = 4;
        assert!(dp.invalid_reason().unwrap().contains("Stream-K"));
    }

    #[test]
    fn split_families_check_their_part_type_and_the_problem() {
        let p = problem(4096, 4096, 4096, DType::F32);
        let ks = Knowledge::shipped().kernels(&p, MathType::Tf32x3, Arch::Sm90);
        let b3 = ks
            .iter()
            .find(|k| k.family == Family::Sm90GemmBf16x3)
            .unwrap()
            .clone();
        assert!(b3.fits(&p));
        // bf16 parts read 8-element (16-byte) vectors along K and N; an fp32 GEMM with N % 8 == 4
        // runs on the tf32 families only.
        let odd = problem(4096, 4100, 4096, DType::F32);
        assert!(!b3.fits(&odd));
        assert!(ks
            .iter()
            .any(|k| k.family == Family::Sm90GemmX3 && k.fits(&odd)));
        // A K tile of 32 spans 128 bytes of fp32, not of bf16 parts.
        let mut k = b3.clone();
        k.tile[2] = 32;
        assert!(
            k.invalid_reason().unwrap().contains("128 bytes of bf16x3"),
            "{:?}",
            k.invalid_reason()
        );
        // Bias and epilogues go into the second GEMM's epilogue, whose C operand is the first
        // GEMM's result: a residual comes in through an aux load.
        let mut k = b3.clone();
        k.bias = true;
        k.epilogue = EpilogueKind::Tma;
        k.fusion = Some(Epilogue::parse("leaves=row;v1=gelu(v0);v2=mul(v1,l0)").unwrap());
        assert_eq!(k.invalid_reason(), None);
        k.fusion = Some(Epilogue::parse("leaves=full;v1=add(v0,l0)").unwrap());
        assert_eq!(
            (k.invalid_reason(), k.leaf_reads()),
            (None, vec![Some(LeafRead::Aux)])
        );
        let with_residual = GemmProblem {
            bias: true,
            epilogue: k.fusion.clone(),
            ..p.clone()
        };
        let ks = Knowledge::shipped().kernels(&with_residual, MathType::Tf32x3, Arch::Sm90);
        for family in [Family::Sm90GemmX3, Family::Sm90GemmBf16x3] {
            assert!(
                ks.iter().any(|k| k.family == family
                    && k.invalid_reason().is_none()
                    && k.fits(&with_residual)),
                "{family:?}"
            );
        }
        // The padded split (ragged dims) still takes none: its GEMMs write an n-padded workspace.
        let ragged = GemmProblem {
            n: 4095,
            ..with_residual.clone()
        };
        assert!(Knowledge::shipped()
            .kernels(&ragged, MathType::Tf32x3, Arch::Sm90)
            .iter()
            .all(|k| !k.family.is_split()));
        let padded = KernelSpec {
            align: 1,
            ..k.clone()
        };
        assert!(
            padded.is_padded_split()
                && padded
                    .invalid_reason()
                    .unwrap()
                    .contains("no bias, epilogue or residual"),
            "{:?}",
            padded.invalid_reason()
        );
        // sm80 3xTF32 takes the residual as an aux load of its visitor tree.
        assert!(ks.iter().any(|k| k.family == Family::Sm80Gemm
            && k.fits(&with_residual)
            && k.invalid_reason().is_none()));
        let mut k = b3;
        k.dtype = DType::Bf16;
        assert!(k.invalid_reason().is_some(), "bf16 tensors have no split");
    }

    #[test]
    fn aux_loads_take_the_epilogue_shared_memory_of_c_from_the_mainloop() {
        let e = |text: &str| Some(Epilogue::parse(text).unwrap());
        let residuals = e("leaves=full,full;v1=add(v0,l0);v2=add(v1,l1)");
        let p = GemmProblem {
            bias: true,
            epilogue: residuals,
            ..problem(4096, 4096, 4096, DType::F32)
        };
        let coop = Knowledge::shipped()
            .kernels(&p, MathType::Tf32, Arch::Sm90)
            .into_iter()
            .find(|k| k.tile[..2] == [128, 128] && k.schedule == KernelSchedule::WsCooperative)
            .unwrap();
        assert_eq!(
            coop.leaf_reads(),
            vec![Some(LeafRead::C), Some(LeafRead::Aux)]
        );
        // A 128-row fp32 subtile of 128x32 is 16 KB, staged 4 deep: C (D reuses it) and one aux
        // load; without a full-size leaf the builder stages D alone, 2 deep.
        assert_eq!(coop.epilogue_smem_bytes(), 2 * 4 * 16 * 1024);
        assert_eq!(
            KernelSpec {
                fusion: e("leaves=full;v1=add(v0,l0)"),
                ..coop.clone()
            }
            .epilogue_smem_bytes(),
            4 * 16 * 1024
        );
        assert_eq!(
            KernelSpec {
                fusion: e("leaves=;v1=relu(v0)"),
                ..coop.clone()
            }
            .epilogue_smem_bytes(),
            2 * 16 * 1024
        );
        // 64-row subtiles (one consumer warpgroup) are half of that.
        let pp = KernelSpec {
            schedule: KernelSchedule::WsPingpong,
            ..coop.clone()
        };
        assert_eq!(pp.epilogue_smem_bytes(), 2 * 4 * 8 * 1024);
        assert_eq!(coop.invalid_reason(), None);
        // A 256x256 tile's 2 stages of 64 KB fit beside the epilogue's C (64 KB), not beside C and
        // an aux load (128 KB), and that is said before nvcc finds out.
        let big = KernelSpec {
            tile: [256, 256, 32],
            ..coop.clone()
        };
        assert_eq!(
            KernelSpec {
                fusion: e("leaves=full;v1=add(v0,l0)"),
                ..big.clone()
            }
            .invalid_reason(),
            None
        );
        let why = big.invalid_reason().unwrap();
        assert!(
            why.contains("(1 aux load(s) as deep as C) do not fit in shared memory"),
            "{why}"
        );
        let three = KernelSpec {
            fusion: e("leaves=full,full,full;v1=add(v0,l0);v2=add(v1,l1);v3=add(v2,l2)"),
            ..coop.clone()
        };
        assert!(
            three
                .invalid_reason()
                .unwrap()
                .contains("at most 2 full-size tensors"),
            "{:?}",
            three.invalid_reason()
        );
        // bf16 output: subtiles of half the bytes.
        let bf16 = KernelSpec {
            dtype: DType::Bf16,
            math: MathType::Bf16,
            align: 8,
            tile: [128, 128, 64],
            ..coop.clone()
        };
        assert_eq!(
            (bf16.epilogue_smem_bytes(), bf16.invalid_reason()),
            (2 * 4 * 8 * 1024, None)
        );
    }

    #[test]
    fn variants_share_their_kernel_and_name_their_knobs() {
        let p = problem(256, 256, 524288, DType::F32);
        let ks = Knowledge::shipped().kernels(&p, MathType::Tf32x3, Arch::Sm90);
        let k = ks
            .iter()
            .find(|k| k.family == Family::Sm80Gemm && k.scheduler == TileScheduler::Persistent)
            .unwrap();
        assert!(
            k.kernel_name().starts_with("sm80_gemm_rrr_tf32x3_f32_"),
            "{}",
            k.kernel_name()
        );
        let v = k.with_knobs(Knobs {
            splits: 8,
            ..Knobs::default()
        });
        assert_eq!(v.kernel_name(), k.kernel_name());
        assert_eq!(v.name(), format!("{}__rhw1k8", k.kernel_name()));
        assert_eq!(v.kernel(), *k);
        // Knob variants of a kernel stay valid and distinct.
        let grid = k.knob_grid(&p);
        assert!(!grid.is_empty() && grid.iter().all(|g| g.splits > 1));
        // Old table entries (no knobs, no sm80 fields) still read.
        let old = r#"{"family":"sm90_gemm","arch":"sm90","layout":"rrr","math":"tf32","dtype":"f32","tile":[128,256,32],"cluster":[1,2,1],"schedule":"ws_cooperative","scheduler":"persistent","bias":false,"align":4}"#;
        let back: KernelSpec = serde_json::from_str(old).unwrap();
        assert_eq!(
            back.name(),
            "sm90_gemm_rrr_tf32_f32_128x256x32_1x2x1_ws_coop_dp_align4"
        );
        assert_eq!(
            back.to_json(),
            old,
            "defaults are not written, so names and files stay stable"
        );
    }

    #[test]
    fn derivation_keeps_both_families_and_explains_every_prune() {
        let p = problem(4096, 4096, 4096, DType::F32);
        let scope = crate::kinds::gemm::scope(&p, MathType::Tf32, Arch::Sm90, "4.2.0");
        let opts = SpaceOptions {
            budget: 10,
            ..SpaceOptions::default()
        };
        let sp = derive(
            Knowledge::shipped(),
            &p,
            MathType::Tf32,
            Arch::Sm90,
            &[],
            &scope,
            &opts,
        );
        assert_eq!(sp.candidates.len(), 10);
        assert!(sp.candidates.iter().any(|k| k.family == Family::Sm80Gemm));
        assert!(sp.candidates.iter().any(|k| k.family == Family::Sm90Gemm));
        let total = Knowledge::shipped()
            .kernels(&p, MathType::Tf32, Arch::Sm90)
            .len();
        assert_eq!(
            sp.candidates.len() + sp.pruned.len(),
            total,
            "every kernel is either a candidate or pruned with a reason"
        );
        assert!(sp.pruned.iter().all(|x| !x.reason.is_empty()));
        // A learned rule prunes what it matches, and says so.
        let mut rules = vec![];
        crate::kinds::gemm::learn(
            &mut rules,
            &scope,
            validity::FailureKind::Compile,
            &sp.candidates[0],
            "error: boom",
            &[],
        );
        let again = derive(
            Knowledge::shipped(),
            &p,
            MathType::Tf32,
            Arch::Sm90,
            &rules,
            &scope,
            &opts,
        );
        assert!(!again.candidates.contains(&sp.candidates[0]));
        assert!(again
            .pruned
            .iter()
            .any(|x| x.kernel == sp.candidates[0].name()
                && x.reason.contains("learned compile rule")));
    }

    #[test]
    fn an_sm80_build_has_the_sm80_family_alone_under_its_own_names() {
        for (dtype, math) in [
            (DType::F32, MathType::Tf32),
            (DType::F32, MathType::Tf32x3),
            (DType::Bf16, MathType::Bf16),
        ] {
            let p = problem(4096, 4096, 4096, dtype);
            let ks = Knowledge::shipped().kernels(&p, math, Arch::Sm80);
            assert!(!ks.is_empty(), "{math:?}");
            assert!(
                ks.iter().all(|k| k.family == Family::Sm80Gemm
                    && k.arch == Arch::Sm80
                    && k.invalid_reason().is_none()),
                "{math:?}"
            );
            // The same instantiations as an sm90 build's sm80 family, each under a name of its own.
            let on_sm90: Vec<KernelSpec> = Knowledge::shipped()
                .kernels(&p, math, Arch::Sm90)
                .into_iter()
                .filter(|k| k.family == Family::Sm80Gemm)
                .collect();
            assert_eq!(on_sm90.len(), ks.len());
            for (a, b) in ks.iter().zip(&on_sm90) {
                assert_eq!(a.kernel_name(), format!("{}_for_sm80", b.kernel_name()));
            }
            let c = gemm_candidates(&p, math, Arch::Sm80);
            assert!(
                c.len() >= 4 && c.iter().all(|k| k.arch == Arch::Sm80),
                "{math:?}: {}",
                c.len()
            );
        }
        let p = problem(4096, 4096, 4096, DType::F32);
        let wgmma = Knowledge::shipped()
            .kernels(&p, MathType::Tf32, Arch::Sm90)
            .into_iter()
            .find(|k| k.family == Family::Sm90Gemm)
            .unwrap();
        let on_sm80 = KernelSpec {
            arch: Arch::Sm80,
            ..wgmma
        };
        assert!(
            on_sm80.invalid_reason().unwrap().contains("needs sm90"),
            "{:?}",
            on_sm80.invalid_reason()
        );
        // Six 32 KB stages fit an H100's shared memory, not an A100's.
        let mut k = Knowledge::shipped()
            .kernels(&p, MathType::Tf32, Arch::Sm80)
            .into_iter()
            .find(|k| k.tile == [128, 128, 32])
            .unwrap();
        k.stages = 6;
        assert!(
            k.invalid_reason().unwrap().contains("A100's shared memory"),
            "{:?}",
            k.invalid_reason()
        );
        assert_eq!(
            KernelSpec {
                arch: Arch::Sm90,
                ..k
            }
            .invalid_reason(),
            None
        );
    }

    #[test]
    fn sm80_kernels_fuse_epilogues_without_serial_split_k() {
        let e = Epilogue::parse("leaves=full,col;v1=gelu(v0);v2=mul(v1,l1);v3=add(v2,l0)").unwrap();
        // Long K over few tiles: an unfused data-parallel kernel would split K.
        let p = GemmProblem {
            bias: true,
            epilogue: Some(e.clone()),
            ..problem(256, 256, 524288, DType::F32)
        };
        for arch in Arch::ALL {
            let ks = Knowledge::shipped().kernels(&p, MathType::Tf32, arch);
            let sm80: Vec<&KernelSpec> =
                ks.iter().filter(|k| k.family == Family::Sm80Gemm).collect();
            assert!(
                !sm80.is_empty()
                    && sm80.iter().all(|k| k.fusion.as_ref() == Some(&e)
                        && k.fits(&p)
                        && k.invalid_reason().is_none()),
                "{arch}"
            );
            let dp = sm80
                .iter()
                .find(|k| k.scheduler == TileScheduler::Persistent)
                .unwrap();
            assert_eq!(estimate::with_best_splits(dp, &p).knobs.splits, 1, "{arch}");
            assert!(dp.knob_grid(&p).is_empty(), "{arch}");
            let split = dp.with_knobs(Knobs {
                splits: 4,
                ..Knobs::default()
            });
            assert!(
                split
                    .invalid_reason()
                    .unwrap()
                    .contains("no serial split-K"),
                "{arch}"
            );
            assert!(
                sm80.iter().any(|k| k.scheduler == TileScheduler::StreamK),
                "Stream-K splits K for them"
            );
        }
        let c = gemm_candidates(&p, MathType::Tf32, Arch::Sm80);
        assert!(!c.is_empty() && c.iter().all(|k| k.fusion.is_some() && k.knobs.splits == 1));
        // A column leaf is read element by element on sm80: an m that is no multiple of the
        // output's vector still fits, where sm90's vector reads refuse it.
        let odd_m = GemmProblem {
            m: 250,
            ..p.clone()
        };
        let ks = Knowledge::shipped().kernels(&odd_m, MathType::Tf32, Arch::Sm90);
        assert!(ks
            .iter()
            .any(|k| k.family == Family::Sm80Gemm && k.fits(&odd_m)));
        assert!(ks
            .iter()
            .filter(|k| k.family == Family::Sm90Gemm)
            .all(|k| !k.fits(&odd_m)));
    }

    #[test]
    fn alignment_reads_each_contiguous_dim() {
        let p = |m, n, k, layout| GemmProblem {
            layout,
            ..problem(m, n, k, DType::F32)
        };
        assert_eq!(p(4096, 4096, 4096, GemmLayout::Rrr).alignment(4), 4);
        // rrr: a reads K, b and the output N; M is no operand's contiguous dim.
        assert_eq!(p(4099, 4096, 4096, GemmLayout::Rrr).alignment(4), 4);
        assert_eq!(p(4096, 4096, 4094, GemmLayout::Rrr).alignment(4), 2);
        assert_eq!(p(4096, 4095, 4096, GemmLayout::Rrr).alignment(4), 1);
        // crr: a column-major reads M.
        assert_eq!(p(4098, 4096, 4096, GemmLayout::Crr).alignment(4), 2);
        assert_eq!(p(4096, 4096, 4098, GemmLayout::Crr).alignment(4), 4);
        // bf16 counts 8 elements to 16 bytes.
        assert_eq!(
            (GemmProblem {
                dtype: DType::Bf16,
                ..p(64, 4100, 64, GemmLayout::Rcr)
            })
            .alignment(8),
            4
        );
        // The plan's note names what the arch has: no TMA and no split on sm80.
        let ragged = p(4096, 4094, 4096, GemmLayout::Rrr);
        assert!(
            alignment_note(&ragged, Arch::Sm90).contains("cp.async / sm80 candidates")
                && alignment_note(&ragged, Arch::Sm90).contains("pads its split parts")
        );
        assert_eq!(
            alignment_note(&ragged, Arch::Sm80),
            "alignment 2: sm80 kernels of that alignment (a contiguous dim is not a multiple of 4)"
        );
        assert!(!alignment_note(&p(4096, 4096, 4096, GemmLayout::Rrr), Arch::Sm80).contains("TMA"));
    }

    #[test]
    fn ragged_problems_get_cp_async_sm80_and_padded_split_candidates() {
        // n = 30: every contiguous dim is even, none a multiple of 4.
        let even = problem(64, 30, 64, DType::F32);
        let ks = Knowledge::shipped().kernels(&even, MathType::Tf32, Arch::Sm90);
        assert!(!ks.is_empty());
        assert!(
            ks.iter()
                .all(|k| k.align == 2 && k.fits(&even) && k.invalid_reason().is_none()),
            "{:?}",
            ks.iter().map(KernelSpec::name).collect::<Vec<_>>()
        );
        let cp = ks
            .iter()
            .find(|k| k.schedule == KernelSchedule::CpAsyncWsCooperative)
            .expect("an sm90 cp.async kernel");
        // CUTLASS's generator stores the tf32 cp.async rows' output element by element.
        assert_eq!(
            (cp.align_out(), cp.epilogue, cp.cluster),
            (1, EpilogueKind::NoSmem, [1, 1, 1])
        );
        assert!(
            cp.kernel_name().ends_with("_cp_ws_coop_dp_nosmem_align2c1"),
            "{}",
            cp.kernel_name()
        );
        assert!(ks.iter().any(|k| k.family == Family::Sm80Gemm));
        // An odd dim: alignment 1.
        let odd = problem(4099, 5003, 3001, DType::F32);
        let c = gemm_candidates(&odd, MathType::Tf32, Arch::Sm90);
        assert!(c
            .iter()
            .any(|k| k.family == Family::Sm90Gemm && k.schedule.is_cpasync()));
        assert!(c.iter().any(|k| k.family == Family::Sm80Gemm));
        assert!(c
            .iter()
            .all(|k| k.align == 1 && k.align_c == 0 && k.kernel_name().ends_with("_align1")));
        // f32-accurate: the padded splits (alignment 1) and sm80 3xTF32.
        assert!(gemm_candidates(&odd, MathType::Tf32x3, Arch::Sm90)
            .iter()
            .any(|k| k.is_padded_split()));
        let c: Vec<_> = Knowledge::shipped()
            .kernels(&odd, MathType::Tf32x3, Arch::Sm90)
            .into_iter()
            .filter(|k| k.invalid_reason().is_none())
            .collect();
        for family in [Family::Sm90GemmX3, Family::Sm90GemmBf16x3, Family::Sm80Gemm] {
            assert!(
                c.iter().any(|k| k.family == family && k.align == 1),
                "{family:?}"
            );
        }
        assert!(c
            .iter()
            .filter(|k| k.family.is_split())
            .all(|k| k.is_padded_split()
                && k.gemm_align() == 16 / k.operand_bytes()
                && !k.schedule.is_cpasync()));
        // A ragged GEMM with a bias: sm80 takes the bias as its C operand; the no-smem epilogue
        // and the padded split fuse none.
        let biased = GemmProblem {
            bias: true,
            ..odd.clone()
        };
        for math in [MathType::Tf32, MathType::Tf32x3] {
            let c = gemm_candidates(&biased, math, Arch::Sm90);
            assert!(
                !c.is_empty() && c.iter().all(|k| k.family == Family::Sm80Gemm && k.bias),
                "{math:?}"
            );
        }
        // bf16 with an odd dim has no kernel at alignment 1 in CUTLASS's generator.
        let bf16 = problem(4099, 5003, 3001, DType::Bf16);
        assert!(gemm_candidates(&bf16, MathType::Bf16, Arch::Sm90).is_empty());
    }

    #[test]
    fn aligned_problems_keep_their_tma_candidates() {
        for math in [MathType::Tf32, MathType::Tf32x3] {
            let p = problem(4096, 4096, 4096, DType::F32);
            let ks = Knowledge::shipped().kernels(&p, math, Arch::Sm90);
            assert!(
                ks.iter()
                    .all(|k| !k.schedule.is_cpasync() && k.align_c == 0 && !k.is_padded_split()),
                "{math:?}"
            );
            assert!(
                ks.iter().all(|k| k.align == 16 / k.operand_bytes()),
                "{math:?}"
            );
        }
        // An n that is a multiple of 4 but not 8: the tf32 split keeps its aligned kernels; the
        // bf16 split, whose parts want 8, pads.
        let p = problem(4096, 4100, 4096, DType::F32);
        let ks = Knowledge::shipped().kernels(&p, MathType::Tf32x3, Arch::Sm90);
        assert!(ks
            .iter()
            .filter(|k| k.family == Family::Sm90GemmX3)
            .all(|k| k.align == 4));
        assert!(ks
            .iter()
            .filter(|k| k.family == Family::Sm90GemmBf16x3)
            .all(|k| k.align == 1));
    }

    #[test]
    fn alignment_rules_name_their_fix() {
        let odd = problem(4099, 5003, 3001, DType::F32);
        let ks = Knowledge::shipped().kernels(&odd, MathType::Tf32, Arch::Sm90);
        let cp = ks
            .iter()
            .find(|k| k.schedule == KernelSchedule::CpAsyncWs)
            .unwrap();
        let mut tma = KernelSpec {
            schedule: KernelSchedule::Ws,
            ..cp.clone()
        };
        assert!(tma
            .invalid_reason()
            .unwrap()
            .contains("cp.async schedules or the sm80 family"));
        tma.align = 3;
        assert!(tma.invalid_reason().unwrap().contains("power of two"));
        let clustered = KernelSpec {
            cluster: [2, 1, 1],
            ..cp.clone()
        };
        assert!(clustered
            .invalid_reason()
            .unwrap()
            .contains("cluster 1x1x1"));
        // TMA kernels take CUTLASS's sm90 cluster shapes, no others.
        let aligned = problem(4096, 4096, 4096, DType::F32);
        let tma = Knowledge::shipped()
            .kernels(&aligned, MathType::Tf32, Arch::Sm90)
            .into_iter()
            .find(|k| k.family == Family::Sm90Gemm && !k.schedule.is_cpasync())
            .unwrap();
        for (cluster, ok) in [
            ([2, 2, 1], true),
            ([1, 1, 1], true),
            ([1, 3, 1], false),
            ([2, 4, 1], false),
            ([1, 1, 2], false),
        ] {
            let k = KernelSpec {
                cluster,
                ..tma.clone()
            };
            assert_eq!(
                k.invalid_reason().is_none(),
                ok,
                "{cluster:?}: {:?}",
                k.invalid_reason()
            );
        }
        let canonical = KernelSpec {
            align_c: 1,
            ..cp.clone()
        };
        assert!(
            canonical.invalid_reason().unwrap().contains("other than 1"),
            "one kernel, one name"
        );
        // A kernel of alignment 4 does not fit a ragged problem; its alignment-1 sibling does.
        let aligned = Knowledge::shipped().kernels(
            &problem(4096, 4096, 4096, DType::F32),
            MathType::Tf32,
            Arch::Sm90,
        );
        assert!(aligned.iter().all(|k| !k.fits(&odd)));
        assert!(ks
            .iter()
            .all(|k| k.fits(&odd) && k.fits(&problem(4096, 4096, 4096, DType::F32))));
    }

    #[test]
    fn tma_128_and_256_wide_tiles_have_192_wide_siblings_in_both_schedules_and_nothing_else_does() {
        let p = problem(65536, 768, 3072, DType::F32);
        let ks = Knowledge::shipped().kernels(&p, MathType::Tf32, Arch::Sm90);
        let find = |schedule: KernelSchedule, tile: [u32; 2]| {
            ks.iter()
                .find(|k| {
                    k.family == Family::Sm90Gemm && k.schedule == schedule && k.tile[..2] == tile
                })
                .unwrap_or_else(|| panic!("a {schedule:?} {tile:?} kernel"))
        };
        use KernelSchedule::{WsCooperative as Coop, WsPingpong as Pp};
        let stream_k = KernelSpec {
            scheduler: TileScheduler::StreamK,
            ..find(Coop, [128, 256]).clone()
        };
        assert!(stream_k.invalid_reason().is_none());
        let leaders = [
            find(Coop, [128, 256]).clone(),
            find(Coop, [128, 128]).clone(),
            find(Pp, [128, 128]).clone(),
            stream_k,
        ];
        for leader in leaders {
            let leader = KernelSpec {
                knobs: Knobs {
                    swizzle: 4,
                    ..Knobs::default()
                },
                ..leader
            };
            // The knowledge base pairs TMA kernels with 1x2x1 and 2x1x1 clusters only.
            assert_ne!(leader.cluster, [1, 1, 1]);
            let sib = leader.tile_siblings(&p);
            let got: Vec<(KernelSchedule, [u32; 3])> =
                sib.iter().map(|k| (k.schedule, k.cluster)).collect();
            let c = leader.cluster;
            assert_eq!(
                got,
                [(Coop, c), (Coop, [1, 1, 1]), (Pp, c), (Pp, [1, 1, 1])],
                "{}",
                leader.name()
            );
            for k in &sib {
                assert_eq!(k.tile, [128, 192, leader.tile[2]]);
                // Stream-K only where the leader's cooperative schedule is kept.
                let scheduler = if k.schedule == leader.schedule {
                    leader.scheduler
                } else {
                    TileScheduler::Persistent
                };
                assert_eq!(k.scheduler, scheduler, "{}", k.name());
                assert_eq!(
                    KernelSpec {
                        tile: leader.tile,
                        cluster: leader.cluster,
                        schedule: leader.schedule,
                        scheduler: leader.scheduler,
                        knobs: leader.knobs,
                        ..k.clone()
                    },
                    leader,
                    "only the tile, the cluster, the schedule and the knobs change"
                );
                assert_eq!(k.knobs, Knobs::default());
                assert!(k.invalid_reason().is_none() && k.fits(&p));
                assert!(k.name().contains("128x192x32"), "{}", k.name());
            }
            let alone = KernelSpec {
                cluster: [1, 1, 1],
                ..leader.clone()
            };
            assert_eq!(alone.tile_siblings(&p).len(), 2);
        }
        // 128 tall only, and from the 128- and 256-wide tiles.
        let short = ks
            .iter()
            .find(|k| k.schedule == Pp && k.tile[0] == 64)
            .expect("a 64-row ping-pong kernel");
        assert!(short.tile_siblings(&p).is_empty());
        let tall = KernelSpec {
            tile: [256, 192, 32],
            ..find(Coop, [128, 256]).clone()
        };
        assert!(tall
            .invalid_reason()
            .unwrap()
            .contains("cooperative and ping-pong 128x192"));
        let wide = KernelSpec {
            tile: [256, 128, 32],
            ..find(Coop, [128, 256]).clone()
        };
        assert!(wide.tile_siblings(&p).is_empty());
        let sm80 = ks.iter().find(|k| k.family == Family::Sm80Gemm).unwrap();
        assert!(sm80.tile_siblings(&p).is_empty());
        // Nor the cp.async mainloops or the split families, where it was never measured.
        for k in ks.iter().filter(|k| k.schedule.is_cpasync()) {
            assert!(k.tile_siblings(&p).is_empty(), "{}", k.name());
            let k192 = KernelSpec {
                tile: [128, 192, k.tile[2]],
                ..k.clone()
            };
            assert!(k192.invalid_reason().is_some(), "{}", k192.name());
        }
        let split = KernelSpec {
            family: Family::Sm90GemmX3,
            ..find(Coop, [128, 256]).clone()
        };
        assert!(split.tile_siblings(&p).is_empty());
        assert!(KernelSpec {
            tile: [128, 192, 32],
            ..split
        }
        .invalid_reason()
        .is_some());
    }
}
