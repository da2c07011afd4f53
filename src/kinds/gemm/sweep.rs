//! A GEMM sweep's rounds. The first: the space derived from CUTLASS's generator (the knowledge
//! base, less what cannot run the problem, what a learned validity rule rejects and what the
//! estimate calls hopeless), as the agent proposes it, capped at the budget; where nothing of it
//! passes, the agent may propose one more set. Then the sibling round (CUTLASS's other cluster
//! shapes and the 128x192 tiles of the fastest tile and schedule pairs: one more nvcc round) and
//! the knob round (raster, swizzle and K splits of the fastest kernels: new variants of objects
//! already compiled, so a dispatch index and a link, not nvcc time).

use super::space::{self, KernelSpec, Knowledge};
use super::Gemm;
use crate::agent::Steward;
use crate::kinds::gemm::GemmProblem;
use crate::kinds::{Candidates, Measured, Spec, SweepCx};
use crate::types::{Arch, MathType};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// How many of a sweep's fastest tile and schedule pairs get a sibling round: each brings up to
/// nine new nvcc units (five cluster shapes, four of the 192-wide tile), compiled in parallel.
pub const SIBLING_ROUND_TOP: usize = 3;

/// The rounds after the first, by the suffix of the folder each compiles in.
pub const ROUNDS: &[&str] = &["_siblings", "_knobs"];

/// The first round: the derived space, less what the tables learned to fail, as the agent
/// proposes it, capped at the budget; or why there are none.
pub fn first_round(p: &GemmProblem, cx: &mut SweepCx) -> Result<Candidates, String> {
    let (kb, kb_note) = Knowledge::for_cutlass(cx.cutlass)?;
    if let Some(n) = kb_note {
        if !cx.steward.notes.contains(&n) {
            cx.steward.notes.push(n);
        }
    }
    let space = space::derive(&kb, p, cx.math, cx.arch, cx.rules, cx.scope, cx.space);
    let mut candidates = propose(
        cx.steward,
        p,
        cx.math,
        cx.arch,
        space.candidates.clone(),
        cx.failed,
    );
    let (rules, scope) = (cx.rules, cx.scope);
    candidates.retain(|k| match super::rejecting(rules, scope, k) {
        Some(r) => {
            cx.steward
                .notes
                .push(format!("{} not tried: {}", k.name(), r.describe()));
            false
        }
        None => true,
    });
    candidates.truncate(cx.space.budget);
    if candidates.is_empty() {
        return Ok(Candidates::None(format!(
            "no valid {} kernel for {} ({} in the knowledge base, {} pruned; {}{})",
            cx.arch,
            p.shape_key(),
            space.candidates.len() + space.pruned.len(),
            space.pruned.len(),
            space::alignment_note(p, cx.arch),
            space::fusion_refusal(p, cx.math, cx.arch)
                .map(|why| format!("; {why}"))
                .unwrap_or_default()
        )));
    }
    // What the kernels came from, next to the sweep's sources: estimates, and every pruned
    // candidate with its reason.
    let record = json!({
        "source": space.source,
        "estimates_ms": candidates.iter().map(|k| (k.name(), space::estimate::estimate_ms(k, p))).collect::<BTreeMap<_, _>>(),
        "pruned": space.pruned,
    });
    Ok(Candidates::Kernels {
        specs: candidates.into_iter().map(Spec::from).collect(),
        space: Some(record),
    })
}

/// The agent's candidates from `space` (less the kernels that failed before), each validated
/// (`check_candidate`).
pub fn propose(
    steward: &mut Steward,
    p: &GemmProblem,
    math: MathType,
    arch: Arch,
    space: Vec<KernelSpec>,
    failed: &BTreeSet<String>,
) -> Vec<KernelSpec> {
    let space: Vec<KernelSpec> = space
        .into_iter()
        .filter(|k| !failed.contains(&k.name()))
        .collect();
    let problem = serde_json::to_value(p).expect("problem serializes");
    steward.propose(
        &problem,
        &p.rule_id(),
        &p.shape_key(),
        math,
        arch,
        space,
        &|v| check_candidate(v, p, math, arch, failed),
    )
}

/// After a first round where no kernel passed: the agent's retry, validated, or None.
pub fn retry(
    steward: &mut Steward,
    p: &GemmProblem,
    math: MathType,
    arch: Arch,
    failures: &[(String, String)],
    failed: &BTreeSet<String>,
) -> Option<Vec<KernelSpec>> {
    let problem = serde_json::to_value(p).expect("problem serializes");
    steward.after_failure(&problem, &p.rule_id(), failures, &|v| {
        check_candidate(v, p, math, arch, failed)
    })
}

