//! The validity rules learned from the GEMM kind's failures: `space::validity` over a GEMM
//! kernel's features (`learn`, `rejecting`), in the scope of a GEMM sweep.

use crate::kinds::gemm::space::{
    gemm_candidates, Family, KernelSchedule, KernelSpec, TileScheduler,
};
use crate::kinds::gemm::{learn, rejecting};
use crate::kinds::gemm::{GemmLayout, GemmProblem};
use crate::space::validity::*;
use crate::types::{Arch, DType, MathType};
use serde_json::Value;

fn problem() -> GemmProblem {
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
fn scope() -> Scope {
    crate::kinds::gemm::scope(&problem(), MathType::Tf32, Arch::Sm90, "4.2.0.0")
}
fn space() -> Vec<KernelSpec> {
    gemm_candidates(&problem(), MathType::Tf32, Arch::Sm90)
}

#[test]
fn a_failure_rejects_its_kernel_and_counts_repeats() {
    let ks = space();
    let mut rules = vec![];
    learn(
        &mut rules,
        &scope(),
        FailureKind::Compile,
        &ks[0],
        "error: static_assert failed",
        &[],
    );
    assert_eq!(rules.len(), 1);
    assert!(rejecting(&rules, &scope(), &ks[0]).is_some());
    assert!(rejecting(&rules, &scope(), &ks[1]).is_none());
    learn(
        &mut rules,
        &scope(),
        FailureKind::Compile,
        &ks[0],
        "again",
        &[],
    );
    assert_eq!((rules.len(), rules[0].count), (1, 2));
    // Compile rules hold for every shape of the rule; other CUTLASS versions are not covered.
    let other_shape = Scope {
        shape: Some("8x8x8".into()),
        ..scope()
    };
    assert!(rejecting(&rules, &other_shape, &ks[0]).is_some());
    let other_cutlass = Scope {
        cutlass: "4.3.0".into(),
        ..scope()
    };
    assert!(rejecting(&rules, &other_cutlass, &ks[0]).is_none());
}

#[test]
fn rules_generalise_to_shared_parameters_but_never_over_a_success() {
    let ks = crate::kinds::gemm::space::Knowledge::shipped().kernels(
        &problem(),
        MathType::Tf32,
        Arch::Sm90,
    );
    let pp_tile = |t: [u32; 2]| -> Vec<&KernelSpec> {
        ks.iter()
            .filter(|k| {
                k.schedule == KernelSchedule::WsPingpong
                    && k.family == Family::Sm90Gemm
                    && k.tile[..2] == t
            })
            .collect()
    };
    let p128 = pp_tile([128, 128]);
    let other_tile = pp_tile([64, 128]);
    let find = |c: [u32; 3], e: crate::kinds::gemm::space::EpilogueKind| {
        *p128
            .iter()
            .find(|k| k.cluster == c && k.epilogue == e)
            .unwrap()
    };
    use crate::kinds::gemm::space::EpilogueKind::{NoSmem, Tma};
    // a and b differ in cluster and epilogue; the other two 128x128 ping-pong kernels share
    // tile and schedule with both.
    let (a, b) = (find([1, 2, 1], Tma), find([2, 1, 1], NoSmem));
    let pp = [
        a,
        find([1, 2, 1], NoSmem),
        find([2, 1, 1], Tma),
        b,
        other_tile[0],
    ];
    let mut rules = vec![];
    learn(
        &mut rules,
        &scope(),
        FailureKind::Launch,
        a,
        "illegal instruction",
        &[],
    );
    learn(
        &mut rules,
        &scope(),
        FailureKind::Launch,
        b,
        "illegal instruction",
        &[],
    );
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].count, 2);
    assert_eq!(
        rules[0].predicate.get("schedule"),
        Some(&Value::String("ws_pp".into()))
    );
    assert!(
        !rules[0].predicate.contains_key("cluster") && !rules[0].predicate.contains_key("epilogue")
    );
    // The generalisation rejects the untried kernels sharing what the failures shared...
    assert!(
        rejecting(&rules, &scope(), pp[1]).is_some()
            && rejecting(&rules, &scope(), pp[2]).is_some()
    );
    // ...but not another tile, nor a cooperative kernel.
    assert!(pp[4].tile != a.tile && rejecting(&rules, &scope(), pp[4]).is_none());
    let pp: Vec<&KernelSpec> = p128.clone();
    let coop = ks
        .iter()
        .find(|k| k.schedule == KernelSchedule::WsCooperative)
        .unwrap();
    assert!(rejecting(&rules, &scope(), coop).is_none());

    // With a known-good ping-pong kernel, the same two failures stay two exact rules.
    let mut rules = vec![];
    let good = [pp[2].clone()];
    learn(&mut rules, &scope(), FailureKind::Launch, pp[0], "x", &good);
    learn(&mut rules, &scope(), FailureKind::Launch, pp[1], "x", &good);
    assert!(rejecting(&rules, &scope(), pp[2]).is_none());
    assert!(
        rejecting(&rules, &scope(), pp[0]).is_some()
            && rejecting(&rules, &scope(), pp[1]).is_some()
    );
}

