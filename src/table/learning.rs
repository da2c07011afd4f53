//! Failure learning: a sweep's outcomes, as the table stores them, turned into the validity rules
//! of `space::validity` (which knows kernels and predicates, not runs). The rules live in the user
//! table beside the runs they were learned from.

use super::{Entry, Run, TableKey};
use crate::space::validity::{learn, FailureKind, Params, Rule, Scope};
use crate::tune::Outcome;

/// The kind of failure an outcome is, if it is one.
pub fn failure_kind(o: &Outcome) -> Option<FailureKind> {
    match o {
        Outcome::Ok { .. } => None,
        Outcome::CompileFailed { .. } => Some(FailureKind::Compile),
        Outcome::CannotImplement => Some(FailureKind::CannotImplement),
        Outcome::LaunchFailed { .. } => Some(FailureKind::Launch),
        Outcome::Fault { .. } => Some(FailureKind::Fault),
        Outcome::Numeric { .. } => Some(FailureKind::Numeric),
    }
}

/// Whether `o` shows the kernel got past the stage `kind` fails at.
fn passed(kind: FailureKind, o: &Outcome) -> bool {
    match kind {
        FailureKind::Compile => !matches!(o, Outcome::CompileFailed { .. }),
        _ => matches!(o, Outcome::Ok { .. }),
    }
}

fn message(o: &Outcome) -> String {
    match o {
        Outcome::CompileFailed { log } => log.clone(),
        Outcome::CannotImplement => "CUTLASS can_implement refused the problem".into(),
        Outcome::LaunchFailed { error } | Outcome::Fault { error } => error.clone(),
        Outcome::Numeric {
            max_rel_err,
            tolerance,
        } => format!("max relative error {max_rel_err:.3e} over tolerance {tolerance:.0e}"),
        Outcome::Ok { .. } => String::new(),
    }
}

impl TableKey {
    /// The validity scope of a sweep on this key with CUTLASS `cutlass`.
    pub fn scope(&self, cutlass: &str) -> Scope {
        Scope {
            arch: self.arch.short_name().into(),
            dtype: self.dtypes.a.short_name().into(),
            math: self.math,
            rule: self.rule.clone(),
            cutlass: cutlass.into(),
            shape: Some(self.shape.clone()),
        }
    }
}

/// Learns every failure of `run` (a sweep on `key`). `history` is the table's entries, whose
/// runs say which kernels passed which stage. A rule names a kernel's features
/// (`kinds::Kind::features`): the failures of a kind that has none stay in their runs.
pub fn learn_run(rules: &mut Vec<Rule>, key: &TableKey, run: &Run, history: &[Entry]) -> usize {
    let sweep = key.scope(&run.provenance.cutlass);
    let mut learned = 0;
    for c in &run.candidates {
        let Some(kind) = failure_kind(&c.outcome) else {
            continue;
        };
        let Some(features) = c.spec.features(kind) else {
            continue;
        };
        let scope = sweep.for_kind(kind);
        let passed: Vec<Params> = history
            .iter()
            .flat_map(|e| e.runs.iter().map(move |r| (e, r)))
            .filter(|(e, r)| scope.covers(&e.key.scope(&r.provenance.cutlass)))
            .flat_map(|(_, r)| r.candidates.iter())
            .chain(run.candidates.iter())
            .filter(|c| passed(kind, &c.outcome))
            .filter_map(|c| c.spec.features(kind))
            .collect();
        learn(
            rules,
            &sweep,
            kind,
            &c.spec.name(),
            &features,
            &message(&c.outcome),
            &passed,
        );
        learned += 1;
    }
    learned
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::gemm::{GemmLayout, GemmProblem};
    use crate::types::{Arch, DType, MathType};

    #[test]
    fn a_key_scopes_like_its_problem() {
        let p = GemmProblem {
            m: 64,
            n: 128,
            k: 256,
            layout: GemmLayout::Rcr,
            dtype: DType::Bf16,
            bias: true,
            batch: 1,
            epilogue: None,
            padded_from: None,
        };
        let key = TableKey::of(&p.clone().into(), MathType::Bf16, Arch::Sm90);
        assert_eq!(
            key.scope("4.2.0.0"),
            crate::kinds::gemm::scope(&p, MathType::Bf16, Arch::Sm90, "4.2.0.0")
        );
        assert_eq!(
            failure_kind(&Outcome::CannotImplement),
            Some(FailureKind::CannotImplement)
        );
        assert!(
            passed(FailureKind::Compile, &Outcome::CannotImplement),
            "it compiled"
        );
        assert!(!passed(FailureKind::Launch, &Outcome::CannotImplement));
    }
}