/// Why a proposed kernel is refused, if it is.
pub fn check_candidate(
    v: &Value,
    p: &GemmProblem,
    math: MathType,
    arch: Arch,
    failed: &BTreeSet<String>,
) -> Result<KernelSpec, String> {
    let spec: KernelSpec =
        serde_json::from_value(v.clone()).map_err(|e| format!("not a KernelSpec: {e}"))?;
    check_kernel(&spec, p, math, arch, failed)?;
    Ok(spec)
}

/// Why `spec` cannot run `p` under `math` on `arch` (target, instantiation, fit), or is known to
/// fail (`failed`), if so: what an agent's proposal and a table's nearby winner (`Kind::admits`)
/// are both held to.
pub fn check_kernel(
    spec: &KernelSpec,
    p: &GemmProblem,
    math: MathType,
    arch: Arch,
    failed: &BTreeSet<String>,
) -> Result<(), String> {
    if spec.arch != arch || spec.math != math {
        return Err(format!(
            "targets {} {}, the pattern needs {} {}",
            spec.arch,
            spec.math.short_name(),
            arch,
            math.short_name()
        ));
    }
    if let Some(why) = spec.invalid_reason() {
        return Err(format!("invalid instantiation: {why}"));
    }
    if !spec.fits(p) {
        return Err(format!(
            "does not fit {} {} (dtype, layout, bias or alignment)",
            p.rule_id(),
            p.shape_key()
        ));
    }
    if failed.contains(&spec.name()) {
        return Err(format!(
            "{} failed before on this arch and dtype (pattern table)",
            spec.name()
        ));
    }
    Ok(())
}

/// Round `i` after the first (`ROUNDS`): 0 the sibling round of the `min(refine, 3)` fastest
/// tile and schedule pairs, 1 the knob round of the `refine` fastest kernels.
pub fn round(i: usize, p: &GemmProblem, measured: &[Measured], refine: usize) -> Vec<Spec> {
    let kernels = match i {
        0 => refine_siblings(measured, p, refine.min(SIBLING_ROUND_TOP)),
        1 => refine_candidates(measured, p, refine),
        _ => vec![],
    };
    kernels.into_iter().map(Spec::from).collect()
}

/// The `top` fastest verified GEMM kernels measured, fastest first.
fn fastest(measured: &[Measured], top: usize) -> Vec<&KernelSpec> {
    let mut ok: Vec<(&KernelSpec, f64)> = measured
        .iter()
        .filter_map(|m| Some((m.spec.get::<KernelSpec>()?, m.ms?)))
        .collect();
    ok.sort_by(|a, b| a.1.total_cmp(&b.1));
    ok.into_iter().take(top).map(|(k, _)| k).collect()
}

