//! The pluggable agent, consulted at four points: ranking the patterns of a plan, choosing their
//! supporting CUTLASS examples, proposing the candidate kernels for a pattern, and deciding what
//! to do when no candidate survives. `Steward` validates every answer (against the examples index,
//! and, through the check the pattern's kind passes it, the kernel validity rules and the failures
//! the pattern table remembers) before anything is compiled; an invalid proposal goes back to the
//! agent with its reasons, and an agent that times out, answers nonsense or crashes is replaced by
//! the built-in one for the rest of the run. Problems and kernels pass through here as their
//! JSON: the agent speaks the protocol, the kind knows its kernels.

pub mod external;

use crate::space::examples::Example;
use crate::types::{Arch, MathType};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeSet;
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum AgentError {
    #[error("the agent did not answer within {0:?}")]
    Timeout(std::time::Duration),
    #[error("the agent's reply is malformed: {0}")]
    Malformed(String),
    #[error("the agent exited: {0}")]
    Crashed(String),
    #[error("cannot start the agent: {0}")]
    Start(String),
}

/// What the agent sees of a pattern when ranking.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RankItem {
    pub id: String,
    pub rule: String,
    pub shape: String,
    pub est_ms: f64,
    pub share: f64,
    pub expected_gain_ms: f64,
}

/// A proposal fact refused, sent back to the agent.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Rejection {
    pub candidate: serde_json::Value,
    pub reason: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum FailureAction {
    Retry { candidates: Vec<serde_json::Value> },
    Skip,
}

/// `Send`: compose's realizations run on several threads and share the agent behind a lock.
pub trait Agent: Send {
    fn name(&self) -> String;
    /// Pattern ids, highest priority first.
    fn rank(&mut self, items: &[RankItem]) -> Result<Vec<String>, AgentError>;
    /// Example paths (from `offered`) that support pattern `id`.
    fn examples(
        &mut self,
        id: &str,
        rule: &str,
        arch: Arch,
        offered: &[Example],
    ) -> Result<Vec<String>, AgentError>;
    /// Candidate kernels for a problem (of rule `rule`); `space` is the valid space fact derived,
    /// `rejected` what fact refused of this agent's last proposal for it.
    fn propose(
        &mut self,
        problem: &Value,
        rule: &str,
        math: MathType,
        arch: Arch,
        space: &[Value],
        rejected: &[Rejection],
    ) -> Result<Vec<Value>, AgentError>;
    /// No candidate survived: `failures` is (kernel, outcome label) for each.
    fn after_failure(
        &mut self,
        problem: &Value,
        rule: &str,
        failures: &[(String, String)],
    ) -> Result<FailureAction, AgentError>;
}

/// The deterministic agent: the cost model's order, every indexed example, the derived space in
/// its analytic order, and no retry after a failure.
#[derive(Default)]
pub struct BuiltinAgent;

impl Agent for BuiltinAgent {
    fn name(&self) -> String {
        "builtin".into()
    }
    fn rank(&mut self, items: &[RankItem]) -> Result<Vec<String>, AgentError> {
        let mut v: Vec<&RankItem> = items.iter().collect();
        v.sort_by(|a, b| {
            b.est_ms
                .partial_cmp(&a.est_ms)
                .unwrap()
                .then(a.id.cmp(&b.id))
        });
        Ok(v.into_iter().map(|i| i.id.clone()).collect())
    }
    fn examples(
        &mut self,
        _: &str,
        _: &str,
        _: Arch,
        offered: &[Example],
    ) -> Result<Vec<String>, AgentError> {
        Ok(offered.iter().map(|e| e.path.clone()).collect())
    }
    fn propose(
        &mut self,
        _: &Value,
        _: &str,
        _: MathType,
        _: Arch,
        space: &[Value],
        _: &[Rejection],
    ) -> Result<Vec<Value>, AgentError> {
        Ok(space.to_vec())
    }
    fn after_failure(
        &mut self,
        _: &Value,
        _: &str,
        _: &[(String, String)],
    ) -> Result<FailureAction, AgentError> {
        Ok(FailureAction::Skip)
    }
}

/// A proposed kernel as the pattern's kind reads it: the spec, or why it is refused.
pub type Check<'a, T> = &'a dyn Fn(&Value) -> Result<T, String>;

/// The agent in charge plus the built-in one it falls back to; records what happened.
pub struct Steward {
    agent: Option<Box<dyn Agent>>,
    builtin: BuiltinAgent,
    pub notes: Vec<String>,
}

impl Steward {
    pub fn builtin() -> Steward {
        Steward {
            agent: None,
            builtin: BuiltinAgent,
            notes: Vec::new(),
        }
    }

    pub fn with(agent: Box<dyn Agent>) -> Steward {
        Steward {
            agent: Some(agent),
            builtin: BuiltinAgent,
            notes: Vec::new(),
        }
    }

