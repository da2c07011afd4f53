//! The cover: which of the rules' matches become patterns. Matches may share nodes, across rules
//! and within one: the explicit attention's two products are GEMMs, a GEMM with its epilogue
//! contains the GEMM alone, two epilogues can both reach the add that joins their GEMMs. The
//! cover takes matches greedily, largest gain first (ties: the match starting earlier in the
//! graph), and leaves every match that shares a node with one already taken, so no node is in
//! two patterns.
//!
//! A match's site is kind-independent: its nodes, the values it reads from outside and those it
//! hands back, and its gain, computed from the graph alone (`Site::of`). The gain compares, in
//! order:
//! 1. `products`: the graph's matrix products (GEMM nodes) the match replaces. A kernel holding
//!    two products (attention) runs an algorithm of its own that never writes the scores between
//!    them; fusing an elementwise op into one of them instead would give that up, so a match
//!    computing more products outranks one built around fewer, whatever their bytes.
//! 2. `bytes`: the eager traffic the match removes, Σ over its nodes of the tensor bytes each
//!    reads and writes, less its external inputs read once and its outputs written once: the
//!    intermediates it keeps on chip, each written once and read by each reader, and inputs read
//!    again (a transparent node, `views.rs`, moves none). A one-node match (a GEMM alone, a
//!    LayerNorm, SDPA) removes none; a GEMM whose epilogue keeps k output-sized values on chip
//!    removes about 2k outputs, so it beats its GEMM alone, and of two epilogues claiming one
//!    node the one fusing more keeps it.
//!
//! So an attention takes its products from the GEMM rules; a GEMM whose epilogue lost a node to
//! another pattern is still a pattern, the GEMM rule's match of it alone; and a rule of any kind
//! takes part by its site alone.

use super::{views, Match, PatternKind, Rule};
use crate::graph::{Graph, NodeId, TensorInfo, ValueId};
use std::cmp::Ordering;
use std::collections::BTreeSet;

/// What replacing a match is expected to save, ordered as the module doc says: products, then
/// bytes.
#[derive(Clone, Copy, Debug)]
pub struct Gain {
    /// The graph's matrix products (GEMM nodes) the match replaces.
    pub products: usize,
    /// Eager tensor traffic removed: what its nodes read and write, less one read of each
    /// external input and one write of each output.
    pub bytes: f64,
}

impl Ord for Gain {
    fn cmp(&self, o: &Gain) -> Ordering {
        self.products
            .cmp(&o.products)
            .then(self.bytes.total_cmp(&o.bytes))
    }
}
impl PartialOrd for Gain {
    fn partial_cmp(&self, o: &Gain) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl PartialEq for Gain {
    fn eq(&self, o: &Gain) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Gain {}

/// A match of any kind as a subgraph: the nodes it replaces with its external inputs and outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Site {
    /// The nodes the pattern replaces, in program order.
    pub nodes: Vec<NodeId>,
    /// Values its nodes read that none of them produces, constants aside, in first-read order.
    pub inputs: Vec<ValueId>,
    /// Values its nodes produce that the rest of the graph reads or returns, in program order.
    pub outputs: Vec<ValueId>,
    pub gain: Gain,
}

impl Site {
    /// The site of `nodes` in `g`.
    pub fn of(g: &Graph, nodes: &[NodeId]) -> Site {
        let mut nodes = nodes.to_vec();
        nodes.sort();
        nodes.dedup();
        let inside: BTreeSet<NodeId> = nodes.iter().copied().collect();
        let produced_inside =
            |v: ValueId| g.values[v].producer.is_some_and(|p| inside.contains(&p));
        // Constants are part of an op's definition, not data flowing into the pattern.
        let data = |v: &ValueId| g.constant(*v).is_none();
        let mut inputs: Vec<ValueId> = Vec::new();
        for &n in &nodes {
            for &v in g.nodes[n].inputs.iter().filter(|v| data(v)) {
                if !produced_inside(v) && !inputs.contains(&v) {
                    inputs.push(v);
                }
            }
        }
        let returned: BTreeSet<ValueId> = g.outputs.iter().copied().collect();
        let read_outside: BTreeSet<ValueId> = g
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| !inside.contains(i))
            .flat_map(|(_, n)| n.inputs.iter().copied())
            .collect();
        let outputs: Vec<ValueId> = nodes
            .iter()
            .flat_map(|&n| g.nodes[n].outputs.iter().copied())
            .filter(|v| returned.contains(v) || read_outside.contains(v))
            .collect();
        let bytes = |v: &ValueId| g.tensor(*v).map_or(0.0, TensorInfo::bytes);
        // A transparent node (a view, eval dropout) moves no bytes.
        let traffic: f64 = nodes
            .iter()
            .filter(|&&n| views::pass(g, n).is_none())
            .flat_map(|&n| g.nodes[n].inputs.iter().chain(&g.nodes[n].outputs))
            .filter(|v| data(v))
            .map(bytes)
            .sum();
        let boundary: f64 = inputs.iter().chain(&outputs).map(bytes).sum();
        let products = nodes
            .iter()
            .filter(|&&n| is_product(&g.nodes[n].kind))
            .count();
        Site {
            nodes,
            inputs,
            outputs,
            gain: Gain {
                products,
                bytes: traffic - boundary,
            },
        }
    }
}

/// Whether a node of this kind computes a matrix product: the GEMM ops a model calls (the GEMM
/// rules match them; an attention computes two).
pub fn is_product(kind: &str) -> bool {
    matches!(
        kind,
        "aten::linear" | "aten::mm" | "aten::bmm" | "aten::matmul" | "aten::addmm"
    )
}

/// A rule's match with its site: what the cover takes or leaves.
#[derive(Debug)]
pub struct Candidate {
    /// The rule that found it (`Rule::name`).
    pub rule: &'static str,
    pub kind: PatternKind,
    pub site: Site,
    pub found: Box<dyn Match>,
}

/// Every match of every rule in `rules`, overlapping ones included.
pub fn candidates(g: &Graph, rules: &[&dyn Rule]) -> Vec<Candidate> {
    rules
        .iter()
        .flat_map(|r| {
            r.find(g).into_iter().map(|found| Candidate {
                rule: r.name(),
                kind: r.kind(),
                site: found.site(g),
                found,
            })
        })
        .collect()
}

/// The non-overlapping cover, largest gain first (see the module doc), in graph order (by each
/// match's first node).
pub fn cover(candidates: Vec<Candidate>) -> Vec<Candidate> {
    let first = |c: &Candidate| c.site.nodes.first().copied();
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| {
        let (ca, cb) = (&candidates[a], &candidates[b]);
        cb.site
            .gain
            .cmp(&ca.site.gain)
            .then(first(ca).cmp(&first(cb)))
            .then(a.cmp(&b))
    });
    let mut taken: BTreeSet<NodeId> = BTreeSet::new();
    let mut keep = vec![false; candidates.len()];
    for i in order {
        let nodes = &candidates[i].site.nodes;
        if nodes.iter().all(|n| !taken.contains(n)) {
            taken.extend(nodes.iter().copied());
            keep[i] = true;
        }
    }
    let mut chosen: Vec<Candidate> = candidates
        .into_iter()
        .zip(keep)
        .filter_map(|(c, k)| k.then_some(c))
        .collect();
    chosen.sort_by_key(first);
    chosen
}