/// `derive`'s variants of `leaders` not yet measured, each once.
fn unmeasured_variants<'a>(
    measured: &[Measured],
    leaders: impl IntoIterator<Item = &'a KernelSpec>,
    derive: impl Fn(&KernelSpec) -> Vec<KernelSpec>,
) -> Vec<KernelSpec> {
    let seen: BTreeSet<String> = measured.iter().map(|m| m.spec.name()).collect();
    let mut out: Vec<KernelSpec> = Vec::new();
    for v in leaders.into_iter().flat_map(derive) {
        if !seen.contains(&v.name()) && !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// Knob variants of the `top` fastest verified kernels measured, not yet measured themselves.
pub fn refine_candidates(measured: &[Measured], p: &GemmProblem, top: usize) -> Vec<KernelSpec> {
    unmeasured_variants(measured, fastest(measured, top), |spec| {
        spec.knob_grid(p)
            .into_iter()
            .map(|knobs| spec.with_knobs(knobs))
            .filter(|v| v.fits(p))
            .collect()
    })
}

/// CUTLASS's other sm90 cluster shapes (space::SM90_CLUSTERS) and, for a cooperative or ping-pong
/// 128x128 or 128x256 tile, the 128x192 one in both schedules (space::SM90_TILE_N192), of the
/// fastest kernel of each of the `top` fastest tile and schedule pairs measured, those not yet
/// measured themselves. The estimate cannot tell cluster shapes apart, and the knowledge base's
/// default build pairs TMA kernels with two of them and has no 192-wide tile, so the sweep
/// measures these where a tile and schedule have done well. Pairs, not kernels: one pair's
/// clusters differ by more than pairs do (tf32 65536x2304x768 + bias on the H100: 128x128
/// ping-pong 0.693 ms in 1x2x1, 0.629 in 2x2x1; 128x256 cooperative 0.656).
pub fn refine_siblings(measured: &[Measured], p: &GemmProblem, top: usize) -> Vec<KernelSpec> {
    let mut pairs = std::collections::HashSet::new();
    let leaders: Vec<&KernelSpec> = fastest(measured, usize::MAX)
        .into_iter()
        .filter(|k| pairs.insert((k.family, k.tile, k.schedule, k.epilogue, k.stages)))
        .take(top)
        .collect();
    unmeasured_variants(measured, leaders, |k| {
        let mut v = k.cluster_siblings(p);
        v.extend(k.tile_siblings(p));
        v
    })
}

/// The sweep hooks of `Gemm` (mod.rs) call these.
impl Gemm {
    pub(super) fn sweep_retry(
        p: &GemmProblem,
        cx: &mut SweepCx,
        failures: &[(String, String)],
        avoid: &BTreeSet<String>,
    ) -> Option<Vec<Spec>> {
        retry(cx.steward, p, cx.math, cx.arch, failures, avoid)
            .map(|ks| ks.into_iter().map(Spec::from).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::gemm::space::{gemm_candidates, Family, SM90_CLUSTERS};
    use crate::kinds::gemm::GemmLayout;
    use crate::types::DType;

    fn problem() -> GemmProblem {
        GemmProblem {
            m: 65536,
            n: 768,
            k: 768,
            layout: GemmLayout::Rcr,
            dtype: DType::F32,
            bias: true,
            batch: 1,
            epilogue: None,
            padded_from: None,
        }
    }

    /// `k` measured at `ms`.
    fn timed(k: &KernelSpec, ms: f64) -> Measured {
        Measured {
            spec: k.clone().into(),
            ms: Some(ms),
        }
    }

    /// What a round sees of a run with these candidates.
    fn run(candidates: Vec<Measured>) -> Vec<Measured> {
        candidates
    }

    #[test]
    fn the_sibling_round_tries_the_other_shapes_of_the_fastest_tma_kernels_only() {
        let p = problem();
        let ks = gemm_candidates(&p, MathType::Tf32, Arch::Sm90);
        let tma: Vec<&KernelSpec> = ks
            .iter()
            .filter(|k| k.family == Family::Sm90Gemm && !k.schedule.is_cpasync())
            .collect();
        let first = tma[0];
        let other_pair = |k: &&&KernelSpec| k.tile != first.tile || k.schedule != first.schedule;
        let second = *tma.iter().find(other_pair).unwrap();
        let third = *tma
            .iter()
            .filter(other_pair)
            .find(|k| k.tile != second.tile || k.schedule != second.schedule)
            .unwrap();
        // first's pair in another cluster, faster than second: the pair leads once.
        let first_again = KernelSpec {
            cluster: [1, 1, 1],
            ..first.clone()
        };
        // The second-fastest's 1x1x1 shape was measured already; a failed kernel is not "fastest".
        let measured_sibling = KernelSpec {
            cluster: [1, 1, 1],
            ..second.clone()
        };
        // A numeric failure: measured, no time.
        let mut failed = timed(third, 0.0);
        failed.ms = None;
        let r = run(vec![
            timed(second, 0.30),
            timed(first, 0.25),
            timed(&first_again, 0.27),
            timed(&measured_sibling, 0.40),
            failed,
        ]);
        let out = refine_siblings(&r, &p, 2);
        let names: Vec<String> = out.iter().map(|k| k.name()).collect();
        assert!(!out.is_empty());
        for k in &out {
            assert!(k.invalid_reason().is_none() && k.fits(&p), "{}", k.name());
            assert!(SM90_CLUSTERS.contains(&k.cluster));
            let base = KernelSpec {
                cluster: [0; 3],
                ..k.clone()
            };
            // Another cluster shape of a leader, or one of its 128x192 tiles.
            let of = |s: &KernelSpec| {
                KernelSpec {
                    cluster: [0; 3],
                    ..s.clone()
                } == base
                    || s.tile_siblings(&p).contains(k)
            };
            assert!(
                of(first) || of(second),
                "{} is no sibling of the two fastest (the failed one brings none)",
                k.name()
            );
        }
        assert!(
            !names.contains(&measured_sibling.name()),
            "measured once is enough"
        );
        assert!(!names.contains(&first.name()) && !names.contains(&second.name()));
        assert!(!names.contains(&first_again.name()));
        assert!(
            out.iter()
                .any(|k| k.tile == second.tile && k.schedule == second.schedule),
            "the second pair leads although first's pair measured twice"
        );
        let firsts = out
            .iter()
            .filter(|k| {
                k.tile == first.tile
                    && k.schedule == first.schedule
                    && k.epilogue == first.epilogue
                    && k.scheduler == first.scheduler
            })
            .count();
        assert!(firsts >= 1 && firsts < SM90_CLUSTERS.len());
        assert!(
            refine_siblings(&r, &p, 0).is_empty(),
            "--refine 0 turns it off"
        );
        // Only the fastest pair: the second's siblings stay out.
        let one = refine_siblings(&r, &p, 1);
        assert!(!one.is_empty());
        assert!(one.iter().all(|k| KernelSpec {
            cluster: first.cluster,
            ..k.clone()
        } == *first
            || first.tile_siblings(&p).contains(k)));
        // cp.async mainloops and sm80 kernels have no clusters or tiles to try.
        let cp = ks.iter().find(|k| k.schedule.is_cpasync());
        let sm80 = ks.iter().find(|k| k.family == Family::Sm80Gemm);
        for k in cp.into_iter().chain(sm80) {
            assert!(k.cluster_siblings(&p).is_empty(), "{}", k.name());
            assert!(k.tile_siblings(&p).is_empty(), "{}", k.name());
        }
    }

    #[test]
    fn a_cooperative_leader_brings_its_192_wide_tiles_to_the_sibling_round() {
        let p = problem();
        let ks = gemm_candidates(&p, MathType::Tf32, Arch::Sm90);
        let coop = ks
            .iter()
            .find(|k| {
                k.family == Family::Sm90Gemm
                    && k.schedule == crate::kinds::gemm::space::KernelSchedule::WsCooperative
                    && k.tile[..2] == [128, 256]
            })
            .expect("a cooperative 128x256 candidate");
        let wide = KernelSpec {
            tile: [128, 192, coop.tile[2]],
            ..coop.clone()
        };
        let pingpong = KernelSpec {
            schedule: crate::kinds::gemm::space::KernelSchedule::WsPingpong,
            scheduler: crate::kinds::gemm::space::TileScheduler::Persistent,
            ..wide.clone()
        };
        let out = refine_siblings(&run(vec![timed(coop, 0.8)]), &p, 1);
        let names: Vec<String> = out.iter().map(|k| k.name()).collect();
        for k in [&wide, &pingpong] {
            let alone = KernelSpec {
                cluster: [1, 1, 1],
                ..k.clone()
            };
            assert!(out.contains(k) && out.contains(&alone), "{names:?}");
        }
        assert_eq!(out.iter().filter(|k| k.tile != coop.tile).count(), 4);
        // Measured once is enough.
        let out = refine_siblings(&run(vec![timed(coop, 0.8), timed(&pingpong, 0.9)]), &p, 1);
        assert!(out.contains(&wide) && !out.contains(&pingpong));
    }

    /// The 4096³ rrr GEMM.
    fn square() -> GemmProblem {
        GemmProblem {
            m: 4096,
            n: 4096,
            k: 4096,
            layout: GemmLayout::Rrr,
            dtype: DType::F32,
            bias: false,
            batch: 1,
            epilogue: None,
            padded_from: None,
        }
    }

    #[test]
    fn invalid_proposals_go_back_with_reasons_then_valid_ones_are_kept() {
        let space = gemm_candidates(&square(), MathType::Tf32, Arch::Sm90);
        let mut bad = space[0].clone();
        bad.tile = [64, 128, 32];
        bad.schedule = crate::kinds::gemm::space::KernelSchedule::WsCooperative;
        let agent = crate::agent::tests::Scripted {
            order: Ok(vec![]),
            proposals: vec![
                vec![
                    serde_json::to_value(&bad).unwrap(),
                    serde_json::json!({"tile": "big"}),
                ],
                vec![serde_json::to_value(&space[2]).unwrap()],
            ],
            seen_rejections: vec![],
        };
        let mut s = Steward::with(Box::new(agent));
        let got = propose(
            &mut s,
            &square(),
            MathType::Tf32,
            Arch::Sm90,
            gemm_candidates(&square(), MathType::Tf32, Arch::Sm90),
            &BTreeSet::new(),
        );
        assert_eq!(got, vec![space[2].clone()]);
        assert!(
            s.notes.iter().any(|n| n.contains("cooperative")),
            "{:?}",
            s.notes
        );
        assert!(
            s.notes.iter().any(|n| n.contains("not a KernelSpec")),
            "{:?}",
            s.notes
        );
    }

    #[test]
    fn kernels_that_failed_before_are_refused() {
        let space = gemm_candidates(&square(), MathType::Tf32, Arch::Sm90);
        let failed: BTreeSet<String> = [space[0].name()].into();
        let v = serde_json::to_value(&space[0]).unwrap();
        assert!(
            check_candidate(&v, &square(), MathType::Tf32, Arch::Sm90, &failed)
                .unwrap_err()
                .contains("failed before")
        );
        assert!(!propose(
            &mut Steward::builtin(),
            &square(),
            MathType::Tf32,
            Arch::Sm90,
            space.clone(),
            &failed
        )
        .contains(&space[0]));
    }
}
