//! Pattern rules: pure matchers from the graph IR to the subgraphs fact can replace, and the
//! machinery every kind's rules share. No rule touches libtorch, the GPU or the disk. A rule is
//! one type implementing `Rule` in its kind's folder (`crate::kinds`), whose module doc states
//! its math; the kinds' registry lists every kind's rules.
//!
//! Rules read the graph through `views.rs`: the normalisation that makes shape-only nodes (views,
//! reshapes, eval dropout, `contiguous` of a packed tensor, same-dtype `to`) transparent, so a
//! match passes through them and owns those nothing else reads.
//!
//! Rules find matches that may overlap; `cover.rs` picks a non-overlapping set of them by gain.
//! `residual.rs` finds the residual add before a norm, which the norm kinds' rules offer with
//! their norms; `written.rs` reads the ops a norm is written out in, for every norm kind.

pub mod cover;
pub mod residual;
pub mod views;
pub mod written;

pub use cover::{candidates, cover, is_product, Candidate, Gain, Site};

use crate::graph::{Graph, NodeId};
use serde::{Serialize, Serializer};
use std::any::Any;
use std::fmt::Debug;

/// A pattern rule: what one rule of a kind matches.
pub trait Rule: Sync {
    /// The rule's name, carried by its candidates.
    fn name(&self) -> &'static str;
    /// What users call its patterns.
    fn kind(&self) -> PatternKind;
    /// Every match in the graph's top-level block, overlapping ones included: the cover picks.
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>>;
}

/// A match of any rule, as the cover sees it: the connected set of nodes it replaces. Its site
/// (external inputs and outputs, gain) follows from those and the graph, the same for every kind.
pub trait Match: Any + Debug {
    fn nodes(&self) -> Vec<NodeId>;
    fn site(&self, g: &Graph) -> Site {
        Site::of(g, &self.nodes())
    }
}

/// Matches as the cover takes them.
pub fn boxed<M: Match>(found: Vec<M>) -> Vec<Box<dyn Match>> {
    found
        .into_iter()
        .map(|m| Box::new(m) as Box<dyn Match>)
        .collect()
}

/// What a pattern is, as users name it: the composed op library turns kinds off by these names
/// (`FACT_DISABLE=attention`, `fact bench --without epilogue`). Each kind declares its own
/// (`kinds::Kind::pattern_kinds`); the registry reads one back from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PatternKind(&'static str);

impl PatternKind {
    pub const fn new(name: &'static str) -> PatternKind {
        PatternKind(name)
    }
    pub fn name(self) -> &'static str {
        self.0
    }
}

impl std::fmt::Display for PatternKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for PatternKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}
