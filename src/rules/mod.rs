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

/// Every GEMM of the top-level block, each with the longest epilogue the graph allows.
pub fn match_patterns(g: &Graph) -> Vec<GemmMatch> {
    match_gemms(g)
        .into_iter()
        .map(|mut m| {
            if let Some(e) = match_epilogue(g, &m) {
                m.problem.epilogue = Some(e.epilogue.clone());
                m.epilogue = Some(e);
            }
            m
        })
        .collect()
}