#[test]
fn numeric_rules_stay_with_their_shape_and_knobs() {
    let ks = space();
    let sk = ks
        .iter()
        .find(|k| k.scheduler == TileScheduler::StreamK)
        .unwrap();
    let mut rules = vec![];
    learn(
        &mut rules,
        &scope(),
        FailureKind::Numeric,
        sk,
        "1.3e-3 > 1e-3",
        &[],
    );
    assert!(rejecting(&rules, &scope(), sk).is_some());
    assert!(rejecting(
        &rules,
        &Scope {
            shape: Some("256x256x8".into()),
            ..scope()
        },
        sk
    )
    .is_none());
    let split = sk.with_knobs(crate::kinds::gemm::space::Knobs {
        splits: 4,
        ..sk.knobs
    });
    assert!(
        rejecting(&rules, &scope(), &split).is_none(),
        "other knobs are another variant"
    );
}

/// A quick sweep's nearby winner outside the first round (`Kind::admits`): a 128x192 tile, which
/// only the sibling round derives, runs vit_b_16's out-projection; a kernel that fits another
/// problem, one of another arch, one that failed before and one a learned rule rejects do not.
#[test]
fn a_nearby_winner_outside_the_first_round_is_admitted_by_the_first_rounds_checks() {
    use crate::agent::Steward;
    use crate::kinds::{Kind, Spec, SweepCx};
    use std::collections::BTreeSet;
    let p = GemmProblem {
        m: 6304,
        n: 768,
        k: 768,
        layout: GemmLayout::Rcr,
        dtype: DType::Bf16,
        bias: true,
        batch: 1,
        epilogue: None,
        padded_from: None,
    };
    let first = gemm_candidates(&p, MathType::Bf16, Arch::Sm90);
    assert!(
        first.iter().all(|k| k.tile[1] != 192),
        "the first round holds no 128x192 tile"
    );
    let wide = first
        .iter()
        .flat_map(|k| k.tile_siblings(&p))
        .next()
        .expect("a 128x192 sibling of a first-round kernel");
    let scope = crate::kinds::gemm::scope(&p, MathType::Bf16, Arch::Sm90, "4.2.0.0");
    let space = crate::space::SpaceOptions::default();
    let mut steward = Steward::builtin();
    let admits =
        |k: &KernelSpec, rules: &[Rule], failed: &BTreeSet<String>, steward: &mut Steward| {
            let cx = SweepCx {
                arch: Arch::Sm90,
                math: MathType::Bf16,
                cutlass: "4.2.0.0",
                rules,
                scope: &scope,
                failed,
                space: &space,
                max_candidates: None,
                refine: 0,
                steward,
            };
            Kind::admits(
                &crate::kinds::gemm::Gemm,
                &p.clone().into(),
                &Spec::from(k.clone()),
                &cx,
            )
        };
    let none = BTreeSet::new();
    assert!(admits(&wide, &[], &none, &mut steward));
    let unbiased = KernelSpec {
        bias: false,
        ..wide.clone()
    };
    assert!(
        !admits(&unbiased, &[], &none, &mut steward),
        "no bias: another problem's kernel"
    );
    let sm80 = KernelSpec {
        arch: Arch::Sm80,
        ..wide.clone()
    };
    assert!(!admits(&sm80, &[], &none, &mut steward));
    let failed: BTreeSet<String> = [wide.kernel_name()].into();
    assert!(!admits(&wide, &[], &failed, &mut steward));
    let mut rules = vec![];
    learn(
        &mut rules,
        &scope,
        FailureKind::Compile,
        &wide,
        "error: static_assert failed",
        &[],
    );
    assert!(rejecting(&rules, &scope, &wide).is_some());
    assert!(
        !admits(&wide, &rules, &none, &mut steward),
        "a learned rule keeps it out"
    );
}

#[test]
fn a_gemms_rows_are_its_m_and_a_batched_gemm_has_none() {
    use crate::kinds::{gemm::Gemm, Kind, Problem};
    let p: Problem = problem().into();
    assert_eq!(Gemm.rows(&p), Some(4096));
    let small = Gemm.at_rows(&p, 128).expect("a GEMM of one batch has rows");
    assert_eq!(
        small,
        GemmProblem {
            m: 128,
            ..problem()
        }
        .into()
    );
    let batched: Problem = GemmProblem {
        batch: 12,
        ..problem()
    }
    .into();
    assert_eq!(
        (Gemm.rows(&batched), Gemm.at_rows(&batched, 128)),
        (None, None)
    );
}
