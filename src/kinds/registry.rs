//! The registry: every pattern kind, one line each, and what needs all of them at once. It is the
//! only place that names every kind; the stages reach the kinds through it (the rules of the
//! cover, the op library's sections, a rule id `fact realize` names) or through a value's own
//! kind (`Problem::kind`, `Spec::kind`, `Found::kind`).
//!
//! The order is the kinds' order everywhere: their rules in the cover (which breaks only exact
//! ties, equal gain and same first node), their patterns in the plan and the report, their
//! sections in the op library and the bits of their pattern kinds there, and the order in which
//! an untagged problem or spec is tried against them when read back. A kind's values never parse
//! as another's (their fields differ), so that order decides nothing there.

use super::TypedKind;
use super::{
    attention, conv, gemm, glu, grn, layernorm, match_kinds, patch, render_op_library, rmsnorm,
    rotary, siblings, Kind, Patterns, Problem, Spec,
};
use crate::codegen::{self, Source};
use crate::graph::{Graph, NodeId};
use crate::rules::{PatternKind, Rule};
use crate::types::{Arch, DType};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeSet;

/// Every kind.
pub static KINDS: &[&dyn Kind] = &[
    &gemm::Gemm,
    &attention::Attention,
    &layernorm::LayerNorm,
    &rmsnorm::RmsNorm,
    &rotary::Rotary,
    &glu::Glu,
    // Before the convolutions: a patch embedding's site is its convolution's, and the cover
    // breaks that tie by this order (patch/rule.rs).
    &patch::Patch,
    &conv::Conv,
    &grn::Grn,
    &siblings::Siblings,
];

/// Which kinds' rules take part in the cover: a kind that stays off until a GPU has measured it
/// is asked for here, and one that is on can be turned off (compose's and discover's
/// `--fuse-siblings` and `--no-patch-conv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatchOptions {
    /// Sibling linears (q, k, v over one x) as one GEMM (`kinds::siblings`); unmeasured, off.
    pub fuse_siblings: bool,
    /// Patch embeddings (a convolution whose filter is its stride) as one GEMM
    /// (`kinds::patch`); on.
    pub patch_conv: bool,
}

impl Default for MatchOptions {
    /// What compose and discover match unless told otherwise.
    fn default() -> MatchOptions {
        MatchOptions {
            fuse_siblings: false,
            patch_conv: true,
        }
    }
}

impl MatchOptions {
    /// Whether kind `k`'s rules take part.
    pub fn enables(&self, k: &dyn Kind) -> bool {
        if k.name() == TypedKind::name(&siblings::Siblings) {
            self.fuse_siblings
        } else if k.name() == TypedKind::name(&patch::Patch) {
            self.patch_conv
        } else {
            true
        }
    }
}

/// Every kind's rules, kind by kind.
pub fn rules() -> Vec<&'static dyn Rule> {
    KINDS
        .iter()
        .flat_map(|k| k.rules().iter().copied())
        .collect()
}

/// The rules of the kinds `opts` enables, kind by kind.
pub fn enabled_rules(opts: &MatchOptions) -> Vec<&'static dyn Rule> {
    KINDS
        .iter()
        .filter(|k| opts.enables(**k))
        .flat_map(|k| k.rules().iter().copied())
        .collect()
}

/// What users call every kind's patterns, kind by kind: the op library's switches in the order
/// of their bits, and the order bench turns them off in.
pub fn pattern_kinds() -> Vec<PatternKind> {
    KINDS
        .iter()
        .flat_map(|k| k.pattern_kinds().iter().copied())
        .collect()
}

/// The kind whose patterns `p` names.
pub fn kind_of(p: PatternKind) -> &'static dyn Kind {
    *KINDS
        .iter()
        .find(|k| k.pattern_kinds().contains(&p))
        .unwrap_or_else(|| panic!("no kind's patterns are called {p}"))
}