    pub fn name(&self) -> String {
        match &self.agent {
            Some(a) => a.name(),
            None => "builtin".into(),
        }
    }

    /// Whether the built-in agent decides (none was given, or the given one was let go).
    pub fn is_builtin(&self) -> bool {
        self.agent.is_none()
    }

    fn give_up(&mut self, step: &str, e: AgentError) {
        let name = self.name();
        self.notes.push(format!(
            "{name}: {e} while {step}; the built-in agent takes over"
        ));
        self.agent = None;
    }

    pub fn rank(&mut self, items: &[RankItem]) -> Vec<String> {
        if let Some(a) = self.agent.as_mut() {
            match a.rank(items) {
                Ok(order) => {
                    let want: BTreeSet<&str> = items.iter().map(|i| i.id.as_str()).collect();
                    let got: BTreeSet<&str> = order.iter().map(String::as_str).collect();
                    if order.len() == items.len() && want == got {
                        return order;
                    }
                    self.notes.push(format!("{}: ranking rejected (not a permutation of the pattern ids); built-in order used", a.name()));
                }
                Err(e) => self.give_up("ranking", e),
            }
        }
        self.builtin.rank(items).expect("builtin ranks")
    }

    pub fn examples(
        &mut self,
        id: &str,
        rule: &str,
        arch: Arch,
        offered: &[Example],
    ) -> Vec<String> {
        if let Some(a) = self.agent.as_mut() {
            match a.examples(id, rule, arch, offered) {
                Ok(paths) => {
                    let known: BTreeSet<&str> = offered.iter().map(|e| e.path.as_str()).collect();
                    let unknown: Vec<&String> = paths
                        .iter()
                        .filter(|p| !known.contains(p.as_str()))
                        .collect();
                    if unknown.is_empty() && !paths.is_empty() {
                        return paths;
                    }
                    self.notes.push(format!("{}: examples for {id} rejected (not in the index for {rule}: {unknown:?}); all indexed ones used", a.name()));
                }
                Err(e) => self.give_up("choosing examples", e),
            }
        }
        self.builtin
            .examples(id, rule, arch, offered)
            .expect("builtin chooses")
    }

    /// Validated candidates (`check` is the kind's reading of a proposal) for the problem of rule
    /// `rule` and shape `shape` (its JSON `problem`): the agent gets one second try with the
    /// reasons for what was refused. `space` is the derived sweep (the kind's space, learned rules
    /// and estimate applied, kernels known to fail left out), and what the built-in agent takes.
    #[allow(clippy::too_many_arguments)]
    pub fn propose<T: Serialize + PartialEq>(
        &mut self,
        problem: &Value,
        rule: &str,
        shape: &str,
        math: MathType,
        arch: Arch,
        space: Vec<T>,
        check: Check<T>,
    ) -> Vec<T> {
        let offered: Vec<Value> = space
            .iter()
            .map(|k| serde_json::to_value(k).expect("spec serializes"))
            .collect();
        let mut rejected: Vec<Rejection> = Vec::new();
        for round in 0..2 {
            let Some(a) = self.agent.as_mut() else { break };
            let proposal = match a.propose(problem, rule, math, arch, &offered, &rejected) {
                Ok(v) => v,
                Err(e) => {
                    self.give_up("proposing candidates", e);
                    break;
                }
            };
            rejected.clear();
            let mut ok = Vec::new();
            for v in proposal {
                match check(&v) {
                    Ok(k) if !ok.contains(&k) => ok.push(k),
                    Ok(_) => {}
                    Err(reason) => rejected.push(Rejection {
                        candidate: v,
                        reason,
                    }),
                }
            }
            for r in &rejected {
                self.notes.push(format!(
                    "{}: rejected a candidate for {shape}: {}",
                    a.name(),
                    r.reason
                ));
            }
            if rejected.is_empty() && !ok.is_empty() {
                return ok;
            }
            if !ok.is_empty() && round == 1 {
                return ok;
            }
        }
        if self.agent.is_some() {
            self.notes.push(format!(
                "{}: no valid proposal for {shape} after its second try; the derived space is used",
                self.name(),
            ));
        }
        space
    }

    /// After a failed sweep of the problem of rule `rule` (its JSON `problem`): candidates for one
    /// retry, each read by the kind's `check`, or None to leave the pattern to torch.
    pub fn after_failure<T>(
        &mut self,
        problem: &Value,
        rule: &str,
        failures: &[(String, String)],
        check: Check<T>,
    ) -> Option<Vec<T>> {
        let a = self.agent.as_mut()?;
        match a.after_failure(problem, rule, failures) {
            Ok(FailureAction::Retry { candidates }) => {
                let ok: Vec<T> = candidates.iter().filter_map(|v| check(v).ok()).collect();
                (!ok.is_empty()).then_some(ok)
            }
            Ok(FailureAction::Skip) => None,
            Err(e) => {
                self.give_up("deciding after a failure", e);
                None
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
