//! Pattern rules: pure matchers from the graph IR to the subgraphs fact can replace. No rule
//! touches libtorch, the GPU or the disk. Each rule's module doc states its math.
//!
//! A pattern is a GEMM (`gemm.rs`) and, where the graph allows, the elementwise epilogue that
//! follows it (`epilogue.rs`): `match_patterns` returns both, the plain GEMM always available as
//! the fallback when the fused pattern cannot be realized.

pub mod epilogue;
pub mod gemm;

pub use epilogue::{match_epilogue, EpOp, Epilogue, EpilogueMatch, LeafKind};
pub use gemm::{match_gemms, GemmLayout, GemmMatch, GemmOrigin, GemmProblem};

use crate::graph::Graph;

/// Every GEMM of the top-level block, each with the longest epilogue the graph allows, as a
/// non-overlapping cover: two epilogues can claim one node (`linear(x) + linear(z)`: the add is
/// in both), and then the one that fuses more of the graph (the larger output times ops) keeps it
/// and the other GEMM stays plain.
pub fn match_patterns(g: &Graph) -> Vec<GemmMatch> {
    let mut matches: Vec<GemmMatch> = match_gemms(g)
        .into_iter()
        .map(|mut m| {
            if let Some(e) = match_epilogue(g, &m) {
                m.problem.epilogue = Some(e.epilogue.clone());
                m.epilogue = Some(e);
            }
            m
        })
        .collect();
    let gain = |m: &GemmMatch| m.epilogue.as_ref().map_or(0.0, |e| e.nodes.len() as f64 * (m.problem.batch * m.problem.m * m.problem.n) as f64);
    let mut order: Vec<usize> = (0..matches.len()).collect();
    order.sort_by(|&a, &b| gain(&matches[b]).total_cmp(&gain(&matches[a])).then(a.cmp(&b)));
    let mut claimed: std::collections::BTreeSet<usize> = matches.iter().map(|m| m.node).collect();
    for i in order {
        let Some(e) = &matches[i].epilogue else { continue };
        if e.nodes.iter().any(|n| claimed.contains(n)) {
            matches[i] = matches[i].plain();
        } else {
            claimed.extend(e.nodes.iter().copied());
        }
    }
    matches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_epilogues_claiming_one_node_leave_one_gemm_plain() {
        // The add joins two linears: each sees the other's output as a full-size leaf.
        let g = Graph::parse(
            "graph(%x: f32[8,16], %w: f32[32,16], %z: f32[8,16], %v: f32[32,16]):
               %none = prim::Constant[None]()
               %one = prim::Constant[1]()
               %a = aten::linear(%x, %w, %none) : f32[8,32]
               %b = aten::linear(%z, %v, %none) : f32[8,32]
               %r = aten::relu(%b) : f32[8,32]
               %y = aten::add(%a, %r, %one) : f32[8,32]
               return (%y)",
        )
        .unwrap();
        let m = match_patterns(&g);
        assert_eq!(m.len(), 2);
        // The second linear's pattern (relu, add) fuses more than the first's (add): it wins.
        assert!(m[0].epilogue.is_none() && m[0].problem.epilogue.is_none());
        assert_eq!(m[1].epilogue.as_ref().unwrap().epilogue.text(), "leaves=full;v1=relu(v0);v2=add(l0,v1)");
        let mut nodes: Vec<usize> = m.iter().flat_map(GemmMatch::nodes).collect();
        let n = nodes.len();
        nodes.sort();
        nodes.dedup();
        assert_eq!(nodes.len(), n, "no node in two patterns");
    }
}
