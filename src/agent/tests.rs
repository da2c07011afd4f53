use super::*;
use crate::rules::GemmLayout;
use crate::space::gemm_candidates;
use crate::types::DType;

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

/// An agent that answers from a script of results.
struct Scripted {
    order: Result<Vec<String>, AgentError>,
    proposals: Vec<Vec<serde_json::Value>>,
    seen_rejections: Vec<usize>,
}

impl Agent for Scripted {
    fn name(&self) -> String {
        "scripted".into()
    }
    fn rank(&mut self, _: &[RankItem]) -> Result<Vec<String>, AgentError> {
        self.order.clone()
    }
    fn examples(
        &mut self,
        _: &str,
        _: &str,
        _: Arch,
        _: &[Example],
    ) -> Result<Vec<String>, AgentError> {
        Ok(vec!["examples/nowhere.cu".into()])
    }
    fn propose(
        &mut self,
        _: &GemmProblem,
        _: MathType,
        _: Arch,
        _: &[KernelSpec],
        rejected: &[Rejection],
    ) -> Result<Vec<serde_json::Value>, AgentError> {
        self.seen_rejections.push(rejected.len());
        Ok(self.proposals.remove(0))
    }
    fn after_failure(
        &mut self,
        _: &GemmProblem,
        _: &[(String, String)],
    ) -> Result<FailureAction, AgentError> {
        Err(AgentError::Crashed("exit status: 1".into()))
    }
}

fn items() -> Vec<RankItem> {
    ["p0", "p1", "p2"]
        .iter()
        .enumerate()
        .map(|(i, id)| RankItem {
            id: id.to_string(),
            rule: "gemm_rrr".into(),
            shape: "8x8x8".into(),
            est_ms: i as f64,
            share: 0.0,
            expected_gain_ms: 0.0,
        })
        .collect()
}

#[test]
fn builtin_ranks_by_estimated_time() {
    assert_eq!(Steward::builtin().rank(&items()), vec!["p2", "p1", "p0"]);
}

#[test]
fn an_agent_order_is_used_only_when_it_is_a_permutation() {
    let good = Scripted {
        order: Ok(vec!["p0".into(), "p2".into(), "p1".into()]),
        proposals: vec![],
        seen_rejections: vec![],
    };
    let mut s = Steward::with(Box::new(good));
    assert_eq!(s.rank(&items()), vec!["p0", "p2", "p1"]);
    let bad = Scripted {
        order: Ok(vec!["p0".into(), "p0".into(), "p9".into()]),
        proposals: vec![],
        seen_rejections: vec![],
    };
    let mut s = Steward::with(Box::new(bad));
    assert_eq!(s.rank(&items()), vec!["p2", "p1", "p0"]);
    assert!(s.notes[0].contains("not a permutation"));
}

#[test]
fn invalid_proposals_go_back_with_reasons_then_valid_ones_are_kept() {
    let space = gemm_candidates(&problem(), MathType::Tf32, Arch::Sm90);
    let mut bad = space[0].clone();
    bad.tile = [64, 128, 32];
    bad.schedule = crate::space::KernelSchedule::WsCooperative;
    let agent = Scripted {
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
    let got = s.propose(
        &problem(),
        MathType::Tf32,
        Arch::Sm90,
        gemm_candidates(&problem(), MathType::Tf32, Arch::Sm90),
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
    let space = gemm_candidates(&problem(), MathType::Tf32, Arch::Sm90);
    let failed: BTreeSet<String> = [space[0].name()].into();
    let v = serde_json::to_value(&space[0]).unwrap();
    assert!(
        check_candidate(&v, &problem(), MathType::Tf32, Arch::Sm90, &failed)
            .unwrap_err()
            .contains("failed before")
    );
    assert!(!Steward::builtin()
        .propose(
            &problem(),
            MathType::Tf32,
            Arch::Sm90,
            space.clone(),
            &failed
        )
        .contains(&space[0]));
}

#[test]
fn a_crashing_agent_hands_over_to_the_builtin_and_examples_stay_in_the_index() {
    let agent = Scripted {
        order: Ok(vec![]),
        proposals: vec![],
        seen_rejections: vec![],
    };
    let mut s = Steward::with(Box::new(agent));
    let offered = vec![Example {
        path: "examples/48_hopper_warp_specialized_gemm/48_hopper_warp_specialized_gemm.cu".into(),
        notes: String::new(),
    }];
    assert_eq!(
        s.examples("p0", "gemm_rrr", Arch::Sm90, &offered),
        vec![offered[0].path.clone()]
    );
    assert!(s.notes[0].contains("not in the index"));
    assert_eq!(
        s.after_failure(
            &problem(),
            MathType::Tf32,
            Arch::Sm90,
            &[],
            &BTreeSet::new()
        ),
        None
    );
    assert!(s
        .notes
        .last()
        .unwrap()
        .contains("built-in agent takes over"));
    assert_eq!(s.name(), "builtin");
}