impl std::str::FromStr for PatternKind {
    type Err = String;
    fn from_str(s: &str) -> Result<PatternKind, String> {
        let all = pattern_kinds();
        all.iter().copied().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|k| k.name()).collect();
            format!(
                "unknown pattern kind '{s}': use one of {}",
                names.join(", ")
            )
        })
    }
}

impl<'de> Deserialize<'de> for PatternKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PatternKind, D::Error> {
        String::deserialize(d)?.parse().map_err(D::Error::custom)
    }
}

/// The registry's cover of the graph: every kind's patterns, no node in two (`rules::cover`):
/// attention patterns (their two products are not GEMM patterns of their own), LayerNorms, and
/// every other GEMM with the longest epilogue the graph allows, or alone where another pattern
/// took a node of its epilogue.
pub fn match_patterns(g: &Graph) -> Patterns {
    match_patterns_with(g, &MatchOptions::default())
}

/// The same with the kinds `opts` enables.
pub fn match_patterns_with(g: &Graph, opts: &MatchOptions) -> Patterns {
    let kinds: Vec<&'static dyn Kind> =
        KINDS.iter().copied().filter(|k| opts.enables(*k)).collect();
    match_kinds(g, &kinds)
}

/// The problem a rule id names at a shape (`fact realize`): its kind's parser says what is wrong
/// with the shape; an id no kind knows is refused with every kind's ids.
pub fn problem_from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<Problem, String> {
    KINDS
        .iter()
        .find_map(|k| k.problem_from_rule(rule, dims, dtype))
        .unwrap_or_else(|| {
            let ids: Vec<&str> = KINDS.iter().map(|k| k.rule_ids()).collect();
            Err(format!("unknown rule '{rule}': use {}", ids.join("; ")))
        })
}

/// The nodes of every kind's ops its rules left alone, with the reasons (`Kind::unmatched`), in
/// graph order.
pub fn unmatched(g: &Graph, matched: &BTreeSet<NodeId>) -> Vec<(NodeId, String)> {
    let mut out: Vec<(NodeId, String)> =
        KINDS.iter().flat_map(|k| k.unmatched(g, matched)).collect();
    out.sort_by_key(|u| u.0);
    out
}

/// Every kind's op schemas and the frame's: what a rewrite defines before it saves the graph.
pub fn op_schemas() -> Vec<&'static str> {
    KINDS
        .iter()
        .flat_map(|k| k.ops().iter().map(|o| o.schema))
        .chain(codegen::FRAME_OPS.iter().map(|o| o.schema))
        .collect()
}

/// The torch op library for `arch`: every kind's section in the frame.
pub fn render_torch_op(arch: Arch) -> Source {
    render_op_library(KINDS, arch)
}

/// Kinds read back after the registry's in this crate's tests: the fake kind, whose problems the
/// realization tests record in a user table on disk (`kinds::fake`). Never in a build of fact.
#[cfg(test)]
const READ_BACK_IN_TESTS: &[&dyn Kind] = &[&super::fake::Fake];
#[cfg(not(test))]
const READ_BACK_IN_TESTS: &[&dyn Kind] = &[];

/// Reads a value back as the first kind's that it parses as (as an untagged enum would), or
/// says it is none of theirs the way serde says it of an untagged enum.
fn untagged<T, E: serde::de::Error>(
    v: serde_json::Value,
    what: &str,
    parse: impl Fn(&dyn Kind, serde_json::Value) -> Result<T, serde_json::Error>,
) -> Result<T, E> {
    KINDS
        .iter()
        .chain(READ_BACK_IN_TESTS)
        .find_map(|k| parse(*k, v.clone()).ok())
        .ok_or_else(|| {
            E::custom(format!(
                "data did not match any variant of untagged enum {what}"
            ))
        })
}

impl<'de> Deserialize<'de> for Problem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Problem, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        untagged(v, "Problem", |k, v| k.problem_from_json(v))
    }
}

impl<'de> Deserialize<'de> for Spec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Spec, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        untagged(v, "Spec", |k, v| k.spec_from_json(v))
    }
}

#[cfg(test)]
mod tests;
