use super::*;

/// An agent that answers from a script of results (and crashes when asked after a failure).
pub(crate) struct Scripted {
    pub order: Result<Vec<String>, AgentError>,
    pub proposals: Vec<Vec<serde_json::Value>>,
    pub seen_rejections: Vec<usize>,
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
        _: &Value,
        _: &str,
        _: MathType,
        _: Arch,
        _: &[Value],
        rejected: &[Rejection],
    ) -> Result<Vec<serde_json::Value>, AgentError> {
        self.seen_rejections.push(rejected.len());
        Ok(self.proposals.remove(0))
    }
    fn after_failure(
        &mut self,
        _: &Value,
        _: &str,
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
    let nothing: Check<()> = &|_| Err("no kernel".into());
    assert_eq!(
        s.after_failure(&serde_json::json!({}), "gemm_rrr", &[], nothing),
        None
    );
    assert!(s
        .notes
        .last()
        .unwrap()
        .contains("built-in agent takes over"));
    assert_eq!(s.name(), "builtin");
}
