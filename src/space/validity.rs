//! Failure memory (the rules; src/table/learning.rs turns a sweep's outcomes into them): every failure a sweep meets (nvcc/static_assert, can_implement, launch,
//! fault, numeric) becomes a validity rule — a scope (arch, dtype, math, rule, CUTLASS version,
//! and the shape for failures that depend on it), a predicate over the kernel's parameters, a
//! count and an example message. Rules prune later sweeps before nvcc. A kernel's parameters are
//! what its kind says a rule may name (`kinds::Kind::features`); a kind that names none learns
//! nothing.
//!
//! A rule starts as the failing kernel's full parameter set. When another kernel fails the same
//! way in the same scope, the rule generalises to the parameters both share, but only if no
//! kernel known to have passed that stage in the scope matches the generalisation: rules never
//! contradict evidence, so a learned rule cannot prune a kernel that is known to work.

use crate::types::{Arch, DType, MathType};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    Compile,
    CannotImplement,
    Launch,
    Fault,
    Numeric,
}

impl FailureKind {
    /// Compile failures depend on the kernel alone; the others on the problem too.
    fn shape_bound(self) -> bool {
        self != FailureKind::Compile
    }
    pub fn label(self) -> &'static str {
        match self {
            FailureKind::Compile => "compile",
            FailureKind::CannotImplement => "cannot_implement",
            FailureKind::Launch => "launch",
            FailureKind::Fault => "fault",
            FailureKind::Numeric => "numeric",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct Scope {
    pub arch: String,
    pub dtype: String,
    pub math: MathType,
    pub rule: String,
    pub cutlass: String,
    /// Set for failures that depend on the problem (everything but compile failures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<String>,
}

impl Scope {
    /// The scope of a sweep over the problem of `rule` and `shape` (the table key's fields: the
    /// table derives the same from a key).
    pub fn of(
        rule: &str,
        dtype: DType,
        shape: &str,
        math: MathType,
        arch: Arch,
        cutlass: &str,
    ) -> Scope {
        Scope {
            arch: arch.short_name().into(),
            dtype: dtype.short_name().into(),
            math,
            rule: rule.into(),
            cutlass: cutlass.into(),
            shape: Some(shape.into()),
        }
    }
    /// The scope a rule of `kind` learned in this sweep holds for.
    pub fn for_kind(&self, kind: FailureKind) -> Scope {
        Scope {
            shape: if kind.shape_bound() {
                self.shape.clone()
            } else {
                None
            },
            ..self.clone()
        }
    }
    /// Whether a rule scoped `self` applies to a sweep in `sweep`.
    pub fn covers(&self, sweep: &Scope) -> bool {
        self.arch == sweep.arch
            && self.dtype == sweep.dtype
            && self.math == sweep.math
            && self.rule == sweep.rule
            && self.cutlass == sweep.cutlass
            && (self.shape.is_none() || self.shape == sweep.shape)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    pub scope: Scope,
    pub kind: FailureKind,
    /// Parameter → value; a kernel matches when it has every one.
    pub predicate: BTreeMap<String, Value>,
    pub count: u32,
    pub example: String,
    /// Some of the kernels that failed this way (at most eight).
    pub kernels: Vec<String>,
}

impl Rule {
    pub fn matches(&self, params: &BTreeMap<String, Value>) -> bool {
        self.predicate.iter().all(|(k, v)| params.get(k) == Some(v))
    }
    pub fn predicate_text(&self) -> String {
        self.predicate
            .iter()
            .map(|(k, v)| {
                format!(
                    "{k}={}",
                    v.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string())
                )
            })
            .collect::<Vec<_>>()
            .join(" ∧ ")
    }
    pub fn describe(&self) -> String {
        format!(
            "learned {} rule ({} failures): {} — e.g. {}",
            self.kind.label(),
            self.count,
            self.predicate_text(),
            first_line(&self.example)
        )
    }
}

fn first_line(s: &str) -> String {
    let l = s
        .lines()
        .find(|l| l.contains("error"))
        .or_else(|| s.lines().next())
        .unwrap_or("")
        .trim();
    l.chars().take(160).collect()
}

/// A kernel's parameters for a failure of a kind: what a rule's predicate may name.
pub type Params = BTreeMap<String, Value>;

/// Records one failure of kernel `name`, whose parameters are `p`. `passed` are the parameters of
/// kernels known to have passed this kind's stage in scope.
pub fn learn(
    rules: &mut Vec<Rule>,
    scope: &Scope,
    kind: FailureKind,
    name: &str,
    p: &Params,
    msg: &str,
    passed: &[Params],
) {
    let scope = scope.for_kind(kind);
    let name = name.to_string();
    let note = |r: &mut Rule| {
        r.count += 1;
        if r.kernels.len() < 8 && !r.kernels.contains(&name) {
            r.kernels.push(name.clone());
        }
    };
    let same = |r: &Rule| r.scope == scope && r.kind == kind;
    if let Some(r) = rules.iter_mut().find(|r| same(r) && r.matches(p)) {
        note(r);
        return;
    }
    for r in rules.iter_mut().filter(|r| same(r)) {
        let general: BTreeMap<String, Value> = r
            .predicate
            .iter()
            .filter(|(key, v)| p.get(*key) == Some(v))
            .map(|(a, b)| (a.clone(), b.clone()))
            .collect();
        if general.is_empty() {
            continue;
        }
        let candidate = Rule {
            predicate: general,
            ..r.clone()
        };
        if passed.iter().any(|q| candidate.matches(q)) {
            continue;
        }
        *r = candidate;
        note(r);
        return;
    }
    rules.push(Rule {
        scope,
        kind,
        predicate: p.clone(),
        count: 1,
        example: msg.chars().take(2000).collect(),
        kernels: vec![name],
    });
}

/// The first rule that rejects a kernel in a sweep scoped `sweep`: `params` gives the kernel's
/// parameters for a failure of each kind.
pub fn rejecting<'a>(
    rules: &'a [Rule],
    sweep: &Scope,
    params: impl Fn(FailureKind) -> Params,
) -> Option<&'a Rule> {
    rules
        .iter()
        .find(|r| r.scope.covers(sweep) && r.matches(&params(r.kind)))
}
